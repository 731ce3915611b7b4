"""Word-level Transformer-XL and Group-Transformer (adaptive input and softmax): the Table 6 sizes,
the loss against the full log-probabilities, the ordered word segments and a short real run."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from src.build import build_task
from src.datamodules.dictionary import EOS_ID
from src.models.group_transformer import GroupTransformer
from src.models.transformer_xl import TransformerXL
from src.ops.adaptive_io import AdaptiveInputSoftmax
from tests.conftest import compose_config


def parameters_of(experiment: str, tmp_path) -> int:
    cfg = compose_config("train", [f"experiment={experiment}"], tmp_path)
    with torch.device("meta"):  # counted without allocating the vocabulary's tables
        net = instantiate(cfg.model)
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize(
    ("experiment", "paper"),
    [("table6_g4", 23e6), ("table6_g2", 25e6), ("table6_txl_base", 151e6)],
)
def test_table6_rows_match_the_paper_parameters(experiment: str, paper: float, tmp_path) -> None:
    """Appendix D, Table 6 (WikiText-103): 4 groups 23 M, 2 groups 25 M,
    Transformer-XL Base 151 M."""
    count = parameters_of(f"group_transformer_lm/{experiment}", tmp_path)
    assert abs(count / paper - 1) <= 0.03, (
        f"{experiment}: {count:,} parameters against {paper:,.0f}"
    )


@pytest.mark.parametrize("family", ["gt", "xl"])
def test_adaptive_loss_is_the_log_probability_of_the_targets(family: str) -> None:
    torch.manual_seed(0)
    args = dict(
        n_layer=2,
        d_model=32,
        n_head=4,
        d_inner=64,
        mem_len=6,
        dropout=0.0,
        tie_weight=True,
        cutoffs=[8, 20],
        adaptive_factor=2.0,
    )
    net = (
        GroupTransformer(50, n_group=2, tgt_len=5, **args)
        if family == "gt"
        else TransformerXL(50, **args)
    ).eval()
    assert isinstance(net.embedding, AdaptiveInputSoftmax) and net.output is None
    tokens, targets = torch.randint(0, 50, (2, 5)), torch.randint(0, 50, (2, 5))
    tokens[0, 0], targets[1, 2] = 1, 2  # the pad id as an input is a zero vector, not an error
    memories = None
    for _ in range(2):  # the second segment reads the first one's memories
        log_probs, new = net(tokens, memories)  # (2, 5, 50)
        nll, new_too = net.loss(tokens, targets, memories)  # (2, 5)
        assert log_probs.shape == (2, 5, 50)
        torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 5), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            nll, -log_probs.gather(-1, targets[..., None])[..., 0], atol=1e-5, rtol=1e-5
        )
        assert all(torch.equal(a, b) for a, b in zip(new, new_too))
        memories = new
    with pytest.raises(ValueError, match="tie_weight"):
        GroupTransformer(
            50, 2, 32, 4, 64, 2, tgt_len=5, mem_len=6, tie_weight=False, cutoffs=[8, 20]
        )


def test_word_segments_continue_row_by_row_and_a_short_run_learns(tmp_path) -> None:
    """The pydoc words in ordered segments (row b of a batch continues row b of the one before), and
    60 updates of a tiny word-level Group-Transformer bring the test perplexity far below the
    vocabulary's uniform one."""
    overrides = [
        "experiment=group_transformer_lm/demo", f"data.root={tmp_path / 'data'}", "data.tgt_len=32",
        "data.eval_tgt_len=32", "data.batch_size=8", "data.eval_batch_size=16", "model.n_layer=1",
        "model.d_model=32", "model.d_inner=64", "model.mem_len=16", "trainer.max_steps=60",
        "trainer.val_check_interval=60", "logger=csv",
    ]  # fmt: skip
    cfg = compose_config("train", overrides, tmp_path / "run")
    datamodule, task = build_task(cfg)
    datamodule.prepare_data()
    datamodule.setup("fit")
    first, second = list(zip(range(2), datamodule.train_dataloader()))
    (x1, y1), (x2, _) = first[1], second[1]
    assert x1.shape == (8, 32) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert torch.equal(x2[:, 0], y1[:, -1])  # the next segment starts where the row left off
    assert int((datamodule.splits["train"] == EOS_ID).sum()) > 1000  # one </s> per line

    from src.commands.train import train

    summary = train(cfg)
    metrics = summary["metrics"]
    vocabulary = datamodule.vocab_size
    assert math.isfinite(metrics["test/ppl"]) and metrics["test/ppl"] < vocabulary / 5, metrics
    assert metrics["test/ppl"] == pytest.approx(math.exp(metrics["test/loss"]), rel=1e-5)
