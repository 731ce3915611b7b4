"""DExTra and DeLighT's per-group LayerNorm: schedule, semantics, gradients, Triton path."""

from __future__ import annotations

import pytest
import torch

from benchmarks.op_cases.delight import step_by_step_dextra, step_by_step_group_norm
from src.kernels.shared_group_layer_norm import shared_group_layer_norm
from src.ops.dextra import DExTra, dextra_max_groups, dextra_schedule
from src.ops.shared_group_layer_norm import SharedGroupLayerNorm


def _unit(
    impl: str = "reference",
    dtype: torch.dtype = torch.float32,
    sizes: tuple[int, int, int] = (32, 16, 16),
    **overrides: object,
) -> DExTra:
    args: dict = {"width_multiplier": 2.0, "depth": 4, "max_groups": 4, "impl": impl}
    args.update(overrides)
    torch.manual_seed(0)
    unit = DExTra(*sizes, **args).to(dtype)
    with torch.no_grad():  # no trivial LayerNorm affines or zero biases
        for name, param in unit.named_parameters():
            param.add_(0.1 * torch.randn_like(param)) if "norm" in name or "bias" in name else None
    return unit


def test_readme_schedule_examples() -> None:
    # d_in 256, p = o = 128, w_m 2: d_max = 512
    four = dextra_schedule(128, 512, 128, depth=4, max_groups=8)
    assert four.groups == (2, 4, 4, 2)
    assert four.in_widths == (128, 256, 640, 640)
    assert four.out_widths == (128, 512, 512, 128)
    five = dextra_schedule(128, 512, 128, depth=5, max_groups=8)
    assert five.groups == (2, 4, 8, 4, 2)
    assert five.out_widths == (128, 320, 512, 320, 128)
    # N = 2: no expansion at all
    assert dextra_schedule(128, 512, 128, depth=2, max_groups=8).out_widths == (128, 128)


def test_paper_schedule_starts_at_one_group() -> None:
    paper = dextra_schedule(128, 512, 128, depth=5, max_groups=8, schedule="paper")
    assert paper.groups == (1, 2, 4, 2, 1)
    assert (dextra_max_groups(384), dextra_max_groups(384, schedule="paper")) == (16, 12)
    assert (dextra_max_groups(640), dextra_max_groups(640, schedule="paper")) == (32, 20)
    assert dextra_max_groups(512) == dextra_max_groups(512, schedule="paper") == 16
    unit = _unit(schedule="paper")
    assert unit.plan.groups[0] == 1
    x = torch.randn(3, 32)
    torch.testing.assert_close(unit(x), step_by_step_dextra(unit, x))


def test_shared_group_layer_norm_is_a_norm_per_chunk() -> None:
    torch.manual_seed(0)
    norm = SharedGroupLayerNorm(12, 3)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(2, 5, 12)
    torch.testing.assert_close(
        norm(x), step_by_step_group_norm(x, 3, norm.weight, norm.bias, norm.eps)
    )
    full = torch.nn.LayerNorm(12)
    torch.testing.assert_close(SharedGroupLayerNorm(12, 1)(x), full(x))
    with pytest.raises(ValueError, match=r"num_features \(12\).*groups \(5\)"):
        SharedGroupLayerNorm(12, 5)
    with pytest.raises(ValueError, match="cannot cut 12 features into 5 groups"):
        shared_group_layer_norm(x, 5, None, None)


def test_shared_group_layer_norm_gradcheck() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(4, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda *a: shared_group_layer_norm(a[0], 2, a[1], a[2]), (x, weight, bias)
    )


@pytest.mark.parametrize("depth", [3, 4])
def test_dextra_matches_step_by_step(depth: int) -> None:
    # the benchmark's baseline is the description spelled out; both must agree, gradients too
    unit = _unit(depth=depth)
    x = torch.randn(2, 3, 32, requires_grad=True)
    y = unit(x)
    ref = step_by_step_dextra(unit, x.view(6, 32)).view(2, 3, 16)
    torch.testing.assert_close(y, ref)
    inputs = [x, *unit.parameters()]
    grad = torch.randn_like(y)
    for got, want in zip(
        torch.autograd.grad(y, inputs, grad), torch.autograd.grad(ref, inputs, grad), strict=True
    ):
        torch.testing.assert_close(got, want)


def test_dextra_gradcheck() -> None:
    # groups (2, 2, 2), widths 8 -> 8 -> 8 -> 8: a few hundred parameters keep it fast
    unit = _unit(dtype=torch.float64, sizes=(8, 8, 8), width_multiplier=1.0, depth=3, max_groups=2)
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    names, params = zip(*unit.named_parameters(), strict=True)

    def fn(x: torch.Tensor, *values: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(unit, dict(zip(names, values, strict=True)), (x,))

    assert torch.autograd.gradcheck(fn, (x, *params))


def test_dextra_triton_matches_reference() -> None:
    # CUDA when there is one; else the interpreter on CPU tensors (tests/conftest.py)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    reference, fused = _unit().to(device), _unit(impl="triton").to(device)
    fused.load_state_dict(reference.state_dict())
    # 35 rows: not a multiple of the row block
    x = torch.randn(5, 7, 32, device=device, requires_grad=True)
    y, ref = fused(x), reference(x)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, *fused.parameters()], grad)
    want = torch.autograd.grad(ref, [x, *reference.parameters()], grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_dextra_reference_exports() -> None:
    unit = _unit().eval()
    x = torch.randn(2, 3, 32)
    exported = torch.export.export(unit, (x,))
    torch.testing.assert_close(exported.module()(x), unit(x))


def test_dextra_leading_dims_and_dropout() -> None:
    unit = _unit(dropout=0.5)
    x = torch.randn(2, 3, 4, 32)
    unit.eval()
    assert unit(x).shape == (2, 3, 4, 16)
    torch.testing.assert_close(unit(x)[1, 2], unit(x[1, 2]))
    unit.train()
    assert not torch.equal(unit(x), unit(x))


def test_dextra_output_passes_layer_norm_and_swish() -> None:
    unit = _unit()
    with torch.no_grad():
        unit.output_norm.weight.fill_(1.0)
        unit.output_norm.bias.fill_(0.0)
    y = unit(torch.randn(9, 32))
    assert (y >= -0.2785).all()  # swish's minimum: the output is activated
    assert (y < 0).any()  # ... and not a ReLU or a bare LayerNorm


def test_bad_configurations_raise() -> None:
    with pytest.raises(ValueError, match="schedule must be one of"):
        dextra_schedule(32, 128, 32, depth=4, max_groups=4, schedule="thesis")
    with pytest.raises(ValueError, match="depth=0"):
        dextra_schedule(32, 128, 32, depth=0, max_groups=4)
    with pytest.raises(ValueError, match="cannot be built"):
        DExTra(64, 34, 32, width_multiplier=2, depth=4, max_groups=8)
    with pytest.raises(ValueError, match="dropout"):
        DExTra(64, 32, 32, width_multiplier=2, depth=4, max_groups=4, dropout=1.5)
