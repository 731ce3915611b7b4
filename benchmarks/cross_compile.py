"""Cross-compiling the Triton kernels for a GPU on a machine without one.

The kernel tests run in Triton's interpreter (``TRITON_INTERPRET=1``), which executes a kernel with
NumPy and accepts what a GPU build rejects: a ``tl.dot`` of a bfloat16 and a float32 block, a
dtype mismatch in a ``tl.where``, more shared memory than an SM has. Here the launches an op
makes are recorded in the interpreter, configured as on the GPU
(:func:`src.kernels.triton.launch.gpu_launch`: its tile sizes, grid splits and 16-bit dot operands)
and not run. Each is then compiled by Triton for the GPU's architecture down to a cubin (the ptxas
that Triton ships), in a child process without the interpreter and specialised exactly as Triton
specialises that launch (:meth:`triton.JITFunction.warmup` against a stand-in driver), and its
resources are read from the cubin with Triton's cuobjdump: registers per thread, spilled
(local) memory, shared memory, and the occupancy they allow. Neither a GPU nor a driver is used.

    with recorded_launches(H100) as launches:
        ...  # call the ops with impl="triton" on CPU tensors
    for build in cross_compile(launches, H100):
        print(build.kernel, build.error or build.registers)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from src.kernels.triton.launch import LaunchTarget, launches_for

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Gpu:
    """A CUDA GPU's per-SM limits that bound a kernel's occupancy (CUDA C Programming Guide,
    "Technical Specifications per Compute Capability")."""

    name: str
    target: LaunchTarget
    shared_per_sm: int  # bytes
    shared_per_block: int  # the most one block may ask for (opt-in), bytes
    registers_per_sm: int = 65536
    warps_per_sm: int = 64
    blocks_per_sm: int = 32
    shared_reserved_per_block: int = 1024  # taken by the system for every resident block


A100 = Gpu("A100", LaunchTarget(arch=80, multi_processor_count=108), 167936, 166912)
H100 = Gpu("H100", LaunchTarget(arch=90, multi_processor_count=132), 233472, 232448)
GPUS = {gpu.name: gpu for gpu in (A100, H100)}


@dataclass(frozen=True)
class Launch:
    """One recorded kernel launch: the kernel as ``module:function``, its positional arguments
    (a tensor as ``{"tensor": dtype, "aligned": 16-byte aligned}``), its keyword arguments (the
    ``tl.constexpr`` ones) and its grid."""

    kernel: str
    args: tuple[Any, ...]
    constants: tuple[tuple[str, Any], ...]
    grid: tuple[int, ...]

    def to_json(self) -> str:
        return json.dumps(
            {"kernel": self.kernel, "args": self.args, "constants": dict(self.constants),
             "grid": self.grid}
        )  # fmt: skip


@dataclass(frozen=True)
class Build:
    """What compiling one launch for a GPU gave: the resources, or the error."""

    kernel: str
    gpu: str
    constants: dict[str, Any]
    dtypes: tuple[str, ...]  # of the pointer arguments, in order
    programs: int  # of the launch's grid
    error: str | None = None
    num_warps: int = 0
    registers: int = 0  # per thread
    spill_bytes: int = 0  # local memory per thread: spilled registers and stack arrays
    shared_bytes: int = 0  # per block, static and dynamic
    occupancy: float = 0.0  # resident warps / the SM's most, as registers and shared memory allow

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[1]


def _encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).removeprefix("torch."), "aligned": _aligned(value)}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a launch argument of type {type(value).__name__} cannot be recorded")


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0


@contextlib.contextmanager
def recorded_launches(gpu: Gpu) -> Iterator[list[Launch]]:
    """Within the context, every Triton launch is configured for ``gpu`` and appended to the list
    given, and none runs (outputs stay uninitialised). Needs the interpreter: the ops are called
    on CPU tensors with ``impl="triton"``."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "recording launches needs Triton's interpreter: set TRITON_INTERPRET=1 before the "
            "kernels are imported"
        )
    from triton.runtime.interpreter import InterpretedFunction

    launches: list[Launch] = []

    def record(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        fn = self.fn
        launches.append(
            Launch(
                kernel=f"{fn.__module__}:{fn.__name__}",
                args=tuple(_encode(a) for a in args),
                constants=tuple((k, _encode(v)) for k, v in kwargs.items()),
                grid=tuple(int(g) for g in grid),
            )
        )

    run = InterpretedFunction.run
    InterpretedFunction.run = record
    try:
        with launches_for(gpu.target):
            yield launches
    finally:
        InterpretedFunction.run = run


def train_and_infer(
    net: torch.nn.Module, forward: Callable[[torch.nn.Module], torch.Tensor]
) -> None:
    """The launches of a step to record: ``forward(net)`` in training with a backward from its
    sum, then in inference without autograd."""
    net.train()
    forward(net).float().sum().backward()
    net.eval()
    with torch.no_grad():
        forward(net)


def toolchain_missing() -> str | None:
    """Why kernels cannot be cross-compiled here (Triton's bundled ptxas or cuobjdump absent),
    or None."""
    try:
        import triton
    except ImportError:
        return "triton is not installed"
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for tool in ("ptxas", "cuobjdump"):
        if not os.access(tools / tool, os.X_OK):
            return f"Triton's {tool} is not at {tools / tool}"
    return None


def cross_compile(launches: Sequence[Launch], gpu: Gpu, *, timeout: float = 900) -> list[Build]:
    """Compile each distinct launch for ``gpu`` in a child process without the interpreter; a
    build that fails reports its error instead of raising."""
    unique = list(dict.fromkeys(launch.to_json() for launch in launches))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cross_compile", "--gpu", gpu.name],
        input="\n".join(unique), capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=timeout, check=False,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"the cross-compiling process failed:\n{done.stderr[-3000:]}")
    builds = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return [Build(**{**b, "dtypes": tuple(b["dtypes"])}) for b in builds]


# ---- the child process: no interpreter, a stand-in driver for the target ----


class _Target:
    """The part of a Triton driver that compiling (``warmup``) asks: the target, a device, a
    stream."""

    def __init__(self, arch: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


def _decode(value: Any) -> Any:
    from triton.runtime.jit import MockTensor

    if isinstance(value, dict) and "tensor" in value:
        pointer = MockTensor(getattr(torch, value["tensor"]))
        if not value["aligned"]:  # Triton specialises 16-byte aligned pointers
            pointer.data_ptr = lambda: 8
        return pointer
    return value


def _resources(cubin: bytes, name: str) -> dict[str, int]:
    """REG, STACK, SHARED, LOCAL... of function ``name`` in a cubin, by cuobjdump."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run(
            [str(tool), "--dump-resource-usage", file.name],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    section = text.split(f"Function {name}:", 1)[1]
    return {key: int(value) for key, value in re.findall(r"(\w+):(\d+)", section.splitlines()[1])}


def occupancy(gpu: Gpu, num_warps: int, registers: int, shared: int) -> float:
    """Resident warps per SM over the SM's most, as registers (allocated per warp in units of 256)
    and shared memory allow."""
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_registers = gpu.registers_per_sm // per_warp // num_warps
    by_shared = gpu.shared_per_sm // (shared + gpu.shared_reserved_per_block)
    blocks = min(gpu.blocks_per_sm, gpu.warps_per_sm // num_warps, by_registers, by_shared)
    return blocks * num_warps / gpu.warps_per_sm


def _build(launch: dict, gpu: Gpu) -> Build:
    module, name = launch["kernel"].split(":")
    args = [_decode(a) for a in launch["args"]]
    constants = {k: _decode(v) for k, v in launch["constants"].items()}
    base = {
        "kernel": launch["kernel"], "gpu": gpu.name, "constants": launch["constants"],
        "dtypes": tuple(
            a["tensor"] for a in launch["args"] if isinstance(a, dict) and "tensor" in a
        ),
        "programs": math.prod(launch["grid"]),
    }  # fmt: skip
    try:
        kernel = getattr(importlib.import_module(module), name)
        compiled = kernel.warmup(*args, grid=tuple(launch["grid"]), **constants)
    except Exception as error:  # reported in the build: one failing kernel must not hide the rest
        message = str(error).strip().splitlines()
        return Build(**base, error=f"{type(error).__name__}: {' '.join(message[-3:])[:500]}")
    used = _resources(compiled.asm["cubin"], compiled.metadata.name)
    shared = used.get("SHARED", 0) + compiled.metadata.shared
    warps = compiled.metadata.num_warps
    return Build(
        **base, num_warps=warps, registers=used["REG"], spill_bytes=used.get("LOCAL", 0),
        shared_bytes=shared, occupancy=occupancy(gpu, warps, used["REG"], shared),
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    """The child: launches as JSON lines on stdin, builds as JSON lines on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", choices=sorted(GPUS), default="H100")
    gpu = GPUS[parser.parse_args(argv).gpu]
    from triton.runtime.driver import driver

    driver.set_active(_Target(gpu.target.arch))
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(asdict(_build(json.loads(line), gpu))), flush=True)


if __name__ == "__main__":
    main()
