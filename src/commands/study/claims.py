"""The study's specs: the claims of ``conf/study/``, each the comparison of two models with their
``train.py`` overrides, their tuning grids (the learning rate, and stages of other settings such
as the warm-up or the dropout) and the seeds of the verdict."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[3]
STUDY_CONF = ROOT / "conf" / "study"
SELECT_KEY = "val/loss"  # the settings are chosen on the validation loss, lower is better
FIRST_SEED = 1  # the tuning runs' seed; the verdict's seeds are fresh ones
VERDICT_SEEDS = (2, 3, 4)
EXTRA_SEEDS = (5, 6)  # run where three seeds leave the verdict undecided


@dataclass(frozen=True)
class TuneStage:
    """One tuned setting of a model: named options, each a list of ``train.py`` overrides (an
    empty list: the experiment's own value). The first stage is crossed with the learning-rate
    grid; each later one is tried at the best settings found before it."""

    name: str
    options: tuple[tuple[str, tuple[str, ...]], ...]

    def overrides(self, option: str) -> tuple[str, ...]:
        return dict(self.options)[option]


@dataclass(frozen=True)
class ModelSpec:
    """One side of a claim: its name in the tables and its ``train.py`` overrides."""

    name: str
    overrides: tuple[str, ...]
    lrs: tuple[float, ...]
    length_key: str  # trainer.max_epochs or trainer.max_steps: what equal time lengthens
    length: int  # its value in the experiment (the cap, when the run stops early)
    tune: tuple[TuneStage, ...] = ()
    # the run stops at a plateau of the validation loss (its overrides add early stopping); the
    # equal-time run then gets a number of updates, with ``equal_time_overrides`` (early stopping
    # off) added, rather than a multiple of ``length``
    early_stopping: bool = False
    equal_time_overrides: tuple[str, ...] = ()
    # the key the equal-time run's length is given in (default: ``length_key``): a number of
    # updates (trainer.max_steps) where one unit of ``length_key`` is too coarse, e.g. runs of
    # one epoch, where a time ratio of 1.14 would round to two epochs
    equal_time_key: str = ""
    estimate_minutes: float = 0.0  # a run's wall minutes measured once, for --plan

    @property
    def equal_key(self) -> str:
        """The key of the equal-time run's length."""
        return self.equal_time_key or self.length_key

    @property
    def equal_in_updates(self) -> bool:
        """Whether the equal-time run is given a number of updates rather than a multiple of
        ``length``: the models that stop early, and those whose ``equal_time_key`` says so."""
        return self.early_stopping or self.equal_key != self.length_key

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
    seeds: tuple[int, ...]  # the verdict's seeds, none of them the tuning runs' seed
    lr_key: str
    notes: str = ""  # Markdown under the verdict: e.g. what rules out an implementation error
    extra_seeds: tuple[int, ...] = EXTRA_SEEDS  # where the verdict is undecided; () for none
    margin: float = 0.0  # not_worse: how much worse A may be, in the metric's units
    margin_source: str = ""  # why that margin: the paper's own precision
    would_change: str = ""  # what would change the verdict (scale, data, budget)

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
        stages = tuple(
            TuneStage(
                name=str(stage["name"]),
                options=tuple(
                    (str(option), tuple(str(o) for o in overrides or ()))
                    for option, overrides in stage["options"].items()
                ),
            )
            for stage in spec.get("tune", ())
        )
        if any(len(stage.options) < 2 for stage in stages):
            raise ValueError(f"{path}: model {spec['name']}: a tuned stage needs two options")
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
                tune=stages,
                early_stopping=bool(spec.get("early_stopping", False)),
                equal_time_overrides=tuple(spec.get("equal_time_overrides", ())),
                equal_time_key=str(spec.get("equal_time_key", "")),
                estimate_minutes=float(spec.get("estimate_minutes", 0.0)),
            )
        )
        if models[-1].early_stopping and models[-1].length_key != "trainer.max_steps":
            raise ValueError(
                f"{path}: model {spec['name']} stops early: its length_key must be "
                "trainer.max_steps (the equal-time run is given a number of updates)"
            )
        if models[-1].equal_key not in (models[-1].length_key, "trainer.max_steps"):
            raise ValueError(
                f"{path}: model {spec['name']}: equal_time_key must be trainer.max_steps (a "
                f"number of updates) or its length_key, got {models[-1].equal_key}"
            )
    if len(models) != 2:
        raise ValueError(f"{path}: a claim compares two models, got {len(models)}")
    seeds = tuple(int(s) for s in conf.get("seeds", VERDICT_SEEDS))
    extra = tuple(int(s) for s in conf.get("extra_seeds", EXTRA_SEEDS))
    if FIRST_SEED in seeds + extra or len(set(seeds + extra)) != len(seeds + extra):
        raise ValueError(
            f"{path}: the verdict's seeds must be distinct and fresh (not {FIRST_SEED}, the "
            f"tuning runs' seed), got {seeds} and extra {extra}"
        )
    if len(seeds) < 2:
        raise ValueError(f"{path}: the verdict needs at least two seeds, got {seeds}")
    margin = float(conf.get("margin", 0.0))
    if conf["kind"] == "not_worse" and not (margin > 0 and conf.get("margin_source")):
        raise ValueError(
            f"{path}: a not_worse claim states its margin (> 0, in {conf['metric']}) and "
            "margin_source (why: the paper's own precision)"
        )
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
        extra_seeds=extra,
        margin=margin,
        margin_source=str(conf.get("margin_source", "")).strip(),
        would_change=str(conf.get("would_change", "")).strip(),
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
