"""The configuration reference ``docs/config.md``, generated from ``conf/``.

``python -m src.utils.config_tables`` prints the page, ``--write`` writes it. Every entry point's
keys, every group and every option appear with the comment their YAML file carries, so a new option
cannot go undocumented: ``tests/test_config_docs.py`` fails when the page and ``conf/`` disagree.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from omegaconf import OmegaConf

from src.utils.config_checks import MODEL_TASKS

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
CONFIG_DOC = ROOT / "docs" / "config.md"
COMMAND = "python -m src.utils.config_tables --write"

# what each group is for (the options are read from the folder)
GROUPS = {
    "task": "the LightningModule (loss, metrics, optimiser, schedule); chosen by the data config",
    "model": "the network; the data config picks a default that fits it",
    "data": "the LightningDataModule; it picks the task and the default model",
    "trainer": "Lightning Trainer, device and strategy",
    "callbacks": (
        "checkpoints (best + `last.ckpt`), LR monitor, progress bar, finite-loss guard, RNG state; "
        "`ema` adds weight averaging; `+callbacks/early_stopping=default` adds early stopping on "
        "val/loss to any of them"
    ),
    "monitor": "the checkpointed metric of each task; chosen by the task",
    "logger": "combine with `logger=[csv,wandb]`",
    "paths": "where data lives and runs write",
    "hydra": "run directories; `hydra/launcher=slurm` submits through submitit",
    "recipe": (
        "the paper's hyper-parameters for one `<data>_<model>` pairing, applied when the file "
        "exists"
    ),
    "experiment": "named variants (paper rows, ablations, demos), one folder per system",
    "debug": "fast_dev_run, overfit a few batches, a few batches for two epochs",
    "study": (
        "the papers' claims that `python study.py` tests: two models at equal parameters, their "
        "learning-rate grids and seeds (not a `train.py` group)"
    ),
}  # fmt: skip
# the root scripts that are Hydra apps, by their primary config
ENTRY_POINTS = {
    "train": "train.py",
    "eval": "eval.py",
    "predict": "predict.py",
    "generate": "generate.py",
    "translate": "translate.py",
    "complexity": "complexity.py",
    "export": "export.py",
}
# top-level keys of a primary config that are not described key by key
SKIPPED_KEYS = frozenset({"defaults", "hydra"})
# what the keys every primary config has do, where the YAML leaves them without a comment
COMMON_KEYS = {
    "task_name": (
        "names the run folder: <paths.log_dir>/<task_name>/runs/<time> (conf/hydra/default.yaml)"
    ),
    "seed": "the random seed of the run",
}

INTRO = f"""# Configuration reference

Generated from `conf/` by `{COMMAND}`; `tests/test_config_docs.py` fails when this page and
`conf/` disagree. Edit the comments in the YAML files, then regenerate: never this page.

Each entry point composes its primary config (`conf/<name>.yaml`) with the groups below, in the
order of its defaults list, the command line last (`group=option`, `key=value`, `+key=value` to
add a key, `~key` to delete one; `-m` sweeps comma lists). The data config picks its task
(`override /task@_global_.task`), the task picks the checkpointed metric (`monitor/`), the data
also picks a default model that fits it, and `recipe/<data>_<model>.yaml` adds the paper's
hyper-parameters for that pairing when the file exists. A model that cannot serve the data's task,
a key nobody reads and a key its constructor does not take stop the run before anything is built,
in one line ([training.md](training.md#mistakes-stop-in-one-line)). `python train.py --cfg job
model=espnetv2` prints the composed config without running it.
"""


def options(group: str) -> list[str]:
    """The option names of ``conf/<group>/`` (nested folders as ``folder/name``)."""
    folder = CONF / group
    return sorted(str(p.relative_to(folder).with_suffix("")) for p in folder.rglob("*.yaml"))


def cell(text: str) -> str:
    """``text`` on one line, safe inside a Markdown table cell."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text.replace("<", "&lt;").replace(">", "&gt;")


def header_comment(path: Path) -> str:
    """The leading comment block of a YAML file (without ``# @package``), on one line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            lines.append(line[1:].strip())
    return " ".join(line for line in lines if line)


def summary(path: Path) -> str:
    """The leading comment of a config file, or its first comment when it has none at the top."""
    text = header_comment(path)
    if text:
        return text
    comments = [
        line.strip()[1:].strip()
        for line in path.read_text().splitlines()
        if line.strip().startswith("#")
    ]
    return comments[0] if comments else "(no comment in the file)"


def _defaults_override(data: str, group: str) -> str:
    """The option ``conf/data/<data>.yaml`` picks for ``group`` in its defaults list."""
    config = OmegaConf.load(CONF / "data" / f"{data}.yaml")
    for entry in config.get("defaults", []):
        for key, value in entry.items():
            if key.startswith(f"override /{group}"):
                return str(value)
    raise KeyError(f"conf/data/{data}.yaml does not pick a {group}")


KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<value>.*)$")


def _split_inline_comment(value: str) -> tuple[str, str]:
    """(value, inline comment) of the text after a key's colon; a ``#`` inside quotes is kept."""
    quote = None
    for index, char in enumerate(value):
        if char in "'\"":
            quote = None if quote == char else (quote or char)
        elif char == "#" and quote is None and (index == 0 or value[index - 1].isspace()):
            return value[:index].strip(), value[index + 1 :].strip()
    return value.strip(), ""


def primary_keys(path: Path) -> list[tuple[str, str, str]]:
    """(dotted key, default as written, comment) of a primary config's keys, one level of nesting
    below the top (``compile.mode``); the comment is the block right above a key plus its inline
    comment."""
    rows: list[tuple[str, str, str]] = []
    parents: list[str] = []  # the enclosing top-level key, when the line is nested in one
    above: list[str] = []
    skipping = False
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            above = []
            continue
        if stripped.startswith("#"):
            above.append(stripped[1:].strip())
            continue
        match = KEY_LINE.match(line)
        if match is None:  # a list item or a deeper level
            above = []
            continue
        indent = len(match["indent"])
        value, inline = _split_inline_comment(match["value"])
        comment = " ".join(part for part in [*above, inline] if part)
        above = []
        if indent == 0:
            skipping = match["key"] in SKIPPED_KEYS
            parents = [match["key"]]
            if skipping:
                continue
            if value:
                rows.append((match["key"], value, comment))
            elif comment:
                rows.append((match["key"], "", comment))
        elif indent == 2 and parents and not skipping:
            rows.append((f"{parents[0]}.{match['key']}", value, comment))
    return rows


def primary_table(name: str) -> str:
    rows = ["| key | default | what it is |", "|---|---|---|"]
    for key, value, comment in primary_keys(CONF / f"{name}.yaml"):
        comment = comment or COMMON_KEYS.get(key, "")
        shown = f"`{value}`".replace("|", "\\|") if value else ""
        rows.append(f"| `{key}` | {shown} | {cell(comment)} |")
    return "\n".join(rows)


def entry_points_section() -> str:
    on_disk = sorted(p.stem for p in CONF.glob("*.yaml"))
    if set(on_disk) != set(ENTRY_POINTS):
        raise KeyError(
            f"conf/*.yaml {on_disk} differ from the described entry points {sorted(ENTRY_POINTS)}"
        )
    parts = ["## Entry points", "", "| command | primary config | what it is |", "|---|---|---|"]
    for name, script in ENTRY_POINTS.items():
        parts.append(
            f"| `python {script}` | `conf/{name}.yaml` "
            f"| {cell(header_comment(CONF / f'{name}.yaml'))} |"
        )
    for name, script in ENTRY_POINTS.items():
        parts += ["", f"### `conf/{name}.yaml` (`python {script}`)", "", primary_table(name)]
    return "\n".join(parts)


def groups_table() -> str:
    on_disk = sorted(p.name for p in CONF.iterdir() if p.is_dir())
    if set(on_disk) != set(GROUPS):
        raise KeyError(f"conf/ groups {on_disk} differ from the described ones {sorted(GROUPS)}")
    rows = ["| group | options | what it is |", "|---|---|---|"]
    for group, what in GROUPS.items():
        rows.append(f"| [`{group}/`](#{group}) | {len(options(group))} | {what} |")
    return "\n".join(rows)


def data_table() -> str:
    rows = ["| `data=` | task | default `model=` | what it is |", "|---|---|---|---|"]
    for data in options("data"):
        rows.append(
            f"| `{data}` | `{_defaults_override(data, 'task')}` "
            f"| `{_defaults_override(data, 'model')}` "
            f"| {cell(summary(CONF / 'data' / f'{data}.yaml'))} |"
        )
    return "\n".join(rows)


def model_table() -> str:
    rows = ["| `model=` | serves the tasks | what it is |", "|---|---|---|"]
    for model in options("model"):
        tasks = ", ".join(f"`{task}`" for task in sorted(MODEL_TASKS.get(model, ())))
        rows.append(f"| `{model}` | {tasks} | {cell(summary(CONF / 'model' / f'{model}.yaml'))} |")
    return "\n".join(rows)


def monitor_table() -> str:
    rows = ["| `monitor/` (the task) | metric | mode | what it is |", "|---|---|---|---|"]
    for name in options("monitor"):
        checkpoint = OmegaConf.load(CONF / "monitor" / f"{name}.yaml").callbacks.model_checkpoint
        rows.append(
            f"| `{name}` | `{checkpoint.monitor}` | {checkpoint.mode} "
            f"| {cell(summary(CONF / 'monitor' / f'{name}.yaml'))} |"
        )
    return "\n".join(rows)


def _pairing(recipe: str) -> tuple[str, str]:
    """(data, model) of a recipe named ``<data>_<model>``."""
    for data in options("data"):
        model = recipe[len(data) + 1 :]
        if recipe.startswith(f"{data}_") and model in options("model"):
            return data, model
    raise KeyError(
        f"conf/recipe/{recipe}.yaml is not named <data>_<model> after a data and a model option"
    )


def recipe_table() -> str:
    rows = ["| `recipe/` | data | model | what it is |", "|---|---|---|---|"]
    for recipe in options("recipe"):
        data, model = _pairing(recipe)
        rows.append(
            f"| `{recipe}` | `{data}` | `{model}` "
            f"| {cell(summary(CONF / 'recipe' / f'{recipe}.yaml'))} |"
        )
    return "\n".join(rows)


def option_table(group: str) -> str:
    rows = [f"| `{group}=` | what it is |", "|---|---|"]
    for name in options(group):
        rows.append(f"| `{name}` | {cell(summary(CONF / group / f'{name}.yaml'))} |")
    return "\n".join(rows)


TABLES = {
    "data": data_table,
    "model": model_table,
    "monitor": monitor_table,
    "recipe": recipe_table,
}


def render() -> str:
    """The whole of ``docs/config.md``."""
    parts = [INTRO, entry_points_section(), "", "## Groups", "", groups_table()]
    for group, what in GROUPS.items():
        table = TABLES.get(group, lambda g=group: option_table(g))()
        parts += ["", f"### `{group}/`", "", f"{what[0].upper()}{what[1:]}.", "", table]
    return "\n".join(parts) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write {CONFIG_DOC.relative_to(ROOT)}"
    )
    args = parser.parse_args()
    if args.write:
        CONFIG_DOC.write_text(render())
    else:
        print(render(), end="")


if __name__ == "__main__":
    main()
