"""Commit the choices ``impl="auto"`` measured on a GPU into the package's committed table.

A visit to a GPU (``benchmarks/gpu_visit.py``) keeps every choice the ops measured in its store
(``auto_choices.json`` in the visit's results: :mod:`src.kernels.choices`), filed under the GPU's
signature. This script merges the choices of one architecture's GPUs into
``src/kernels/committed/<arch>.json``, each entry with its source (the GPU, the PyTorch and Triton
versions, the visit), so that the next run on such a GPU takes them before timing anything: the
first training step of DiCENet timed every fused path per shape (59 s on an H200).

Entries already committed win unless ``--replace``: a choice measured once on a busy machine does
not overturn one measured alone. Only ops the code declares (:func:`src.kernels.declared`) and
their declared candidates are taken; anything else is reported and skipped.

    python benchmarks/commit_choices.py VISIT/auto_choices.json --arch sm_90 --visit "Visit 4"
        [--gpu H200] [--replace] [--dry-run]

It prints one line per op (entries added, kept, skipped) and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from src.kernels.choices import COMMITTED
from src.utils.files import write_json


def gpu_sections(store: dict, gpu: str | None) -> dict[str, dict]:
    """The store's sections measured on a GPU (their signature names Triton), those whose GPU name
    contains ``gpu`` when given: {signature: {op: {repr(key): choice}}}."""
    return {
        signature: ops
        for signature, ops in store.items()
        if " | triton " in signature and (gpu is None or gpu in signature.split(" | ")[0])
    }


def merge(
    table: dict[str, list[dict]],
    sections: dict[str, dict],
    known: dict[str, tuple[str, ...]],
    visit: str,
    replace: bool = False,
) -> dict[str, dict[str, int]]:
    """Add the sections' choices to ``table`` (a committed table, changed in place); the counts of
    entries added, replaced, kept (already committed) and skipped (an undeclared op or candidate)
    per op."""
    counts: dict[str, dict[str, int]] = {}
    for signature, ops in sections.items():
        gpu, *versions = signature.split(" | ")
        source = f"{visit}: measured by impl='auto' on an {gpu} ({', '.join(versions[:2])})"
        for op, choices in ops.items():
            count = counts.setdefault(op, {"added": 0, "replaced": 0, "kept": 0, "skipped": 0})
            entries = table.setdefault(op, []) if op in known else None
            for key, choice in sorted(choices.items()):
                if entries is None or choice not in known[op]:
                    count["skipped"] += 1
                    continue
                old = next((e for e in entries if e.get("key") == key), None)
                if old is None:
                    entries.append({"key": key, "choice": choice, "source": source})
                    count["added"] += 1
                elif replace and old["choice"] != choice:
                    old.update(choice=choice, source=source)
                    count["replaced"] += 1
                else:
                    count["kept"] += 1
            if entries == []:
                del table[op]
    return counts


def declared_candidates() -> dict[str, tuple[str, ...]]:
    """{op: its candidates} of the CUDA ops, every op module imported so that each declares."""
    import importlib
    import pkgutil

    import src.kernels
    import src.ops
    from src.kernels import declared

    # the ops' modules and their kernels' (the GLT's weight gradient is declared beside its kernel)
    for package in (src.ops, src.kernels):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            try:
                importlib.import_module(module.name)
            except ImportError:  # triton absent: the ops its kernels declare have no CUDA path
                pass
    return {op: names for (op, device), names in declared().items() if device == "cuda"}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", type=Path, help="a visit's auto_choices.json")
    parser.add_argument("--arch", required=True, help="the table to merge into, e.g. sm_90")
    parser.add_argument("--visit", required=True, help="where the choices come from (docs/gpu.md)")
    parser.add_argument("--gpu", help="only GPUs whose name contains this (e.g. H200)")
    parser.add_argument(
        "--replace", action="store_true", help="measured choices win over committed"
    )
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    parser.add_argument("--table-dir", type=Path, default=COMMITTED, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.store.is_file():
        parser.error(f"{args.store}: no such file (a visit writes auto_choices.json in its --out)")
    sections = gpu_sections(json.loads(args.store.read_text()), args.gpu)
    if not sections:
        parser.error(f"{args.store} holds no choices measured on a GPU"
                     + (f" named like {args.gpu!r}" if args.gpu else ""))  # fmt: skip
    path = args.table_dir / f"{args.arch}.json"
    table = json.loads(path.read_text()) if path.is_file() else {}
    counts = merge(table, sections, declared_candidates(), args.visit, args.replace)
    for op, count in sorted(counts.items()):
        print(f"{op:32s} " + ", ".join(f"{n} {what}" for what, n in count.items()))
    if not args.dry_run:
        write_json(path, table)
    summary = {"table": str(path), "written": not args.dry_run, "ops": counts}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
