"""The study's specs: the claims of ``conf/study/``, each the comparison of two models with their
``train.py`` overrides, learning-rate grids and seeds."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[3]
STUDY_CONF = ROOT / "conf" / "study"
SELECT_KEY = "val/loss"  # the learning rate is chosen on the validation loss, lower is better
FIRST_SEED = 1


@dataclass(frozen=True)
class ModelSpec:
    """One side of a claim: its name in the tables and its ``train.py`` overrides."""

    name: str
    overrides: tuple[str, ...]
    lrs: tuple[float, ...]
    length_key: str  # trainer.max_epochs or trainer.max_steps: what equal time lengthens
    length: int  # its value in the experiment

    def folder(self, out: Path) -> Path:
        """Where its runs live: named by its overrides, so claims that share a model share its
        runs (e.g. one DeLighT classifier against a Transformer and against its ablation)."""
        # a path Hydra's override grammar accepts ('=', '+' and ',' are its syntax)
        slug = re.sub(
            r"[^A-Za-z0-9_.-]", "_", "__".join(o.replace("=", "-") for o in self.overrides)
        )
        return out / "runs" / slug


@dataclass(frozen=True)
class Claim:
    """A claim of the papers and the comparison that tests it (``conf/study/<name>.yaml``)."""

    name: str
    title: str
    statement: str
    source: str
    metric: str  # the test metric reported, e.g. test/sacrebleu
    higher_is_better: bool
    kind: str  # better: A beats B | not_worse: A matches B (or beats it) | report: no direction
    models: tuple[ModelSpec, ModelSpec]
    seeds: tuple[int, ...]
    lr_key: str
    notes: str = ""  # Markdown under the verdict: e.g. what rules out an implementation error

    @property
    def a(self) -> ModelSpec:
        return self.models[0]

    @property
    def b(self) -> ModelSpec:
        return self.models[1]


def load_claim(path: Path) -> Claim:
    """A claim from its YAML; every missing or malformed field is named."""
    conf = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    missing = [
        key
        for key in ("title", "statement", "source", "metric", "higher_is_better", "kind", "models")
        if key not in conf
    ]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    if conf["kind"] not in ("better", "not_worse", "report"):
        raise ValueError(f"{path}: kind must be better, not_worse or report, got {conf['kind']!r}")
    models = []
    for spec in conf["models"]:
        lrs = tuple(sorted(float(lr) for lr in spec["lrs"]))
        if len(lrs) < 3:
            raise ValueError(
                f"{path}: model {spec['name']} needs at least 3 learning rates, got {lrs}"
            )
        models.append(
            ModelSpec(
                name=spec["name"],
                overrides=tuple(spec["overrides"]),
                lrs=lrs,
                length_key=spec["length_key"],
                length=int(spec["length"]),
            )
        )
    if len(models) != 2:
        raise ValueError(f"{path}: a claim compares two models, got {len(models)}")
    seeds = tuple(int(s) for s in conf.get("seeds", (1, 2, 3)))
    if seeds[0] != FIRST_SEED:
        raise ValueError(f"{path}: the seeds start with {FIRST_SEED} (the grid's), got {seeds}")
    return Claim(
        name=path.stem,
        title=conf["title"],
        statement=conf["statement"],
        source=conf["source"],
        metric=conf["metric"],
        higher_is_better=bool(conf["higher_is_better"]),
        kind=conf["kind"],
        models=(models[0], models[1]),
        seeds=seeds,
        lr_key=conf.get("lr_key", "task.optimizer.lr"),
        notes=str(conf.get("notes", "")).strip(),
    )


def load_claims(names: Sequence[str] | None = None, folder: Path = STUDY_CONF) -> list[Claim]:
    paths = sorted(folder.glob("*.yaml"))
    known = {p.stem: p for p in paths}
    if names:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(
                f"unknown claim(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}"
            )
        paths = [known[n] for n in names]
    return [load_claim(p) for p in paths]
