"""Tables and curves of the DeLighT Scale x Shift sentiment study from its runs' directories.

``python sentiment_study.py RUN_DIR [RUN_DIR ...] [--out docs]`` finds every finished run under
the given folders (``metrics.json`` beside ``.hydra/config.yaml``, as ``train.py`` writes them,
e.g. the multirun of ``sweeps/delight_sentiment_scale_shift.yaml``), names each by its network
and flags (the student report's names: DeLighT Scale+Shift, Scale, Shift, DeLighT, Transformer),
and prints, in Markdown:

- the report's two tables, parameters and execution time (training + test wall time, mean over
  seeds), with the report's numbers beside;
- test accuracy and macro F1, mean +- sample standard deviation over seeds.

With ``--out`` it also writes ``<out>/delight_sentiment_accuracy.png``: the test accuracy after
each epoch (``test_epoch/acc``, logged when ``data.test_each_epoch`` is on), mean over seeds with
a band of +- one standard deviation.
"""

from src.commands.sentiment_study import main

if __name__ == "__main__":
    main()
