"""Parameters and MACs of a network: ``python complexity.py model=... [data=...] [model.x=...]``.

Builds the network exactly as training does (the data config only supplies the input shape and
number of classes; no data is read), counts one forward pass with ``src.utils.complexity`` and
prints a table, then one JSON object as the last line. Recurrent-memory language models (a
``mem_len`` attribute) are also counted with a full memory of ``mem_len`` cached states
(``macs_with_memory``, the training/evaluation steady state), and networks that define
``paper_flops`` report their paper's own FLOP convention next to the measurement. An SSD is also
counted at its other image size (300 and 512, as the model zoo lists both), each beside the
published figures of that configuration.
"""

from __future__ import annotations

import json
import sys

import hydra
from omegaconf import DictConfig

from src.build import check_config
from src.commands.complexity import report, table
from src.utils.errors import reported_in_one_line


@hydra.main(version_base="1.3", config_path="conf", config_name="complexity")
def main(cfg: DictConfig) -> None:
    with reported_in_one_line():
        check_config(cfg, "complexity")
        result = report(cfg)
    sys.stdout.write(table(result) + "\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
