"""Starting a run from another run's weights: weights-only initialisation and frozen batch norm.

A weights-only init (``init_checkpoint``) is not a resume: the optimiser, schedule, epoch and RNG
start fresh. It is what the second stage of the thesis's two-stage segmentation recipe and the
COCO multi-label fine-tuning do.
"""

from __future__ import annotations

import logging
from pathlib import Path

from torch import nn

from src.utils.state_dicts import mismatch_summary, project_network_state, torch_load

log = logging.getLogger(__name__)


class InitFromCheckpoint:
    """A task whose network may start from other weights: ``init_checkpoint`` (a checkpoint of this
    project, an averaged or exported one too, or a plain network state dict) is loaded into
    ``self.net`` when fitting starts, before Lightning restores a resumed checkpoint (which then
    wins). Mixed in before ``L.LightningModule``; the task sets ``self.init_checkpoint``."""

    init_checkpoint: str | None = None

    def setup(self, stage: str) -> None:
        super().setup(stage)  # type: ignore[misc]
        if stage == "fit" and self.init_checkpoint is not None:
            load_network_weights(self.net, self.init_checkpoint)  # type: ignore[attr-defined]
            log.info("initialised the network from %s", self.init_checkpoint)


def load_network_weights(net: nn.Module, path: str | Path, *, skip_mismatched: bool = False) -> list[str]:
    """Load the network weights of a Lightning checkpoint (``state_dict`` keys ``net.*``) into ``net``.

    Tensors only (``torch.load(..., weights_only=True)``). A file holding a plain network state
    dict is accepted too. With ``skip_mismatched``, entries whose shape differs from ``net``'s (the
    classifier of a network trained for another number of classes) keep their fresh values and
    are returned; every other missing or unexpected key is an error.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        KeyError: keys or shapes do not fit ``net`` (listed).
    """
    checkpoint = torch_load(path, "init_checkpoint")
    # a task checkpoint: keep the network's entries (not loss buffers such as class weights)
    state = project_network_state(checkpoint)
    if state is None:
        state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise KeyError(f"{path} holds no state dict")
    expected = net.state_dict()
    mismatched = sorted(k for k, v in expected.items() if k in state and state[k].shape != v.shape)
    compared = {k: (expected[k] if k in mismatched and skip_mismatched else v) for k, v in state.items()}
    problems = mismatch_summary(expected, compared)
    if problems:
        raise KeyError(f"{path} does not fit {type(net).__name__}: {problems}")
    for key in mismatched:
        state[key] = expected[key]
    net.load_state_dict(state)
    log.info("initialised %s from %s; kept fresh: %s", type(net).__name__, path, mismatched or "nothing")
    return mismatched


def batch_norms(net: nn.Module) -> list[nn.modules.batchnorm._BatchNorm]:
    """The batch-norm layers of ``net``."""
    return [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def freeze_batch_norm_parameters(net: nn.Module) -> int:
    """Stop training the affine parameters of every batch norm of ``net``; returns how many layers.

    Their running statistics are kept by putting the layers in eval mode after every
    ``train()`` call (the task does this), as the official ``--freeze-bn`` does.
    """
    layers = batch_norms(net)
    for layer in layers:
        for parameter in layer.parameters():
            parameter.requires_grad_(False)
    return len(layers)
