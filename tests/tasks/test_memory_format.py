"""The image tasks train channels-last (``src/utils/memory_format.py``): the network's parameters
and every batch, so that the CPU kernels that read rows of channels run in training."""

from __future__ import annotations

import functools

import pytest
import torch

from src.models.dicenet import DiCENet
from src.ops.dim_conv import DimConv
from src.tasks.classification import ClassificationTask
from src.tasks.multilabel import MultiLabelTask
from tests.helpers import require_cpu_kernels

TASKS = {"classification": ClassificationTask, "multilabel": MultiLabelTask}


def _task(kind: str, channels_last: bool):
    torch.manual_seed(0)
    net = DiCENet(scale=0.2, num_classes=10, input_size=32, stem_stride=2)
    optimizer = functools.partial(torch.optim.SGD, lr=0.1)
    return TASKS[kind](net, 10, optimizer, channels_last=channels_last)


@pytest.mark.parametrize("kind", TASKS)
def test_network_and_batches_are_channels_last(kind: str) -> None:
    task = _task(kind, channels_last=True).eval()  # no dropout, running statistics
    convs = [m.weight for m in task.net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(w.is_contiguous(memory_format=torch.channels_last) for w in convs)
    seen = []
    task.net.backbone.level1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    images = torch.randn(4, 3, 32, 32)  # the loader's contiguous batch
    logits = task(images)
    assert seen[0].is_contiguous(memory_format=torch.channels_last)
    plain = _task(kind, channels_last=False).eval()
    plain.net.backbone.level1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    torch.testing.assert_close(plain(images), logits, rtol=1e-4, atol=1e-5)
    assert seen[1].is_contiguous() and not seen[1].is_contiguous(memory_format=torch.channels_last)


def test_training_reaches_the_channels_last_kernels() -> None:
    require_cpu_kernels()
    task = _task("classification", channels_last=True).train()
    nodes = set()
    for module in task.net.modules():
        if isinstance(module, DimConv):
            module.register_forward_hook(lambda m, i, y: nodes.add(type(y.grad_fn).__name__))
    loss = task.training_step((torch.randn(4, 3, 32, 32), torch.randint(10, (4,))), 0)
    loss.backward()
    assert nodes == {"DimConvCpuFunctionBackward"}


class _TinyDetector(torch.nn.Module):
    """A conv with the attributes DetectionTask asks of a detector."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3, padding=1)
        self.num_classes = 2
        self.register_buffer("priors", torch.rand(16, 4))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.conv(images).permute(0, 2, 3, 1).reshape(images.shape[0], -1, 6)
        return y[..., :4], y[..., 4:]


def _dense_task(kind: str, channels_last: bool):
    from src.tasks.detection import DetectionTask
    from src.tasks.segmentation import SegmentationTask

    torch.manual_seed(0)
    optimizer = functools.partial(torch.optim.SGD, lr=0.1)
    if kind == "segmentation":
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1))
        return SegmentationTask(net, 4, optimizer, channels_last=channels_last)
    return DetectionTask(_TinyDetector(), optimizer, channels_last=channels_last)


@pytest.mark.parametrize("kind", ["segmentation", "detection"])
@pytest.mark.parametrize("channels_last", [True, False])
def test_dense_tasks_follow_the_option(kind: str, channels_last: bool) -> None:
    task = _dense_task(kind, channels_last)
    conv = next(m for m in task.net.modules() if isinstance(m, torch.nn.Conv2d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) == channels_last
    seen = []
    conv.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    images = torch.randn(2, 3, 4, 4)
    out = task(images)
    assert seen[0].is_contiguous(memory_format=torch.channels_last) == channels_last
    reference = _dense_task(kind, channels_last=False)(images)
    for got, want in zip(torch.atleast_1d(out), torch.atleast_1d(reference), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
