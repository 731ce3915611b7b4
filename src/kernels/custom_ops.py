"""Differentiable custom ops: a fused kernel and its backward as one node each of a traced graph.

:func:`src.kernels.dispatch.opaque_op` registers a kernel as an opaque op that an autograd Function
around it calls, forward or backward. :func:`autograd_op` registers the differentiable op itself:
the kernel's forward with its fake function and, by ``torch.library.register_autograd``, its
backward rule. ``torch.compile(fullgraph=True)`` then records the op as one node of the forward
graph, and AOTAutograd the backward rule's ops (the backward kernel, an opaque op) in the backward
graph, without tracing a Function's Python body. Operands that decide the result, such as a
dropout mask's seed, are tensors drawn outside the op, so a traced graph draws them afresh on every
call (a Python number would be a constant of the graph).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
from torch.autograd.function import once_differentiable

from src.kernels.dispatch import exporting

F = TypeVar("F", bound=Callable[..., Any])


def autograd_op(
    name: str,
    schema: str,
    fake: Callable[..., Any],
    *,
    setup_context: Callable[[Any, tuple, Any], None],
    backward: Callable[..., tuple],
) -> Callable[[F], F]:
    """Register the decorated function (a fused kernel's forward) as the custom op ``name`` with
    ``fake`` for its outputs' metadata and an autograd rule: ``setup_context(ctx, inputs,
    output)`` keeps what the backward reads (``ctx.save_for_backward``, attributes), and
    ``backward(ctx, *grads)`` returns one gradient (or None) per input in schema order, calling
    the backward kernel as an :func:`~src.kernels.dispatch.opaque_op`. ``schema`` and ``fake``
    come from the op's contract (``src/kernels/<op>/contract.py``); the schema returns a Tensor or a
    tuple of them (an output the caller does not use, saved for the backward, is marked
    non-differentiable in ``setup_context``).

    The function returned calls the op while ``torch.compile`` traces, and eagerly (and under
    export, where the ops take their references before reaching a kernel) an autograd Function of
    the same three functions: eager calls skip the dispatcher round trip of a Python custom op,
    tens of us a call. The eager backward is once differentiable, as a kernel's is.
    """

    def register(fn: F) -> F:
        op = torch.library.custom_op(name, fn, mutates_args=(), schema=schema)
        op.register_fake(fake)
        op.register_autograd(backward, setup_context=setup_context)
        # "lightnets::hashed_dropout" -> HashedDropout: its nodes are HashedDropoutBackward
        title = "".join(word.title() for word in name.split("::")[-1].split("_"))
        function = type(
            title,
            (torch.autograd.Function,),
            {
                "forward": staticmethod(fn),
                "setup_context": staticmethod(functools.partial(_setup, setup_context)),
                "backward": staticmethod(
                    once_differentiable(functools.partial(_backward, backward))
                ),
            },
        )

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            if torch.compiler.is_compiling() and not exporting():
                return op(*args)
            return function.apply(*args)

        return cast(F, call)

    return register


def _setup(
    setup_context: Callable[[Any, tuple, Any], None], ctx: Any, inputs: tuple, output: Any
) -> None:
    """The eager Function's ``setup_context``: the op's, then which outputs get gradients. An output
    marked non-differentiable (statistics kept for the backward) gets None instead of a tensor of
    zeros, which autograd would otherwise launch a kernel for at every backward."""
    setup_context(ctx, inputs, output)
    outputs = output if isinstance(output, tuple) else (output,)
    fixed = {id(t) for t in getattr(ctx, "non_differentiable", None) or ()}
    ctx.output_meta = tuple(
        None if id(t) in fixed else (t.shape, t.dtype, t.device) for t in outputs
    )
    ctx.set_materialize_grads(False)


def _backward(backward: Callable[..., tuple], ctx: Any, *grads: Any) -> tuple:
    """The eager Function's backward: the op's rule, given zeros for a differentiable output the
    loss did not reach (as autograd would materialise them) and None for the others."""
    grads = tuple(
        torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if g is None and meta else g
        for g, meta in zip(grads, ctx.output_meta, strict=True)
    )
    return backward(ctx, *grads)
