"""The choices kept beyond the process (src/kernels/choices.py): where the machine's store lies,
and the committed tables of the GPU architectures."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import pytest
import torch

from src.kernels import choices, cpu, dispatch, environment, forget, timings


def test_choices_file_is_under_xdg_cache_home(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(environment.CHOICES_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert choices.store_path() == tmp_path / "xdg" / "lightnets" / "auto_choices.json"


def test_choices_file_defaults_to_the_home_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(environment.CHOICES_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert choices.store_path() == tmp_path / ".cache" / "lightnets" / "auto_choices.json"
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # set but empty: unset, as the XDG rule says
    assert choices.store_path() == tmp_path / ".cache" / "lightnets" / "auto_choices.json"


def test_choices_variable_overrides_the_cache_root(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(environment.CHOICES_ENV, str(tmp_path / "mine.json"))
    assert choices.store_path() == Path(tmp_path / "mine.json")
    monkeypatch.setenv(environment.CHOICES_ENV, "0")
    assert choices.store_path() is None


def _declare_every_op() -> None:
    """Import every module of src.ops and src.kernels: each declares the candidates of its
    choices (the GLT's weight gradient, for one, in its Triton kernels' module)."""
    import src.kernels
    import src.ops

    for package in (src.ops, src.kernels):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)


@pytest.mark.parametrize("path", sorted(choices.COMMITTED.glob("*.json")), ids=lambda p: p.stem)
def test_committed_tables_name_declared_ops_and_candidates(path: Path) -> None:
    """Each table parses, names only declared CUDA ops and their candidates, and says where each
    entry was measured."""
    pytest.importorskip("triton")
    _declare_every_op()
    declared = dispatch.declared()
    table = json.loads(path.read_text())
    assert re.fullmatch(r"sm_\d+", path.stem) and table
    for op, entries in table.items():
        assert (op, "cuda") in declared, f"{path.name}: {op} is no declared CUDA choice"
        wide = [entry for entry in entries if "key" not in entry]
        assert len(wide) <= 1, f"{path.name}: {op} has more than one entry without a key"
        for entry in entries:
            assert set(entry) <= {"key", "choice", "source"}, entry
            assert entry["choice"] in declared[op, "cuda"], entry
            assert "docs/" in entry["source"] and "Visit" in entry["source"], entry
            assert "key" not in entry or entry["key"].startswith("("), entry


def test_the_h100_table_gives_the_glt_weight_gradient_without_timing(
    fresh_choices, monkeypatch
) -> None:
    """At DExTra's weight shapes (16,384 bf16 tokens) the table's bmm is taken before any timing
    on an sm_90 GPU; another shape, or a GPU without a table, is timed."""
    pytest.importorskip("triton")
    from src.kernels.group_linear.triton_kernel import weight_grad_method

    monkeypatch.delenv(environment.GLT_WEIGHT_GRAD_ENV, raising=False)
    monkeypatch.setattr(choices, "architecture", lambda: "sm_90")
    xg = torch.zeros(16384, 4, 128, dtype=torch.bfloat16)
    dy = torch.zeros(16384, 4, 128, dtype=torch.bfloat16)
    fail = lambda fn: pytest.fail("timed")  # noqa: E731
    assert weight_grad_method(xg, dy, fail) == "bmm" and timings() == 0
    times = {"weight_grad_splitk": 1.0, "weight_grad_bmm": 2.0}
    timer = lambda fn: times[fn.func.__name__]  # noqa: E731
    assert weight_grad_method(xg[:100], dy[:100], timer) == "splitk" and timings() == 1
    forget()
    monkeypatch.setattr(choices, "architecture", lambda: "sm_80")  # no table for an A100
    assert weight_grad_method(xg, dy, timer) == "splitk" and timings() == 1


def test_an_op_wide_entry_and_a_bad_table(monkeypatch, tmp_path) -> None:
    (tmp_path / "sm_1.json").write_text(json.dumps({"op": [
        {"key": "(1,)", "choice": "a", "source": "s"}, {"choice": "b", "source": "s"},
    ]}))  # fmt: skip
    (tmp_path / "sm_2.json").write_text(json.dumps({"op": [
        {"choice": "a", "source": "s"}, {"choice": "b", "source": "s"},
    ]}))  # fmt: skip
    monkeypatch.setattr(choices, "COMMITTED", tmp_path)
    choices.forget()
    try:
        assert [choices.committed("op", key, "sm_1") for key in ((1,), (2,))] == ["a", "b"]
        assert choices.committed("other", (1,), "sm_1") is None
        assert choices.committed("op", (1,), "sm_3") is None
        assert choices.committed("op", (1,), None) is None
        with pytest.raises(ValueError, match="op has 2 entries without a key"):
            choices.committed("op", (1,), "sm_2")
    finally:
        choices.forget()


def test_the_architecture_is_named_by_compute_capability(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    assert choices.architecture() == "sm_90"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choices.architecture() is None


def test_the_signatures_hash_the_kernels_sources() -> None:
    # a kernel's change must re-measure: the sources the signatures read are where the kernels are
    kernels = Path(choices.__file__).parent
    assert len(choices.KERNELS) >= 15 and all(path.exists() for path in choices.KERNELS)
    assert kernels / "group_linear" / "triton_kernel.py" in choices.KERNELS
    assert kernels / "triton" / "launch.py" in choices.KERNELS
    cpp = [path for path in choices.CPU_SOURCES if path.suffix == ".cpp"]
    # every C++ source the build compiles, and nothing else that is not a source
    assert sorted(cpp) == sorted(cpu.SOURCES) and len(cpp) >= 12
    assert all(path.exists() for path in choices.CPU_SOURCES)
    assert kernels / "cpu" / "common.h" in choices.CPU_SOURCES
