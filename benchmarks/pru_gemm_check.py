"""The C++ PRU recurrence's products checked on this machine, in one GEMM mode: forward and
backward at the probe's shapes against the PyTorch loop in float64
(:func:`src.kernels.pru_recurrence.check_gemm_mode`). The library runs the same check in a child
process once per machine and build (:func:`src.kernels.pru_recurrence.probed_gemm_mode`); this
runs it by hand, as a GPU visit does on each machine's processor. Exit status 0 when the mode
agrees; otherwise what went wrong, on stderr. A mode whose MKL routine faults kills the process
(SIGSEGV on visit 3's Intel Xeon for ``packed``).

    LIGHTNETS_PRU_GEMM=packed python benchmarks/pru_gemm_check.py --check packed [--threads 4]
"""

from __future__ import annotations

import argparse

import torch

from src.kernels.pru_recurrence import GEMM_MODES, check_gemm_mode_or_exit


def main() -> None:
    parser = argparse.ArgumentParser(description="check the C++ recurrence's GEMM mode here")
    parser.add_argument("--check", choices=GEMM_MODES, required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    check_gemm_mode_or_exit(args.check, args.threads)
    print(f"{args.check} products agree with the PyTorch loop")


if __name__ == "__main__":
    main()
