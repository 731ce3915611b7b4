"""A run whose limits end it before its first validation says so: at the start, from Lightning's
schedule, and at the end, when no validation ran (``best_checkpoint`` is then null)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from src.callbacks.validation_schedule import first_validation_batch, training_batches
from src.commands.train import train


def schedule(**settings: object) -> SimpleNamespace:
    """The Trainer attributes the schedule reads, one epoch of 100 batches validated at its end."""
    defaults = dict(val_check_batch=100, num_training_batches=100, check_val_every_n_epoch=1,
                    max_steps=-1, max_epochs=3, accumulate_grad_batches=1)  # fmt: skip
    return SimpleNamespace(**{**defaults, **settings})


def test_first_validation_follows_lightnings_rule() -> None:
    assert first_validation_batch(schedule()) == 100
    assert first_validation_batch(schedule(val_check_batch=25)) == 25
    # every 3rd epoch: after two whole epochs and 25 batches of the third
    assert first_validation_batch(schedule(val_check_batch=25, check_val_every_n_epoch=3)) == 225
    # check_val_every_n_epoch=None counts batches across epochs
    assert (
        first_validation_batch(schedule(val_check_batch=250, check_val_every_n_epoch=None)) == 250
    )
    # by wall time, or epochs of unknown length: not known in advance
    assert first_validation_batch(schedule(val_check_batch=None)) is None
    assert first_validation_batch(schedule(num_training_batches=float("inf"))) is None


def test_the_tightest_limit_bounds_the_training_batches() -> None:
    assert training_batches(schedule()) == (300, "trainer.max_epochs=3 of 100 batches")
    assert training_batches(schedule(max_steps=50)) == (50, "trainer.max_steps=50")
    assert training_batches(schedule(max_steps=50, accumulate_grad_batches=4)) == (
        200,
        "trainer.max_steps=50",
    )
    assert training_batches(schedule(max_epochs=-1, num_training_batches=float("inf"))) is None


@pytest.mark.parametrize("val_check_interval", [3, 2])
def test_a_run_that_never_validates_says_so(make_cfg, caplog, val_check_interval: int) -> None:
    """2 steps of a 5-batch epoch, validated every val_check_interval batches: none at 3, one at
    2."""
    cfg = make_cfg("trainer.max_steps=2", "trainer.max_epochs=1", "trainer.limit_train_batches=5",
                   f"++trainer.val_check_interval={val_check_interval}",
                   "trainer.limit_val_batches=1", "trainer.num_sanity_val_steps=0",
                   "data.batch_size=8", "test=false")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="src.callbacks.validation_schedule"):
        summary = train(cfg)
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "src.callbacks.validation_schedule"
    ]
    fix = (
        "validate sooner (++trainer.val_check_interval=<batches>, trainer.check_val_every_n_epoch) "
        "or train longer (trainer.max_steps, trainer.max_epochs)"
    )
    if val_check_interval == 2:
        assert warnings == [] and summary["best_checkpoint"] is not None
        return
    assert summary["best_checkpoint"] is None
    assert warnings == [
        "validation will never run: trainer.max_steps=2 ends training after 2 batch(es), "
        "before the first validation after batch 3 (val_check_interval=3, "
        "check_val_every_n_epoch=1, 5 batches an epoch), so no checkpoint is ranked and "
        f"best_checkpoint will be null; {fix}",
        "validation never ran in 2 step(s): no checkpoint was ranked, so best_checkpoint is "
        f"null; {fix}",
    ]
