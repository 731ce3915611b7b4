"""Mixed-precision checks shared by the op, model and task tests.

A module runs forward and backward twice from the same parameters: once in float32, once under
``torch.autocast`` in a 16-bit dtype. The autocast run must keep float32 parameters with float32
gradients, and its output and gradients must stay within a stated distance of the float32 run.

The distance is the relative L2 error ``||a - b|| / ||b||``, not a max-norm one: where an
activation has a kink (PReLU, ReLU) a few elements near zero change sides between the two runs and
take the other slope, which is a large error in those elements alone. Parameter gradients are
compared all together and one tensor at a time; a tensor's error is relative to its own norm or 5%
of the largest gradient norm, whichever is larger, because some float32 gradients are structurally
~0 (a conv bias right before a training-mode BN is invisible to the loss) and any rounding
dwarfs them.

bfloat16 keeps 8 significant bits, so one rounding is off by at most 2^-9 = 0.2%; a matmul whose
inputs are rounded to bf16 and accumulated in fp32 lands within a few roundings of fp32. The
tolerances allow 3% for one op and 5% for a whole network (dozens of layers, each rounding again,
and softmax amplifying small differences). Networks are compared in eval mode: a training-mode BN
over the few values of a small test batch divides by their spread, which amplifies rounding noise
without measuring anything about the network (training in bf16 is tested by the task runs).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

OP_TOLERANCE = 3e-2
NETWORK_TOLERANCE = 5e-2
# the 16-bit dtypes autocast supports per device type
AUTOCAST_DTYPES = {"cpu": (torch.bfloat16,), "cuda": (torch.bfloat16, torch.float16)}


def devices() -> list[str]:
    """The device types to test: the CPU always, CUDA when there is one."""
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def device_dtypes() -> list[tuple[str, torch.dtype]]:
    """(device type, autocast dtype) pairs to test on this machine."""
    return [(device, dtype) for device in devices() for dtype in AUTOCAST_DTYPES[device]]


def relative_error(value: Tensor, reference: Tensor, floor: float = 1e-30) -> float:
    """``||value - reference|| / max(||reference||, floor)`` in float64."""
    value, reference = value.double(), reference.double()
    return float((value - reference).norm() / reference.norm().clamp_min(floor))


def first_tensor(output: Tensor | Sequence) -> Tensor:
    """The main output of a module that may return (output, state) tuples."""
    while not isinstance(output, Tensor):
        output = output[0]
    return output


def straighten_prelus(module: nn.Module) -> nn.Module:
    """Set every PReLU slope to 1 (no kink), in place; returns ``module``."""
    for m in module.modules():
        if isinstance(m, nn.PReLU):
            nn.init.ones_(m.weight)
    return module


def run(
    module: nn.Module,
    inputs: Sequence[Tensor],
    dtype: torch.dtype | None,
    device: str,
    input_grads: bool = True,
) -> tuple[Tensor, list[Tensor], dict[str, Tensor]]:
    """Forward (under autocast when ``dtype``) and backward of ``sum(output * probe)``.

    Returns the output, the gradients of the floating-point inputs and the parameter gradients.
    The loss weighs every output element by a fixed pseudo-random probe so that no gradient is
    trivially uniform.
    """
    inputs = [
        x.detach().clone().requires_grad_(input_grads and x.is_floating_point()) for x in inputs
    ]
    # the same dropout masks in both runs
    with torch.random.fork_rng(devices=[torch.device(device)] if device == "cuda" else []):
        torch.manual_seed(0)
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = first_tensor(module(*inputs))
    generator = torch.Generator(device=out.device).manual_seed(0)
    probe = torch.randn(out.shape, generator=generator, device=out.device)
    (out.float() * probe).sum().backward()
    grads_in = [x.grad for x in inputs if x.requires_grad]
    param_grads = {name: p.grad for name, p in module.named_parameters() if p.grad is not None}
    return out.detach(), grads_in, param_grads


def autocast_errors(
    make: Callable[[], nn.Module],
    make_inputs: Callable[[], Sequence[Tensor]],
    dtype: torch.dtype,
    device: str,
    *,
    input_grads: bool = True,
) -> dict[str, float]:
    """Relative errors of an autocast run against float32 for the output and every gradient.

    Also checks what autocast promises: parameters and their gradients stay float32, and
    everything is finite. ``input_grads=False`` leaves the inputs' gradients out (a network's
    input is data; behind a max-pool its gradient lands on whichever pixel won, and near-ties
    are decided differently in the two precisions).
    """
    torch.manual_seed(0)
    module = make().to(device)
    low = copy.deepcopy(module)
    inputs = [x.to(device) for x in make_inputs()]
    ref_out, ref_in, ref_params = run(module, inputs, None, device, input_grads)
    out, grads_in, grads_params = run(low, inputs, dtype, device, input_grads)
    assert torch.isfinite(out.float()).all(), "non-finite output under autocast"
    assert set(grads_params) == set(ref_params), "autocast changed which parameters get gradients"
    errors = {"output": relative_error(out, ref_out)}
    for i, (g, r) in enumerate(zip(grads_in, ref_in, strict=True)):
        assert g is not None and torch.isfinite(g).all(), (
            f"input {i} gradient missing or non-finite"
        )
        errors[f"input{i}.grad"] = relative_error(g, r)
    params = dict(low.named_parameters())
    for name, g in grads_params.items():
        assert params[name].dtype == torch.float32 and g.dtype == torch.float32, (
            f"{name}: parameter {params[name].dtype}, gradient {g.dtype}; both must stay float32"
        )
        assert torch.isfinite(g).all(), f"{name}: non-finite gradient"
    if ref_params:
        names = list(ref_params)
        errors["parameters.grad"] = relative_error(
            torch.cat([grads_params[n].flatten() for n in names]),
            torch.cat([ref_params[n].flatten() for n in names]),
        )
        floor = 0.05 * max(float(ref_params[n].norm()) for n in names)
        for name in names:
            errors[f"{name}.grad"] = relative_error(grads_params[name], ref_params[name], floor)
    return errors
