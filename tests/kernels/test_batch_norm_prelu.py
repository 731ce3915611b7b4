"""BatchNorm + PReLU fused for channels-last CPU training
(``src/kernels/batch_norm_prelu/__init__.py``,
``src/kernels/batch_norm_prelu/batch_norm_prelu.cpp``) against a float64 oracle and the unfused
modules.

Tolerances: in float32 the output and every gradient are within 1e-5 of the float64 oracle,
relative to each tensor's largest value (the statistics and the gradient sums are float32 sums in
another order than ATen's); the running statistics within 1e-6. With bfloat16 inputs the output
and the input gradient are rounded once to bfloat16 (2^-8 relative) from float32 values that agree
to 1e-5; the parameter gradients stay float32 (1e-4).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

import src.kernels.batch_norm
import src.kernels.batch_norm_prelu
from src.kernels.batch_norm import BatchNorm2d
from src.kernels.batch_norm_prelu import FusingSequential, batch_norm_prelu
from src.kernels.prelu import PReLU
from src.models.dicenet import DiCENet
from src.models.espnetv2 import ESPNetv2
from src.ops.eesp import EESP
from tests.helpers import (
    KIND_FAULTS,
    SHAPE_FAULTS,
    assert_rejected,
    autograd_node_names,
    max_relative_error,
    recording_backend,
    require_cpu_kernels,
)

FUSED = "BatchNormPReLUFunctionBackward"


@pytest.fixture
def kernels() -> None:
    require_cpu_kernels()


def _modules(channels: int, momentum: float | None = 0.1) -> tuple[BatchNorm2d, PReLU]:
    """BN and PReLU with non-trivial parameters and running statistics."""
    gen = torch.Generator().manual_seed(4)
    norm, act = BatchNorm2d(channels, momentum=momentum), PReLU(channels)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(channels, generator=gen) * 3 - 1)  # both signs
        norm.bias.copy_(torch.randn(channels, generator=gen))
        norm.running_mean.copy_(torch.randn(channels, generator=gen))
        norm.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
        act.weight.copy_(torch.rand(channels, generator=gen) - 0.25)  # both signs
    return norm, act


def _copies(norm: BatchNorm2d, act: PReLU, dtype: torch.dtype = torch.float32):
    other_norm, other_act = (
        BatchNorm2d(norm.num_features, momentum=norm.momentum),
        PReLU(act.num_parameters),
    )
    other_norm.load_state_dict(norm.state_dict())
    other_act.load_state_dict(act.state_dict())
    return other_norm.to(dtype), other_act.to(dtype)


def _inputs(shape: tuple[int, ...], dtype: torch.dtype = torch.float32, *, offset: float = 0.0,
            grad_channels_last: bool = True) -> tuple[Tensor, Tensor]:  # fmt: skip
    gen = torch.Generator().manual_seed(6)
    # an offset and scale per channel, as activations have
    x = torch.randn(shape, generator=gen) * 3 + torch.randn(shape[1], 1, 1, generator=gen) + offset
    probe = torch.randn(shape, generator=gen)
    if grad_channels_last:
        probe = probe.to(memory_format=torch.channels_last)
    return x.to(dtype, memory_format=torch.channels_last), probe.to(dtype)


def _run(fn, norm: nn.BatchNorm2d, act: nn.PReLU, x: Tensor, probe: Tensor) -> list[Tensor]:
    """Output, the gradients of x, BN's weight and bias, the slope; the running statistics."""
    x = x.detach().requires_grad_()
    y = fn(x)
    grads = torch.autograd.grad(y, (x, norm.weight, norm.bias, act.weight), probe)
    return [y, *grads, norm.running_mean.clone(), norm.running_var.clone()]


def _oracle(norm: BatchNorm2d, act: PReLU, x: Tensor, probe: Tensor) -> list[Tensor]:
    norm64, act64 = _copies(norm, act, torch.float64)
    return _run(
        lambda v: F.prelu(norm64(v), act64.weight), norm64, act64, x.double(), probe.double()
    )


def _node(y: Tensor) -> str:
    return type(y.grad_fn).__name__


@pytest.mark.parametrize(
    ("shape", "momentum", "grad_channels_last"),
    [((4, 6, 9, 7), 0.1, True), ((4, 6, 9, 7), 0.1, False), ((2, 3, 3, 1), 0.3, True),
     ((8, 40, 16, 16), 0.1, True)],  # the last: 2,048 rows in 10 row blocks
    ids=str,
)  # fmt: skip
def test_float32_matches_the_float64_oracle(
    kernels: None, shape: tuple[int, ...], momentum: float, grad_channels_last: bool
) -> None:
    norm, act = _modules(shape[1], momentum)
    oracle = _oracle(norm, act, *_inputs(shape, grad_channels_last=grad_channels_last))
    x, probe = _inputs(shape, grad_channels_last=grad_channels_last)
    got = _run(lambda v: batch_norm_prelu(v, norm, act), norm, act, x, probe)
    assert _node(got[0]) == FUSED
    assert got[0].is_contiguous(memory_format=torch.channels_last)
    assert got[1].stride() == x.stride()
    names = ["y", "grad_x", "grad_weight", "grad_bias", "grad_slope", "mean", "var"]
    for name, a, b in zip(names, got, oracle, strict=True):
        assert a.dtype == torch.float32 and a.shape == b.shape, name
        bound = 1e-6 if name in ("mean", "var") else 1e-5
        assert max_relative_error(a, b) < bound, name
    assert int(norm.num_batches_tracked) == 1


def test_equals_the_unfused_modules_to_float32_rounding(kernels: None) -> None:
    norm, act = _modules(12)
    other_norm, other_act = _copies(norm, act)
    x, probe = _inputs((4, 12, 6, 5))
    got = _run(lambda v: batch_norm_prelu(v, norm, act), norm, act, x, probe)
    want = _run(lambda v: other_act(other_norm(v)), other_norm, other_act, x, probe)
    assert _node(got[0]) == FUSED and _node(want[0]) == "PReLUCpuFunctionBackward"
    for a, b in zip(got, want, strict=True):
        assert max_relative_error(a, b.double()) < 1e-5


def test_statistics_of_a_mean_far_from_zero(kernels: None) -> None:
    # a mean 1,000 times the spread: unshifted float32 sums of squares would lose the variance
    norm, act = _modules(8)
    x, probe = _inputs((8, 8, 12, 12), offset=3000.0)
    oracle = _oracle(norm, act, x, probe)
    got = _run(lambda v: batch_norm_prelu(v, norm, act), norm, act, x, probe)
    for name, a, b in zip(["y", "grad_x", "var"], got[:2] + got[6:], oracle[:2] + oracle[6:],
                          strict=True):  # fmt: skip
        assert max_relative_error(a, b) < 1e-3, name


def test_bfloat16_inputs_keep_float32_parameter_gradients(kernels: None) -> None:
    norm, act = _modules(12)
    x, probe = _inputs((4, 12, 6, 5), torch.bfloat16)
    oracle = _oracle(norm, act, x, probe)
    got = _run(lambda v: batch_norm_prelu(v, norm, act), norm, act, x, probe)
    assert _node(got[0]) == FUSED
    assert got[0].dtype == got[1].dtype == torch.bfloat16
    for a, b in zip(got[:2], oracle[:2], strict=True):
        torch.testing.assert_close(a.double(), b, rtol=2**-8, atol=2**-8 * b.abs().max().item())
    for a, b in zip(got[2:], oracle[2:], strict=True):
        assert a.dtype == torch.float32 and max_relative_error(a, b) < 1e-4


def test_under_autocast_as_the_unfused_modules(kernels: None) -> None:
    # a bfloat16 convolution output, as autocast gives BN in the networks
    norm, act = _modules(8)
    other_norm, other_act = _copies(norm, act)
    conv = nn.Conv2d(3, 8, 3, padding=1).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 7, 7).to(memory_format=torch.channels_last)
    probe = torch.randn(2, 8, 7, 7)
    results = []
    for fn, params in (
        (lambda v: batch_norm_prelu(v, norm, act), (norm.weight, norm.bias, act.weight)),
        (
            lambda v: other_act(other_norm(v)),
            (other_norm.weight, other_norm.bias, other_act.weight),
        ),
    ):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = fn(conv(x))
        grads = torch.autograd.grad((y.float() * probe).sum(), (conv.weight, *params))
        results.append((y, *grads))
    assert _node(results[0][0]) == FUSED
    assert results[0][0].dtype == results[1][0].dtype == torch.bfloat16
    for a, b in zip(results[0], results[1], strict=True):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2 * b.abs().max().item())


def test_momentum_none_is_a_cumulative_average(kernels: None) -> None:
    norm, act = _modules(5, momentum=None)
    other_norm, other_act = _copies(norm, act)
    for step in range(3):
        x, probe = _inputs((3, 5, 4, 4))
        x = x + step
        got = _run(lambda v: batch_norm_prelu(v, norm, act), norm, act, x, probe)
        want = _run(lambda v: other_act(other_norm(v)), other_norm, other_act, x, probe)
        assert _node(got[0]) == FUSED
        for a, b in zip(got[5:], want[5:], strict=True):
            assert max_relative_error(a, b.double()) < 1e-6
    assert int(norm.num_batches_tracked) == int(other_norm.num_batches_tracked) == 3


def test_autograd_keeps_x_only(kernels: None) -> None:
    # the unfused pair keeps x and BN's output z; the fused op x and six (C,) vectors
    norm, act = _modules(16)
    x = _inputs((4, 16, 8, 8))[0].requires_grad_()
    saved: dict[str, int] = {}
    for name, fn in (("fused", batch_norm_prelu), ("unfused", lambda v, n, a: a(n(v)))):
        total = 0

        def pack(t: Tensor) -> Tensor:
            nonlocal total
            total += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn(x, norm, act)
        saved[name] = total
    assert saved["fused"] == x.numel() + 5 * 16
    assert saved["unfused"] >= 2 * x.numel()


def test_kernels_do_not_depend_on_the_thread_count(kernels: None) -> None:
    gen = torch.Generator().manual_seed(7)
    x, grad_y = torch.randn(3200, 16, generator=gen) + 2, torch.randn(3200, 16, generator=gen)
    residual = torch.randn(3200, 16, generator=gen)
    weight, bias, slope = (torch.rand(16, generator=gen) for _ in range(3))
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            y, mean, invstd, var = torch.ops.lightnets_cpu.batch_norm_prelu_forward(
                x, weight, bias, slope, 1e-5, residual
            )
            grads = torch.ops.lightnets_cpu.batch_norm_prelu_backward(
                grad_y, x, weight, bias, slope, mean, invstd, residual
            )
            runs.append((y, mean, invstd, var, *grads))
    finally:
        torch.set_num_threads(threads)
    for other in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], other, strict=True))


@pytest.mark.parametrize(
    "case",
    ["contiguous", "eval", "no_grad", "one_slope", "float64", "float32_under_autocast",
     "own_forward", "no_kernels"],
)  # fmt: skip
def test_the_modules_run_where_the_fused_op_does_not_apply(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    norm, act = _modules(4)
    if case == "one_slope":
        act = PReLU(1)
    elif case == "own_forward":  # a BatchNorm subclass with a forward of its own keeps it

        class Halved(BatchNorm2d):
            def forward(self, x: Tensor) -> Tensor:
                return super().forward(x) / 2

        own = Halved(4)
        own.load_state_dict(norm.state_dict())
        norm = own
    other_norm, other_act = _copies(norm, act)
    if case == "own_forward":
        other_norm = copy.deepcopy(norm)
    x = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last)
    if case == "contiguous":
        x = x.contiguous()
    elif case == "eval":
        norm.eval(), other_norm.eval()
    elif case == "float64":
        norm.double(), act.double(), other_norm.double(), other_act.double()
        x = x.double()
    elif case == "no_kernels":
        for module in (src.kernels.batch_norm, src.kernels.batch_norm_prelu):
            monkeypatch.setattr(module, "cpu_kernels_loaded", lambda: False)
    x.requires_grad_()
    with (
        torch.set_grad_enabled(case != "no_grad"),
        torch.autocast("cpu", torch.bfloat16, enabled=case == "float32_under_autocast"),
    ):
        y = batch_norm_prelu(x, norm, act)
        want = other_act(other_norm(x))
    assert torch.equal(y, want)
    assert (y.grad_fn is None) if case == "no_grad" else _node(y) != FUSED
    assert torch.equal(norm.running_mean, other_norm.running_mean)


def _forward_args() -> list:
    torch.manual_seed(0)
    x, residual = torch.randn(12, 5), torch.randn(12, 5)
    return [x, torch.rand(5), torch.randn(5), torch.rand(5), 1e-5, residual]


def _backward_args() -> list:
    x, weight, bias, slope, eps, residual = _forward_args()
    _, mean, invstd, _ = torch.ops.lightnets_cpu.batch_norm_prelu_forward(
        x, weight, bias, slope, eps, residual
    )
    return [torch.randn(12, 5), x, weight, bias, slope, mean, invstd, residual]


FORWARD = {"x": 0, "weight": 1, "bias": 2, "slope": 3, "residual": 5}
BACKWARD = {"grad_y": 0, "x": 1, "weight": 2, "bias": 3, "slope": 4, "save_mean": 5,
            "save_invstd": 6, "residual": 7}  # fmt: skip
MATRICES = ("x", "grad_y", "residual")  # (R, C), the others (C,)
FAULTS = (*SHAPE_FAULTS, *KIND_FAULTS)


@pytest.mark.parametrize(
    ("kernel", "name", "fault"),
    [("batch_norm_prelu_forward", n, f) for n in FORWARD for f in FAULTS
     # x may be bfloat16; a vector has no other shape of its rank
     if (n, f) != ("x", "bfloat16") and not (f == "reshaped" and n not in MATRICES)]
    + [("batch_norm_prelu_backward", n, f) for n in BACKWARD for f in FAULTS
       if (n, f) != ("x", "bfloat16") and not (f == "reshaped" and n not in MATRICES)],
)  # fmt: skip
def test_kernels_reject_a_faulty_operand(kernels: None, kernel: str, name: str, fault: str) -> None:
    forward = kernel == "batch_norm_prelu_forward"
    operands = FORWARD if forward else BACKWARD
    args = _forward_args() if forward else _backward_args()
    if name == "residual":
        fixed: tuple[int, ...] = (0, 1)  # x fixes its every size
    elif forward:
        fixed = (0,) if name != "x" else (1,)  # x's channels fix the vectors
    else:
        fixed = (0,) if operands[name] >= 2 else (0, 1)  # grad_y and x fix each other's sizes
    assert_rejected(kernel, args, name, operands[name], fault, fixed)


def test_kernels_reject_one_row_and_a_bad_eps(kernels: None) -> None:
    x, weight, bias, slope, eps, _ = _forward_args()
    with pytest.raises(RuntimeError, match=r"x has shape \[1, 5\]: .*more than one value"):
        torch.ops.lightnets_cpu.batch_norm_prelu_forward(x[:1], weight, bias, slope, eps)
    with pytest.raises(RuntimeError, match="eps must be positive, got 0"):
        torch.ops.lightnets_cpu.batch_norm_prelu_forward(x, weight, bias, slope, 0.0)


def test_compiled_step_traces_both_kernels_and_matches_eager_bitwise(kernels: None) -> None:
    torch._dynamo.reset()
    x, probe = _inputs((2, 6, 5, 5), grad_channels_last=False)
    norm, act = _modules(6)
    eager = _run(lambda v: batch_norm_prelu(v, norm, act), norm, act, x, probe)
    norm, act = _modules(6)
    backend, graphs = recording_backend()
    compiled_fn = torch.compile(lambda v: batch_norm_prelu(v, norm, act), backend=backend,
                                fullgraph=True)  # fmt: skip
    compiled = _run(compiled_fn, norm, act, x, probe)
    torch._dynamo.reset()
    assert "lightnets.batch_norm_prelu_forward" in "".join(graphs["forward"])
    assert "lightnets.batch_norm_prelu_backward" in "".join(graphs["backward"])
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled, strict=True))


def test_fusing_sequential_is_a_drop_in_sequential(kernels: None) -> None:
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 6, 1, bias=False), BatchNorm2d(6), PReLU(6),
              nn.Conv2d(6, 6, 1, bias=False), BatchNorm2d(6), nn.ReLU(),
              nn.Conv2d(6, 6, 1, bias=False), BatchNorm2d(6)]  # fmt: skip
    fusing = FusingSequential(*layers).to(memory_format=torch.channels_last)
    plain = copy.deepcopy(nn.Sequential(*layers))
    assert fusing.state_dict().keys() == plain.state_dict().keys()
    x = torch.randn(2, 3, 5, 5).to(memory_format=torch.channels_last).requires_grad_()
    probe = torch.randn(2, 6, 5, 5)  # not a sum: BN's input gradient of a sum is zero
    results = []
    for net in (fusing, plain):
        y = net(x)
        grads = torch.autograd.grad(y, [x, *net.parameters()], probe)
        results.append((y, *grads, *net.buffers()))
    for a, b in zip(*results, strict=True):
        assert max_relative_error(a, b.double()) < 1e-5
    # the first pair runs fused; the second BN (before a ReLU) and the last run alone
    names = autograd_node_names(results[0][0])
    assert names.count(FUSED) == 1 and names.count("BatchNormCpuFunctionBackward") == 2


def test_dicenet_trains_every_bn_prelu_pair_fused(kernels: None) -> None:
    # in DiCENet every BN is followed by a PReLU
    net = DiCENet(0.5, num_classes=10, in_chans=1, input_size=32, stem_stride=2)
    net = net.to(memory_format=torch.channels_last)
    names = autograd_node_names(
        net(torch.randn(2, 1, 32, 32).to(memory_format=torch.channels_last))
    )
    assert names.count(FUSED) == sum(isinstance(m, nn.BatchNorm2d) for m in net.modules()) == 71
    assert "PReLUCpuFunctionBackward" not in names


@pytest.mark.parametrize("shape", [(4, 6, 9, 7), (8, 40, 16, 16)], ids=str)
def test_a_residual_matches_the_float64_oracle(kernels: None, shape: tuple[int, ...]) -> None:
    # PReLU(BN(x) + r), EESP's unit output: r's gradient is PReLU's input gradient
    norm, act = _modules(shape[1])
    x, probe = _inputs(shape)
    residual = torch.randn(shape).to(memory_format=torch.channels_last).requires_grad_()
    x = x.requires_grad_()
    y = batch_norm_prelu(x, norm, act, residual=residual)
    leaves = [x, residual, norm.weight, norm.bias, act.weight]
    got = [y, *torch.autograd.grad(y, leaves, probe), norm.running_mean, norm.running_var]
    norm64, act64 = _copies(_modules(shape[1])[0], act, torch.float64)
    leaves64 = [t.detach().double().requires_grad_() for t in (x, residual)]
    leaves64 += [norm64.weight, norm64.bias, act64.weight]
    y64 = F.prelu(norm64(leaves64[0]) + leaves64[1], act64.weight)
    want = [y64, *torch.autograd.grad(y64, leaves64, probe.double())]
    want += [norm64.running_mean, norm64.running_var]
    assert _node(y) == FUSED
    names = [
        "y",
        "grad_x",
        "grad_residual",
        "grad_weight",
        "grad_bias",
        "grad_slope",
        "mean",
        "var",
    ]
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == torch.float32 and max_relative_error(a, b) < 1e-5, name
    assert got[2].is_contiguous(memory_format=torch.channels_last)


def test_a_residual_in_another_layout_runs_the_modules(kernels: None) -> None:
    norm, act = _modules(6)
    other_norm, other_act = _copies(norm, act)
    x = _inputs((2, 6, 5, 5))[0]
    residual = torch.randn(2, 6, 5, 5)  # NCHW
    y = batch_norm_prelu(x.requires_grad_(), norm, act, residual=residual)
    assert _node(y) != FUSED
    assert torch.equal(y, other_act(other_norm(x) + residual))


def test_espnetv2_trains_its_eesp_residuals_fused(kernels: None) -> None:
    net = ESPNetv2(0.5, num_classes=10).to(memory_format=torch.channels_last)
    names = autograd_node_names(
        net(torch.randn(2, 3, 64, 64).to(memory_format=torch.channels_last))
    )
    units = sum(1 for m in net.modules() if type(m) is EESP and m.stride == 1)
    # every BN followed by PReLU (40), and each stride-1 EESP unit's BN, residual and PReLU (13)
    assert units == 13 and names.count(FUSED) == 40 + units
