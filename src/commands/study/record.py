"""The study's record: what the report reads of each finished run, kept in the repository.

A run's folder holds checkpoints and logs of tens of megabytes and lives in ``logs/`` (ignored by
git), so a fresh clone has none of the study's runs: the report could not be re-written, and
the study would start over (many CPU hours). The record keeps, for each finished run, the few
files the decisions and the report read (kilobytes), under the same relative path
(``<record>/runs/<the model's overrides>/<run>/``, as under the study's ``--out``):

- ``metrics.json``: the test metrics, parameters, updates and times;
- ``csv/version_*/metrics.csv``: the validation rows only (the curve and the best validation
  loss that choose the settings);
- ``test_outputs.json``: the per-example test results of the paired bootstrap;
- ``.hydra/config.yaml`` and ``.hydra/overrides.yaml``: the resolved recipe and the command.

:func:`keep` copies a finished run into the record; :func:`restore` copies the record's runs
back into the study's folder where that folder lacks them, so every decision and the report read
one folder as before.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

METRICS = "metrics.json"
PREPARE = "prepare"  # the folder of the study's data-preparing run (Study.prepare)
# copied whole; the CSV logs are filtered (_validation_rows)
# metrics.json last: a folder with it is complete (a copy cut short leaves no finished run)
# (test_outputs.json is bootstrap.TEST_OUTPUTS, not imported: that module loads the BLEU metric)
COPIED = ("test_outputs.json", ".hydra/config.yaml", ".hydra/overrides.yaml", METRICS)
CURVES = "csv/version_*/metrics.csv"


def finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run whose ``metrics.json`` says it finished."""
    path = run_dir / METRICS
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("status") == "finished"
    except json.JSONDecodeError:  # a run killed while writing it
        return False


def _validation_rows(path: Path) -> str:
    """The CSV log with only its rows and columns of validation (``val/...``, the step and the
    epoch): the training loss logged every few updates is most of the file and the report does
    not read it."""
    with path.open(newline="") as file:
        reader = csv.DictReader(file)
        fields = [
            f for f in reader.fieldnames or () if f in ("step", "epoch") or f.startswith("val")
        ]
        rows = [
            {f: row[f] for f in fields}
            for row in reader
            if any(row.get(f) for f in fields if f.startswith("val"))
        ]
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def keep(run_dir: Path, out: Path, record: Path) -> Path | None:
    """Copies the finished run ``run_dir`` (inside the study's folder ``out``) into the record;
    returns its folder there, or None when the run has not finished (nothing is copied)."""
    if not finished(run_dir):
        return None
    target = record / run_dir.relative_to(out)
    for source in sorted(run_dir.glob(CURVES)):
        destination = target / source.relative_to(run_dir)
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(_validation_rows(source))
    for name in COPIED:
        source = run_dir / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / name)
    return target


def keep_all(out: Path, record: Path) -> int:
    """Keeps every finished run of ``out`` missing from the record; returns how many."""
    kept = 0
    for path in sorted(out.glob(f"runs/**/{METRICS}")):
        run_dir = path.parent
        if run_dir.name == PREPARE:  # a one-batch run that only prepared the data
            continue
        if not finished(record / run_dir.relative_to(out)) and keep(run_dir, out, record):
            kept += 1
    return kept


def restore(record: Path, out: Path) -> int:
    """Copies the record's runs into ``out`` where ``out`` has no finished run at that path;
    returns how many (a run that finished in ``out`` is never overwritten)."""
    restored = 0
    for path in sorted(record.glob(f"runs/**/{METRICS}")):
        kept = path.parent
        run_dir = out / kept.relative_to(record)
        if finished(run_dir) or not finished(kept):
            continue
        files = sorted(p for p in kept.rglob("*") if p.is_file())
        for source in sorted(files, key=lambda p: p.name == METRICS):  # metrics.json last
            destination = run_dir / source.relative_to(kept)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)
        restored += 1
    return restored
