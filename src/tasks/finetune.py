"""Starting a run from other weights: weights-only initialisation and frozen batch norm.

A weights-only init (``init_checkpoint``) is not a resume: the optimiser, schedule, epoch and RNG
start fresh. It is what the second stage of the thesis's two-stage segmentation recipe and the
COCO multi-label fine-tuning do, and how a run starts from an official release (the EdgeNets
ImageNet or segmentation ``.pth``, an official PRU, Transformer-XL or Group-Transformer state
dict), converted by :mod:`src.compat`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor, nn

from src.compat import OfficialWeightsError, family_of, load_official
from src.utils.errors import InputFileError, UserError
from src.utils.state_dicts import mismatch_summary, project_network_state, torch_load

log = logging.getLogger(__name__)

SETTING = "init_checkpoint"  # the task option the path comes from, named in every message


class InitCheckpointError(UserError, KeyError, ValueError):
    """An ``init_checkpoint`` that cannot initialise the network: unreadable, or weights that do
    not fit (missing or unexpected tensors, hence a ``KeyError``; other shapes, hence a
    ``ValueError``). The message is one line naming the file and what was expected."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


class InitFromCheckpoint:
    """A task whose network may start from other weights: ``init_checkpoint`` (a checkpoint of this
    project, an averaged or exported one too, a plain network state dict, or an official release
    file that :mod:`src.compat` converts) is loaded into ``self.net`` when fitting starts, before
    Lightning restores a resumed checkpoint (which then wins). Mixed in before
    ``L.LightningModule``; the task sets ``self.init_checkpoint``."""

    init_checkpoint: str | None = None

    def setup(self, stage: str) -> None:
        super().setup(stage)  # type: ignore[misc]
        if stage == "fit" and self.init_checkpoint is not None:
            load_network_weights(self.net, self.init_checkpoint)  # type: ignore[attr-defined]
            log.info("initialised the network from %s", self.init_checkpoint)


def _read(path: str | Path) -> object:
    """``torch.load(path, weights_only=True)`` on the CPU; a missing or unreadable file raises a
    one-line :class:`~src.utils.errors.UserError` naming ``init_checkpoint`` and the path."""
    try:
        return torch_load(path, SETTING)
    except FileNotFoundError as error:
        raise InputFileError(str(error)) from None
    except ValueError as error:  # not a file torch can read
        raise InitCheckpointError(str(error)) from None


def _plain_state(loaded: object) -> dict[str, Tensor] | None:
    """A file's state dict when it is not a Lightning checkpoint of this project: the mapping
    itself, or its ``state_dict`` entry; None when it holds neither."""
    if isinstance(loaded, Mapping) and isinstance(loaded.get("state_dict"), Mapping):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, Mapping) or not all(isinstance(k, str) for k in loaded):
        return None
    return dict(loaded)


def _load_official(
    net: nn.Module, state: Mapping[str, Tensor], path: str | Path, family: str
) -> None:
    try:
        load_official(net, state)
    except OfficialWeightsError as error:
        raise InitCheckpointError(
            f"{SETTING}={path} is neither a checkpoint of this project for {type(net).__name__} "
            f"nor official {family} weights for it: {error}"
        ) from None
    log.info("initialised %s from the official %s weights %s", type(net).__name__, family, path)


def load_network_weights(
    net: nn.Module, path: str | Path, *, skip_mismatched: bool = False
) -> list[str]:
    """Load the weights in ``path`` into ``net``.

    ``path`` holds one of:

    - a Lightning checkpoint of this project (its ``state_dict``'s ``net.*`` entries), an averaged
      or exported one too, or a plain state dict in ``net``'s names;
    - an official release file of a network :mod:`src.compat` converts (any other state dict; the
      family is picked by ``net``'s type, :func:`src.compat.load_official`): e.g. the EdgeNets
      ``dicenet_s_1.0_imagenet_224x224.pth`` for a DiCENet, a segmentation ``.pth`` for the
      EdgeNets segmentation network, an ImageNet classifier's for an SSD's backbone.

    An SSD also takes a checkpoint of this project's ImageNet classifier (any number of classes)
    for its backbone: a checkpoint of ours that does not fit the network as it is, with other
    keys, goes through the converter, which knows that case.

    Tensors only (``torch.load(..., weights_only=True)``). With ``skip_mismatched``, entries of a
    checkpoint of ours whose shape differs from ``net``'s (the classifier of a network trained
    for another number of classes) keep their fresh values and are returned; every other missing
    or unexpected key is an error.

    Raises:
        InputFileError: ``path`` does not exist (a ``FileNotFoundError``).
        InitCheckpointError: the file cannot be read, or its weights do not fit ``net``; one line
            naming the file and what was expected.
    """
    loaded = _read(path)
    own = project_network_state(loaded)
    state = own if own is not None else _plain_state(loaded)
    if state is None:
        raise InitCheckpointError(
            f"{SETTING}={path} holds a {type(loaded).__name__}, not a checkpoint or a state dict"
        )
    expected = net.state_dict()
    family = family_of(net)
    same_keys = state.keys() == expected.keys()
    if own is None and not same_keys and family is not None:
        _load_official(net, state, path, family)
        return []
    mismatched = sorted(k for k, v in expected.items() if k in state and state[k].shape != v.shape)
    compared = {
        k: (expected[k] if k in mismatched and skip_mismatched else v) for k, v in state.items()
    }
    problems = mismatch_summary(expected, compared)
    if problems:
        if family is not None and not same_keys:  # e.g. our ImageNet classifier for an SSD
            try:
                load_official(net, state)
            except OfficialWeightsError as error:
                raise InitCheckpointError(
                    f"{SETTING}={path} does not fit {type(net).__name__}: {problems}; nor through "
                    f"the {family} converter: {error}"
                ) from None
            log.info(
                "initialised %s from %s through the %s converter", type(net).__name__, path, family
            )
            return []
        raise InitCheckpointError(f"{SETTING}={path} does not fit {type(net).__name__}: {problems}")
    for key in mismatched:
        state[key] = expected[key]
    net.load_state_dict(state)
    log.info(
        "initialised %s from %s; kept fresh: %s", type(net).__name__, path, mismatched or "nothing"
    )
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
