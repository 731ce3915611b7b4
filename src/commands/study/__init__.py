"""The papers' claims, tested fairly: two models at equal parameters, each one's settings tuned.

    python study.py                    # every claim of conf/study/, then docs/claims.md
    python study.py delight_mt pru_lm  # some of them
    python study.py --plan             # the budget first: runs and CPU hours, done and due
    python study.py --report           # only re-write docs/claims.md from the runs there are
    python study.py pru_lm --multirun  # print the Hydra multirun commands of the runs due next

Each claim (``conf/study/<name>.yaml``) names two models, each a list of ``train.py`` overrides
(its experiment: its own recipe, sized to within 1% of the other's parameters). For each model:

1. tuning at seed 1, on the lowest validation loss: a learning-rate grid (at least three values a
   factor of two apart), grown by one more factor of two while the winner sits at an edge (at most
   ``--extend`` times), crossed with the options of the model's first tuned stage (e.g. the
   warm-up); then each further stage (e.g. the dropout) tried at the best settings so far;
2. the chosen settings at the verdict's seeds, fresh ones (2, 3, 4): the tuning seed would favour
   its model. Where three seeds leave the verdict undecided, two more (5, 6);
3. at equal wall time: the model whose training was faster runs again at those seeds, lengthened
   by the ratio of the two models' mean training times (a model that stops at a plateau gets the
   updates it makes in the slower one's time, early stopping off).

The verdict (:mod:`src.commands.study.stats`): Welch's interval on the difference of the means,
against 0 (A beats B) or against the claim's stated margin (A no worse than B); Holm's correction
over the claims beside it; the paired bootstrap over the test sentences for BLEU and accuracy.

The claims go side by side; their runs go ``--jobs`` at a time in all (default 2), each with
``--threads`` PyTorch threads (default 1), as ``train.py`` processes in
``<out>/runs/<the model's overrides>/<run>/`` (default ``logs/study``; claims that compare the same
model share its runs, which go once). A run whose ``metrics.json`` says finished is
never run again, so an interrupted study resumes where it stopped.
Each finished run's metrics, validation curve, test outputs and recipe are also kept in
``--record`` (``docs/claims_runs`` for the default ``--out``: a few kilobytes a run, in the
repository), and copied back into ``--out`` before anything else: a fresh clone re-writes the
report and resumes the study without running again what has finished
(:mod:`src.commands.study.record`).
The report (``docs/claims.md`` and one curve plot per claim) gives per model the parameters, the
recipe, the tuning runs, test metric mean ± std over the seeds, validation loss, updates, training
time and time per update, the intervals, and a verdict: **holds**, **does not hold** or
**undecided**.

On a cluster, ``--multirun`` prints instead the ``python train.py -m`` commands of the runs that the
claim's next decision waits for (the grid, then the seeds, then the equal-time runs), writing into
the same folders; add a launcher (``hydra/launcher=submitit_slurm``), run them, and ask again.

This module is the command line; the claims are read by :mod:`src.commands.study.claims`, run by
:mod:`src.commands.study.runner`, weighed by :mod:`src.commands.study.stats` and written up by
:mod:`src.commands.study.report`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from src.commands.study.claims import ROOT, load_claims
from src.commands.study.plan import plan
from src.commands.study.record import keep_all, restore
from src.commands.study.report import write_report
from src.commands.study.runner import (
    Study,
    due_runs,
    multirun_commands,
    shown,
    subprocess_runner,
)

DEFAULT_OUT = ROOT / "logs" / "study"
DEFAULT_RECORD = ROOT / "docs" / "claims_runs"


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
        default=DEFAULT_OUT,
        help="the study's folder: each run of train.py in "
        "<out>/runs/<the model's overrides>/<run>/; a finished run there is never run again, "
        "so a study resumes where it stopped (default: %(default)s)",
    )
    parser.add_argument(
        "--record",
        type=Path,
        default=None,
        help="the runs kept in the repository: each finished run's metrics, validation curve, test "
        "outputs and recipe, copied back into --out first, so that a fresh clone resumes the "
        "study and re-writes the report (default: docs/claims_runs with the default --out, "
        "none with another)",
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
        "--no-extra-seeds",
        action="store_true",
        help="never run the extra seeds (5, 6) of a verdict three seeds leave undecided (a "
        "smaller budget)",
    )
    parser.add_argument(
        "--plan",
        action="store_true",
        help="run nothing: print each claim's runs from scratch (least and most), a run's "
        "minutes, the CPU hours in all, and what is finished and due next",
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
    if args.record is None and args.out.resolve() == DEFAULT_OUT.resolve():
        args.record = DEFAULT_RECORD
    claims = load_claims(args.claims)
    extra = not args.no_extra_seeds
    study = Study(
        args.out,
        subprocess_runner(args.threads),
        jobs=args.jobs,
        extend=args.extend,
        extra_seeds=extra,
        record=args.record,
    )
    if args.record is not None:
        restored = restore(args.record, args.out)
        kept = keep_all(args.out, args.record)  # runs that finished before they were kept
        if restored or kept:
            print(f"{restored} runs restored from {shown(args.record)}, {kept} kept there")
    if args.plan:
        print(plan(args.out, claims, args.extend, extra, args.jobs))
        return
    if args.multirun:
        for claim in claims:
            due = due_runs(args.out, claim, args.extend, extra)
            print(
                f"# {claim.name}: "
                + (f"{len(due)} runs due" if due else "complete (python study.py --report)")
            )
            for command in multirun_commands(args.out, claim, due):
                print(command)
        return
    if not args.report:
        study.run_claims(claims)
    write_report(study, load_claims(), args.doc, "python study.py")
    print(f"wrote {args.doc}")
