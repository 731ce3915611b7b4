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
``train.py`` processes in ``<out>/runs/<the model's overrides>/<run>/`` (default ``logs/study``; claims
that compare the same model share its runs). A run whose
``metrics.json`` says finished is never run again, so an interrupted study resumes where it stopped.
The report (``docs/claims.md`` and one curve plot per claim) gives per model the parameters, the
grid, test metric mean ± std over the seeds, validation loss, updates, training time and time per
update, and a verdict: **holds**, **does not hold** or **within noise** (the difference of the
means within two standard errors of the difference).

On a cluster, ``--multirun`` prints instead the ``python train.py -m`` commands of the runs that the
claim's next decision waits for (the grid, then the seeds, then the equal-time runs), writing into
the same folders; add a launcher (``hydra/launcher=submitit_slurm``), run them, and ask again.
"""

from src.commands.study import main

if __name__ == "__main__":
    main()
