"""The PRU demo pipeline end to end at a small size: ``train.py experiment=pru_lm/demo`` on the
embedded corpus, then ``eval.py +dynamic_eval=true`` on its best checkpoint with the default
dynamic-evaluation settings: the adapted test perplexity is below the static one."""

from __future__ import annotations

import pytest

from src.commands.eval import evaluate
from src.commands.train import train
from tests.conftest import compose_config


@pytest.mark.slow
def test_dynamic_evaluation_lowers_the_demo_test_perplexity(tmp_path) -> None:
    small = [
        "experiment=pru_lm/demo", f"data.root={tmp_path / 'pydoc_ptb'}", "model.embedding_dim=32",
        "model.hidden_size=64", "trainer.max_epochs=3", "callbacks.progress_bar=null",
        "data.val_fraction=0.05", "data.test_fraction=0.03",  # a shorter test stream: 2k words
    ]  # fmt: skip
    trained = train(compose_config("train", small, tmp_path / "train"))
    assert trained["metrics"]["test/ppl"] < 400  # learnt something (1,608 words)
    overrides = [
        f"ckpt_path={trained['best_checkpoint']}", "+dynamic_eval=true",
        "dynamic_eval_options.max_batches=10",  # gradient statistics over 10 segments of 100 rows
    ]  # fmt: skip
    metrics = evaluate(compose_config("eval", overrides, tmp_path / "eval"))["metrics"]
    assert metrics["test/ppl"] == pytest.approx(trained["metrics"]["test/ppl"], rel=1e-5)
    assert metrics["test/dynamic_ppl"] < 0.99 * metrics["test/ppl"]
