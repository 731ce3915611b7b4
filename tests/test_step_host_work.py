"""After its warm-up steps, a text system's training step does nothing on the host that a replayed
CUDA graph would skip: no measurement of ``impl="auto"``'s candidates (the first steps made them;
:func:`src.kernels.timings` counts them), and no random number drawn for the host, such as a
dropout seed read back (``.item()``) and handed to a kernel as a number, which a graph would bake
in: every seed and mask is a tensor the step's ops draw.

Each system runs eagerly, as its first steps run before graphs are captured, with the CPU's paths
measured (``LIGHTNETS_CPU_KERNELS`` unset) and no choice kept on disk, so the warm-up measures
what it chooses. Two warm-up passes: a Transformer-XL's first step has no memory yet, its second
attends over one (another shape). The host reads of the eager path itself (fairseq's check for
padding, the adaptive softmax's per-band row counts) are not counted here: traced, those paths
read nothing (``tests/test_graphed_training.py`` checks the graphs)."""

from __future__ import annotations

import collections
import weakref

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from src.kernels import forget, timings
from tests.test_graphed_training import SYSTEMS, build

RANDOM = frozenset({"randint", "random_", "random", "rand", "randn", "bernoulli", "bernoulli_",
                    "uniform_", "normal_", "randperm", "multinomial"})  # fmt: skip


class HostDraws(TorchDispatchMode):
    """Counts random numbers read on the host: a random op's output read back by
    ``aten._local_scalar_dense`` (``.item()``, ``int()``), or drawn as a 0-dim tensor (a number in
    all but name). Draws are remembered by weak reference, not by ``id`` alone: a freed draw's id
    is reused by later tensors, which would count their reads as draws."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.drawn: dict[int, weakref.ref[Tensor]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if name in RANDOM:
            for t in tree_leaves(out):
                if isinstance(t, Tensor):
                    self.drawn[id(t)] = weakref.ref(t)
                    if t.dim() == 0:
                        self.counts[f"0-dim {name}"] += 1
        elif name == "_local_scalar_dense" and self._drawn(args[0]):
            self.counts["random number read on the host"] += 1
        return out

    def _drawn(self, t: Tensor) -> bool:
        ref = self.drawn.get(id(t))
        return ref is not None and ref() is t


@pytest.fixture
def measured_choices(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("LIGHTNETS_CPU_KERNELS", raising=False)
    monkeypatch.setenv("LIGHTNETS_CHOICES", "0")
    forget()
    yield
    forget()


@pytest.mark.parametrize("demo", list(SYSTEMS))
def test_after_warm_up_steps_nothing_is_timed_or_drawn_on_the_host(
    demo: str, measured_choices: None
) -> None:
    system = SYSTEMS[demo]
    task = build(system)
    task.train()
    task.on_train_epoch_start()
    g = torch.Generator().manual_seed(1)

    def steps() -> None:
        for shape in system.shapes:
            task.training_step(system.batch(shape, g, system.vocab), 0).backward()

    steps()
    steps()
    timed = timings()
    draws = HostDraws()
    with draws:
        steps()
        steps()
    assert timings() == timed, f"{timings() - timed} measurements after the warm-up"
    assert dict(draws.counts) == {}, f"host draws in a training step: {dict(draws.counts)}"
    # the dropout masks were drawn on the device: the mode saw the draws it checks
    assert draws.drawn


def test_a_seed_read_on_the_host_is_counted() -> None:
    draws = HostDraws()
    with draws:
        seed = int(torch.randint(2**31, (1,)))
        torch.rand(3, generator=torch.Generator().manual_seed(seed))
    assert draws.counts["random number read on the host"] == 1
