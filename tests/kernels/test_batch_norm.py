"""BatchNorm's channels-last CPU training backward (``src/kernels/batch_norm/__init__.py``,
``src/kernels/batch_norm/batch_norm.cpp``) against ``nn.BatchNorm2d`` and a float64 oracle.

Tolerances: the forward and the running statistics are ATen's, bit for bit. The gradients are
ATen's formula with the per-channel sums in another order: within 1e-5 of the float64 oracle
(relative to each gradient's largest value) in float32; for bfloat16 inputs the input gradient is
rounded once to bfloat16 from float32 values that agree to 1e-5, so within one of its units
(2^-8 relative) of ATen's.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import src.kernels.batch_norm
from src.kernels.batch_norm import BatchNorm2d
from tests.helpers import KIND_FAULTS, SHAPE_FAULTS, assert_rejected, require_cpu_kernels

KERNEL = "BatchNormCpuFunctionBackward"
ATEN = "NativeBatchNormBackward0"


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


def _pair(channels: int, momentum: float | None = 0.1) -> tuple[nn.BatchNorm2d, nn.BatchNorm2d]:
    """Ours and ``nn.BatchNorm2d`` with the same non-trivial parameters and statistics."""
    gen = torch.Generator().manual_seed(4)
    ours = BatchNorm2d(channels, momentum=momentum)
    with torch.no_grad():
        ours.weight.copy_(torch.rand(channels, generator=gen) * 3 - 1)  # both signs
        ours.bias.copy_(torch.randn(channels, generator=gen))
        ours.running_mean.copy_(torch.randn(channels, generator=gen))
        ours.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
    theirs = nn.BatchNorm2d(channels, momentum=momentum)
    theirs.load_state_dict(ours.state_dict())
    return ours, theirs


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, grad_channels_last: bool = True):
    gen = torch.Generator().manual_seed(6)
    # an offset and scale per channel, as activations have
    x = torch.randn(shape, generator=gen) * 3 + torch.randn(shape[1], 1, 1, generator=gen)
    probe = torch.randn(shape, generator=gen)
    x = x.to(dtype, memory_format=torch.channels_last)
    if grad_channels_last:
        probe = probe.to(memory_format=torch.channels_last)
    return x, probe.to(dtype)


def _run(bn: nn.BatchNorm2d, x: Tensor, probe: Tensor) -> tuple[list[Tensor], str]:
    """Output, the gradients of x, weight and bias, the running statistics; the backward node."""
    x = x.detach().requires_grad_()
    y = bn(x)
    grads = torch.autograd.grad(y, (x, bn.weight, bn.bias), probe)
    return [y, *grads, bn.running_mean.clone(), bn.running_var.clone()], type(y.grad_fn).__name__


def _float64_grads(bn: nn.BatchNorm2d, x: Tensor, probe: Tensor) -> list[Tensor]:
    oracle = nn.BatchNorm2d(bn.num_features).double()
    oracle.load_state_dict(bn.state_dict())
    x = x.detach().double().requires_grad_()
    y = oracle(x)
    return list(torch.autograd.grad(y, (x, oracle.weight, oracle.bias), probe.double()))


@pytest.mark.parametrize(
    ("shape", "grad_channels_last"),
    [((4, 6, 9, 7), True), ((4, 6, 9, 7), False), ((8, 40, 5, 5), True), ((2, 3, 3, 1), True),
     ((20, 5, 4, 4), True)],  # the last: 320 rows, more than the kernel's 64 row blocks
    ids=str,
)  # fmt: skip
def test_float32_matches_nn_batch_norm_and_the_float64_oracle(
    kernels: None, shape: tuple[int, ...], grad_channels_last: bool
) -> None:
    ours, theirs = _pair(shape[1])
    x, probe = _inputs(shape, torch.float32, grad_channels_last)
    oracle = _float64_grads(theirs, x, probe)
    got, node = _run(ours, x, probe)
    want, want_node = _run(theirs, x, probe)
    assert node == KERNEL and want_node == ATEN
    for name, a, b in zip(["y", "x", "weight", "bias", "mean", "var"], got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride(), name
    for a, b in zip(got[:1] + got[4:], want[:1] + want[4:], strict=True):
        assert torch.equal(a, b)  # the forward and the statistics: ATen's
    for a, b in zip(got[1:4], oracle, strict=True):
        scale = b.abs().max().item()
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * scale)
    assert int(ours.num_batches_tracked) == int(theirs.num_batches_tracked) == 1


def test_bfloat16_inputs_keep_float32_parameter_gradients(kernels: None) -> None:
    ours, theirs = _pair(12)
    x, probe = _inputs((4, 12, 6, 5), torch.bfloat16)
    (y, grad_x, grad_w, grad_b, *_), node = _run(ours, x, probe)
    (y_aten, grad_x_aten, grad_w_aten, grad_b_aten, *_), _ = _run(theirs, x, probe)
    assert node == KERNEL
    assert y.dtype == grad_x.dtype == torch.bfloat16
    assert grad_w.dtype == grad_b.dtype == torch.float32
    assert torch.equal(y, y_aten)
    torch.testing.assert_close(grad_x, grad_x_aten, rtol=2**-8, atol=2**-8)
    for a, b in ((grad_w, grad_w_aten), (grad_b, grad_b_aten)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_under_autocast_as_nn_batch_norm(kernels: None) -> None:
    # a bfloat16 convolution output, as autocast gives BN in the networks
    ours, theirs = _pair(8)
    conv = nn.Conv2d(3, 8, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 7, 7).to(memory_format=torch.channels_last)
    probe = torch.randn(2, 8, 7, 7)
    results = []
    for bn in (ours, theirs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = bn(conv(x))
        grads = torch.autograd.grad((y.float() * probe).sum(), (conv.weight, bn.weight, bn.bias))
        results.append((y, *grads, type(y.grad_fn).__name__))
    assert results[0][-1] == KERNEL
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1:4], results[1][1:4], strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * b.abs().max().item())


def test_momentum_none_is_a_cumulative_average(kernels: None) -> None:
    ours, theirs = _pair(5, momentum=None)
    for step in range(3):
        x, probe = _inputs((3, 5, 4, 4), torch.float32)
        x = x + step
        got, node = _run(ours, x, probe)
        want, _ = _run(theirs, x, probe)
        assert node == KERNEL
        assert torch.equal(got[4], want[4]) and torch.equal(got[5], want[5])


def test_kernel_does_not_depend_on_the_thread_count(kernels: None) -> None:
    # the kernel alone: ATen's forward statistics are not held to this
    gen = torch.Generator().manual_seed(7)
    x, grad_y = torch.randn(3200, 16, generator=gen), torch.randn(3200, 16, generator=gen)
    args = (grad_y, x, torch.rand(16, generator=gen), x.mean(0), x.var(0).add(1e-5).rsqrt())
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            runs.append(torch.ops.lightnets_cpu.batch_norm_backward(*args))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))


@pytest.mark.parametrize(
    "case", ["contiguous", "eval", "no_grad", "no_affine", "float64", "one_value", "no_kernels"]
)
def test_aten_runs_where_the_kernel_does_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bn = BatchNorm2d(4, affine=case != "no_affine")
    reference = nn.BatchNorm2d(4, affine=case != "no_affine")
    x = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last)
    if case == "contiguous":
        x = x.contiguous()
    elif case == "eval":
        bn.eval(), reference.eval()
    elif case == "float64":
        bn.double(), reference.double()
        x = x.double()
    elif case == "one_value":  # ATen's own error: one value per channel cannot be normalised
        with pytest.raises(ValueError, match="more than 1 value per channel"):
            bn(torch.randn(1, 4, 1, 1, requires_grad=True))
        return
    elif case == "no_kernels":
        monkeypatch.setattr(src.kernels.batch_norm, "cpu_kernels_loaded", lambda: False)
    x.requires_grad_()
    with torch.set_grad_enabled(case != "no_grad"):
        y = bn(x)
    assert torch.equal(y, reference(x))
    assert (y.grad_fn is None) if case == "no_grad" else type(y.grad_fn).__name__ == ATEN


OPERANDS = {"grad_y": 0, "x": 1, "weight": 2, "save_mean": 3, "save_invstd": 4}


@pytest.mark.parametrize(
    ("name", "fault"),
    [(n, f) for n in OPERANDS for f in (*SHAPE_FAULTS, *KIND_FAULTS)
     # x may be bfloat16 (grad_y must then follow it); a vector has no other shape of its rank
     if (n, f) not in (("x", "bfloat16"), *((v, "reshaped") for v in list(OPERANDS)[2:]))],
)  # fmt: skip
def test_kernel_rejects_a_faulty_operand(kernels: None, name: str, fault: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(12, 5)
    args = [torch.randn(12, 5), x, torch.rand(5), x.mean(0), x.var(0).add(1e-5).rsqrt()]
    fixed = (0,) if OPERANDS[name] >= 2 else (0, 1)  # grad_y and x fix each other's every size
    assert_rejected("batch_norm_backward", args, name, OPERANDS[name], fault, fixed)


def test_compiled_step_traces_the_kernel_and_matches_eager_bitwise(kernels: None) -> None:
    torch._dynamo.reset()
    x, probe = _inputs((2, 6, 5, 5), torch.float32, grad_channels_last=False)
    eager, _ = _run(_pair(6)[0], x, probe)
    compiled_bn = _pair(6)[0]
    compiled, _ = _run(torch.compile(compiled_bn, backend="aot_eager", fullgraph=True), x, probe)
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled, strict=True))


def test_module_is_a_drop_in_nn_batch_norm() -> None:
    ours, theirs = BatchNorm2d(6), nn.BatchNorm2d(6)
    assert isinstance(ours, nn.BatchNorm2d)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(ours))
    assert isinstance(converted[0], nn.SyncBatchNorm)
