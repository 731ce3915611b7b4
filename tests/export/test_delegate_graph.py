"""The exported graphs of DiCENet and ESPNetv2 hold only what XNNPACK's partitioner takes, so an
ExecuTorch program is one delegate: no channel ``split`` (slices instead), no change of memory
format (the eager pools' channels-last copies), no average pool that counts its padding (the
explicit zero padding, then an unpadded pool). Each rule below broke DiCENet s=1.0's program
into 18 delegates and ESPNetv2's into 5 under executorch 1.5.1; the graphs stay equal to eager.
Their segmentation networks add two more: no adaptive pool to a size above 1x1 (EPP's pyramid:
a plain pool, or one pooling matrix per axis) and no matrix broadcast over the batch
(``expand_copy``, DiCE's resize products off its build size: a 1x1 convolution and a linear map).

No ExecuTorch is needed here: the constraints are checked on ``torch.export``'s graph, as the
lowering sees it (``tests/export/test_executorch.py`` lowers for real where it is installed)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from src.kernels.dispatch import capture_for_export
from src.kernels.pooling import AvgPool2d, adaptive_avg_pool2d, avg_pool2d
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2


def exported(net: nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    # a copy, as the exporters take: tracing leaves fake tensors in the folded-inference caches
    with torch.no_grad(), capture_for_export():
        return torch.export.export(copy.deepcopy(net).eval(), (x,))


def calls(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    return [n for n in program.graph.nodes if n.op == "call_function"]


def refused_by_xnnpack(node: torch.fx.Node) -> str | None:
    """Why executorch 1.5.1's XNNPACK partitioner would leave ``node`` out of its delegate (the
    cases these networks met), or None."""
    name = str(node.target)
    if "split" in name or "chunk" in name:
        return "split (not a partitioned op)"
    if "contiguous" in name or ("clone" in name and "memory_format" in node.kwargs):
        return "a change of memory format"
    if "expand" in name:
        return "a matrix broadcast over the batch (expand_copy)"
    if "adaptive_avg_pool2d" in name and tuple(node.args[1]) != (1, 1):
        return "an adaptive pool to more than one value per map"
    if name == "aten.avg_pool2d.default":
        args = list(node.args) + [None] * 7
        padding, ceil_mode, count_pad = args[3], args[4], args[5]
        counts = count_pad is None or bool(count_pad)
        if bool(ceil_mode) or (counts and padding and any(padding)):
            return "an average pool counting its padding"
    return None


def refused(program: torch.export.ExportedProgram) -> list[tuple[str, str]]:
    """Each node of ``program`` the partitioner would refuse, with why."""
    return [(str(n.target), why) for n in calls(program) if (why := refused_by_xnnpack(n))]


@pytest.mark.parametrize(
    "build",
    [
        lambda: DiCENet(scale=0.5, num_classes=10, input_size=64, stem_stride=2),
        lambda: ESPNetv2(scale=0.5, num_classes=10),
    ],
    ids=["dicenet", "espnetv2"],
)
def test_the_exported_network_is_one_delegate_and_equals_eager(build) -> None:
    torch.manual_seed(0)
    net = build().eval()
    x = torch.randn(1, 3, 64, 64)
    program = exported(net, x)
    assert refused(program) == []
    names = {str(n.target) for n in calls(program)}
    assert "aten.avg_pool2d.default" in names and "aten.pad.default" in names
    with torch.no_grad():
        expected = net(x)
        got = program.module()(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 5, 9, 9), (2, 4, 8, 11)])
def test_the_exported_average_pool_pads_explicitly_and_equals_torch(shape) -> None:
    x = torch.randn(*shape)
    pool = AvgPool2d(3, 2, 1)

    def image_pool(t: torch.Tensor) -> torch.Tensor:
        return avg_pool2d(t, 3, 2, 1)

    for module in (pool, image_pool):
        wrapped = module if isinstance(module, nn.Module) else _Fn(module)
        program = exported(wrapped, x)
        pools = [n for n in calls(program) if str(n.target) == "aten.avg_pool2d.default"]
        assert len(pools) == 1 and refused_by_xnnpack(pools[0]) is None
        expected = nn.AvgPool2d(3, 2, 1)(x)  # counts the padding: each window divides by 9
        torch.testing.assert_close(program.module()(x), expected, rtol=1e-6, atol=1e-7)
    # eager keeps the padded pool (and its channels-last copies on the CPU)
    torch.testing.assert_close(pool(x), nn.AvgPool2d(3, 2, 1)(x), rtol=0, atol=0)


def test_a_pool_that_does_not_count_its_padding_is_left_as_it_is() -> None:
    x = torch.randn(1, 4, 9, 9)
    pool = AvgPool2d(3, 2, 1, count_include_pad=False)
    program = exported(pool, x)
    assert "aten.pad.default" not in {str(n.target) for n in calls(program)}
    torch.testing.assert_close(program.module()(x), pool(x), rtol=0, atol=0)


class _Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def trained_like(module: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial BN statistics and PReLU slopes, so that a misplaced parameter shows."""
    generator = torch.Generator().manual_seed(seed)
    for sub in module.modules():
        if isinstance(sub, nn.BatchNorm2d):
            sub.running_mean.copy_(torch.randn(sub.num_features, generator=generator) * 0.1)
            sub.running_var.copy_(torch.rand(sub.num_features, generator=generator) + 0.5)
            sub.weight.data.copy_(torch.rand(sub.num_features, generator=generator) + 0.5)
            sub.bias.data.copy_(torch.randn(sub.num_features, generator=generator) * 0.1)
        if isinstance(sub, nn.PReLU):
            sub.weight.data.copy_(torch.rand(sub.weight.shape, generator=generator) * 0.5)
    return module.eval()


def test_dimfuse_of_the_unjoined_branches_equals_dimfuse_of_their_interleave() -> None:
    from src.kernels.dim_conv import join
    from src.ops.dim_fuse import DimFuse

    fuse = trained_like(DimFuse(8, 12))
    generator = torch.Generator().manual_seed(1)
    branches = tuple(torch.randn(2, 8, 5, 7, generator=generator) for _ in range(3))
    with torch.no_grad():
        expected = fuse(join(branches, interleave=True))
        got = fuse.fuse_branches(branches)
    assert got.shape == (2, 12, 5, 7)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_dice_unit_is_exported_without_the_join_at_its_build_size(shuffle: bool) -> None:
    from src.ops.dice import DiCE

    unit = trained_like(DiCE(8, 16, 6, 10, shuffle=shuffle))
    x = torch.randn(1, 8, 6, 10)
    names = [str(n.target) for n in calls(exported(unit, x))]
    # interleaved: three branches fused per channel, no stack and no grouped local conv;
    # concatenated (consecutive channels fused, not one channel's branches): the join stays
    joined = any("stack" in name or "cat" in name for name in names)
    assert joined is not shuffle
    with torch.no_grad():
        expected = unit(x)
        got = exported(unit, x).module()(x)
        # off the build size the reference's join (and resize products) stay
        other = torch.randn(1, 8, 12, 20)
        off = exported(unit, other)
        assert any("stack" in str(n.target) for n in calls(off)) is shuffle
        torch.testing.assert_close(off.module()(other), unit(other), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("shape", "size", "plain_pool"),
    [
        ((1, 3, 64, 32), (32, 16), True),  # EPP's scale 0.5 and the way back from scale 2
        ((1, 3, 96, 48), (64, 32), False),  # back from scale 1.5: windows of 2 at strides 1 and 2
        ((2, 3, 32, 16), (5, 5), False),  # scale 0.1, held at EPP's minimum of 5
        ((1, 2, 3, 4), (5, 5), False),  # a map smaller than the minimum: the pool repeats
    ],
)
def test_the_exported_adaptive_pool_is_a_plain_pool_or_two_products(shape, size, plain_pool):
    x = torch.randn(*shape)
    program = exported(_Fn(lambda t: adaptive_avg_pool2d(t, size)), x)
    assert refused(program) == []
    names = [str(n.target) for n in calls(program)]
    assert ("aten.avg_pool2d.default" in names) is plain_pool
    expected = torch.nn.functional.adaptive_avg_pool2d(x, size)
    torch.testing.assert_close(program.module()(x), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backbone", ["dicenet", "espnetv2"])
def test_the_exported_segmentation_network_is_one_delegate_and_equals_eager(backbone) -> None:
    from src.models.segmentation import dicenet_segmentation, espnetv2_segmentation

    build = dicenet_segmentation if backbone == "dicenet" else espnetv2_segmentation
    torch.manual_seed(0)
    net = trained_like(build(scale=0.5, num_classes=5))
    # off DiCE's build size (224), and EPP's pyramids at sizes that do not divide (scales 1.5, 0.1)
    x = torch.randn(1, 3, 96, 160)
    program = exported(net, x)
    assert refused(program) == []
    with torch.no_grad():
        expected = net(x)
        got = program.module()(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
