"""Gradient clipping with fused optimisers under Lightning's mixed precision
(``src/optim/clipping.py``): after the clipping hook the gradients are within the limit (unscaled
where a scaler is at work), and the fused step then runs, in every precision."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from src.optim.clipping import FusedOptimizerClipping

LIMIT = 0.05


class Regression(L.LightningModule):
    """A linear map fitted by a loss scaled up so that every gradient norm exceeds LIMIT."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 4)
        self.norms: list[float] = []
        self.max_abs: list[float] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int):
        x, y = batch
        return 100.0 * (self.net(x).float() - y).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3, fused=True)

    def record(self, optimizer: torch.optim.Optimizer) -> None:
        """The gradients' norm and largest magnitude, unscaled, as the step will use them."""
        grads = [p.grad.float() for p in self.parameters()]
        scale = 1.0
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        if scaler is not None and not self._unscaled(scaler, optimizer):
            scale = float(scaler.get_scale())
        self.norms.append(float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads]))) / scale)  # fmt: skip
        self.max_abs.append(max(float(g.abs().max()) for g in grads) / scale)

    @staticmethod
    def _unscaled(scaler, optimizer) -> bool:
        from torch.amp.grad_scaler import OptState

        return scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED


class ClippedRegression(FusedOptimizerClipping, Regression):
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                    gradient_clip_algorithm=None) -> None:  # fmt: skip
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.record(optimizer)


def fit(module: L.LightningModule, accelerator: str, precision: str, algorithm: str) -> None:
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(32, 8, generator=generator), torch.randn(32, 4, generator=generator)
    )
    trainer = L.Trainer(
        accelerator=accelerator, devices=1, precision=precision, max_steps=4,
        gradient_clip_val=LIMIT, gradient_clip_algorithm=algorithm, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, DataLoader(data, batch_size=8))


def runs() -> list[tuple[str, str]]:
    pairs = [("cpu", "bf16-mixed"), ("cpu", "32-true")]
    if torch.cuda.is_available():
        pairs += [("gpu", "bf16-mixed"), ("gpu", "16-mixed")]
    return pairs


@pytest.mark.parametrize(("accelerator", "precision"), runs())
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_fused_optimizer_steps_on_clipped_gradients(accelerator, precision, algorithm) -> None:
    module = ClippedRegression()
    before = module.net.weight.detach().clone()
    fit(module, accelerator, precision, algorithm)
    after = module.net.weight.detach().cpu()
    assert torch.isfinite(after).all() and not torch.equal(before, after)
    measured = module.norms if algorithm == "norm" else module.max_abs
    assert len(measured) == 4
    # clip_grad_norm_ scales by LIMIT / (norm + 1e-6); the loss's gradients are far above LIMIT
    assert all(LIMIT * 0.98 < m <= LIMIT * 1.0001 for m in measured), measured


def test_lightning_alone_refuses_to_clip_for_a_fused_optimizer() -> None:
    """What the mixin is for: without it, the first step of bf16-mixed training raises."""
    with pytest.raises(RuntimeError, match="does not allow for gradient clipping"):
        fit(Regression(), "cpu", "bf16-mixed", "norm")


def test_every_task_clips_for_fused_optimisers() -> None:
    """Every task builds a fused optimiser (conf/task/*.yaml), so each needs the mixin."""
    import importlib
    import inspect
    import pkgutil

    import src.tasks

    tasks = {
        obj
        for info in pkgutil.iter_modules(src.tasks.__path__)
        for _, obj in inspect.getmembers(
            importlib.import_module(f"src.tasks.{info.name}"), inspect.isclass
        )
        if issubclass(obj, L.LightningModule) and obj.__module__.startswith("src.tasks.")
    }
    assert len(tasks) >= 9
    assert not [t.__name__ for t in tasks if not issubclass(t, FusedOptimizerClipping)]


def _clipping_experiments() -> list[str]:
    from tests.conftest import CONF

    root = CONF / "experiment"
    return sorted(
        p.relative_to(root).with_suffix("").as_posix()
        for p in root.rglob("*.yaml")
        if "gradient_clip_val" in p.read_text()
    )


@pytest.mark.parametrize("experiment", _clipping_experiments())
def test_clipping_experiments_compose_with_a_task_that_clips_fused_optimisers(
    experiment: str, tmp_path
) -> None:
    """Every experiment that clips, in bf16-mixed: its fused optimiser meets a task that clips
    it."""
    from hydra.utils import get_class

    from tests.conftest import compose_config

    cfg = compose_config(
        "train", [f"experiment={experiment}", "trainer.precision=bf16-mixed"], tmp_path
    )
    assert cfg.trainer.gradient_clip_val and cfg.trainer.gradient_clip_val > 0
    assert issubclass(get_class(cfg.task._target_), FusedOptimizerClipping)
    assert cfg.task.optimizer.get("fused") is not False
