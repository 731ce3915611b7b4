"""Where each op's fast path is chosen: the rules every back-end follows (:mod:`.dispatch`), the
measurements (:mod:`.timing`), the choices kept on disk per machine (:mod:`.choices`) and the
``LIGHTNETS_*`` environment variables (:mod:`.environment`).

The ops import this package; it imports only PyTorch and :mod:`src.utils`.
"""

from src.kernels.dispatch import (
    IMPLS,
    Timer,
    autocast_dtype,
    autocast_known,
    autocast_off,
    autocast_operands,
    capture_for_export,
    check_impl,
    check_same_dtype,
    cuda_time,
    exporting,
    fastest,
    opaque_op,
    size_bucket,
    triton_available,
    use_triton,
)

__all__ = [
    "IMPLS",
    "Timer",
    "autocast_dtype",
    "autocast_known",
    "autocast_off",
    "autocast_operands",
    "capture_for_export",
    "check_impl",
    "check_same_dtype",
    "cuda_time",
    "exporting",
    "fastest",
    "opaque_op",
    "size_bucket",
    "triton_available",
    "use_triton",
]
