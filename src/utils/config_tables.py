"""The README's config tables, generated from ``conf/``: ``python -m src.utils.config_tables``
prints them, ``--write`` puts them into README.md between their markers. A test fails when the
README and ``conf/`` disagree, so a new option cannot go undocumented."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
README = ROOT / "README.md"

# what each group is for (the options are read from the folder)
GROUPS = {
    "task": "the LightningModule (loss, metrics, optimiser, schedule); chosen by the data config",
    "model": "the network; the data config picks a default that fits it",
    "data": "the LightningDataModule; it picks the task and the default model",
    "trainer": "Lightning Trainer, device and strategy",
    "callbacks": "checkpoints (best + `last.ckpt`), LR monitor, progress bar, finite-loss guard, RNG state; `ema` adds weight averaging",
    "monitor": "the checkpointed metric of each task; chosen by the task",
    "logger": "combine with `logger=[csv,wandb]`",
    "paths": "where data lives and runs write",
    "hydra": "run directories; `hydra/launcher=slurm` submits through submitit",
    "recipe": "the paper's hyper-parameters for one `<data>_<model>` pairing, applied when the file exists",
    "experiment": "named variants (paper rows, ablations); see the table below",
    "debug": "fast_dev_run, overfit a few batches, a few batches for two epochs",
    "study": "the papers' claims that `python study.py` tests: two models at equal parameters, their learning-rate grids and seeds (not a `train.py` group)",
}  # fmt: skip
LONGEST = 160  # characters of a table's description before it is cut at a clause
BEGIN, END = "<!-- {name}:begin (generated: python -m src.utils.config_tables --write) -->", "<!-- {name}:end -->"


def options(group: str) -> list[str]:
    """The option names of ``conf/<group>/`` (nested folders as ``folder/name``)."""
    folder = CONF / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


def groups_table() -> str:
    on_disk = sorted(p.name for p in CONF.iterdir() if p.is_dir())
    if set(on_disk) != set(GROUPS):
        raise KeyError(f"conf/ groups {on_disk} differ from the described ones {sorted(GROUPS)}")
    rows = ["| group | options | what it is |", "|---|---|---|"]
    for group, what in GROUPS.items():
        rows.append(f"| `{group}/` | {', '.join(f'`{o}`' for o in options(group))} | {what} |")
    return "\n".join(rows)


def _defaults_override(data: str, group: str) -> str:
    """The option ``conf/data/<data>.yaml`` picks for ``group`` in its defaults list."""
    config = OmegaConf.load(CONF / "data" / f"{data}.yaml")
    for entry in config.get("defaults", []):
        for key, value in entry.items():
            if key.startswith(f"override /{group}"):
                return str(value)
    raise KeyError(f"conf/data/{data}.yaml does not pick a {group}")


def summary(path: Path) -> str:
    """The first sentence of a config file's leading comment (after ``# @package``), one line."""
    lines = path.read_text().splitlines()
    comments = [line[1:].strip() for line in lines if line.startswith("#") and "@package" not in line]
    header = []
    for line in lines:
        if not line.startswith("#"):
            break
        if "@package" not in line:
            header.append(line[1:].strip())
    text = " ".join(header or comments[:1])
    # a sentence ends at a full stop followed by a capital ("Ch. 3", "e.g. model" do not end one)
    first = re.split(r"(?<=[a-z0-9)\]]\.)\s+(?=[A-Z])", text)[0]
    if len(first) > LONGEST:  # keep the clause before the first ':' or ';' outside brackets
        depth = 0
        for index, char in enumerate(first):
            depth += (char in "([{") - (char in ")]}")
            if depth == 0 and char in ":;" and index >= 40:
                first = first[:index]
                break
    return first.rstrip(" :;,")


def data_table() -> str:
    rows = ["| `data=` | task | default `model=` | what it is |", "|---|---|---|---|"]
    for data in options("data"):
        first = summary(CONF / "data" / f"{data}.yaml")
        rows.append(
            f"| `{data}` | `{_defaults_override(data, 'task')}` | `{_defaults_override(data, 'model')}` | {first} |"
        )
    return "\n".join(rows)


def experiments_table() -> str:
    rows = ["| `experiment=` | what it is |", "|---|---|"]
    for name in options("experiment"):
        rows.append(f"| `{name}` | {summary(CONF / 'experiment' / f'{name}.yaml')} |")
    return "\n".join(rows)


TABLES = {"config-groups": groups_table, "data-configs": data_table, "experiments": experiments_table}


def render(text: str) -> str:
    """``text`` with every marked table replaced by its generated content."""
    for name, make in TABLES.items():
        begin, end = BEGIN.format(name=name), END.format(name=name)
        pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.DOTALL)
        if not pattern.search(text):
            raise KeyError(f"README.md lacks the markers of the {name} table: {begin} ... {end}")
        text = pattern.sub(lambda _: f"{begin}\n{make()}\n{end}", text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the tables in README.md")
    args = parser.parse_args()
    if args.write:
        README.write_text(render(README.read_text()))
    else:
        for name, make in TABLES.items():
            print(f"{name}:\n{make()}\n")


if __name__ == "__main__":
    main()
