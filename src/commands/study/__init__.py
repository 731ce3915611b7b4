"""The papers' claims, tested fairly: two models at equal parameters, each learning rate tuned.

    python study.py                    # every claim of conf/study/, then docs/claims.md
    python study.py delight_mt pru_lm  # some of them
    python study.py --report           # only re-write docs/claims.md from the runs there are
    python study.py pru_lm --multirun  # print the Hydra multirun commands of the runs due next

Each claim (``conf/study/<name>.yaml``) names two models, each a list of ``train.py`` overrides
(its experiment: its own recipe, sized to within 1% of the other's parameters). For each model:

1. a learning-rate grid (at least three values a factor of two apart) at seed 1; the value with
   the lowest validation loss wins, and while the winner sits at an edge of the grid the grid grows
   by one more factor of two on that side (at most ``--extend`` times);
2. the winning rate at the other seeds (three seeds in all);
3. at equal wall time: the model whose training was faster runs again at the three seeds, its
   run (``length_key``: epochs or updates) lengthened by the ratio of the two models' mean
   training times, so it gets the slower one's time.

Runs go ``--jobs`` at a time (default 2), each with ``--threads`` PyTorch threads (default 1), as
``train.py`` processes in ``<out>/runs/<the model's overrides>/<run>/`` (default ``logs/study``;
claims that compare the same model share its runs). A run whose ``metrics.json`` says finished is
never run again, so an interrupted study resumes where it stopped.
The report (``docs/claims.md`` and one curve plot per claim) gives per model the parameters, the
grid, test metric mean ± std over the seeds, validation loss, updates, training time and time per
update, and a verdict: **holds**, **does not hold** or **within noise** (the difference of the
means within two standard errors of the difference).

On a cluster, ``--multirun`` prints instead the ``python train.py -m`` commands of the runs that the
claim's next decision waits for (the grid, then the seeds, then the equal-time runs), writing into
the same folders; add a launcher (``hydra/launcher=submitit_slurm``), run them, and ask again.

This module is the command line; the claims are read by :mod:`src.commands.study.claims`, run by
:mod:`src.commands.study.runner`, weighed by :mod:`src.commands.study.stats` and written up by
:mod:`src.commands.study.report`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from src.commands.study.claims import ROOT, load_claims
from src.commands.study.report import write_report
from src.commands.study.runner import Study, due_runs, multirun_commands, subprocess_runner


def claims_epilog() -> str:
    """The claims of ``conf/study/`` with their titles, for ``--help``."""
    claims = load_claims()
    width = max(len(claim.name) for claim in claims)
    lines = [f"  {claim.name:<{width}}  {claim.title}" for claim in claims]
    return "claims (conf/study/<name>.yaml):\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=claims_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the epilog's lines as written
    )
    parser.add_argument(
        "claims", nargs="*", help="names of the claims to run (listed below); all of them when none"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "logs" / "study",
        help="the study's folder: each run of train.py in "
        "<out>/runs/<the model's overrides>/<run>/; a finished run there is never run again, "
        "so a study resumes where it stopped (default: %(default)s)",
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="train.py runs at a time (default: %(default)s)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="PyTorch threads per run (default: %(default)s)"
    )
    parser.add_argument(
        "--extend",
        type=int,
        default=2,
        help="how many times at most a learning-rate grid grows by a factor of two past its edge "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="run nothing: only write the report from the runs in --out",
    )
    parser.add_argument(
        "--multirun",
        action="store_true",
        help="run nothing: print the Hydra multirun commands (python train.py -m ...) of the runs "
        "due next, writing into --out (for a cluster launcher)",
    )
    parser.add_argument(
        "--doc",
        type=Path,
        default=ROOT / "docs" / "claims.md",
        help="the report written at the end: a table of every claim's verdict, a section per "
        "claim, and its curve plot claims_<name>.png beside it (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    claims = load_claims(args.claims)
    study = Study(args.out, subprocess_runner(args.threads), jobs=args.jobs, extend=args.extend)
    if args.multirun:
        for claim in claims:
            due = due_runs(args.out, claim, args.extend)
            print(
                f"# {claim.name}: "
                + (f"{len(due)} runs due" if due else "complete (python study.py --report)")
            )
            for command in multirun_commands(args.out, claim, due):
                print(command)
        return
    if not args.report:
        for claim in claims:
            start = time.perf_counter()
            study.run_claim(claim)
            print(f"{claim.name}: {(time.perf_counter() - start) / 60:.1f} min", flush=True)
    write_report(study, load_claims(), args.doc, "python study.py")
    print(f"wrote {args.doc}")
