"""Building the fused CPU kernels: where the build goes and what it clears first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.utils.cpp_extension

from src.kernels import cpu
from src.kernels.environment import CPU_KERNELS_ENV


@pytest.fixture
def fake_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """A builder that records its call instead of compiling, into an empty extension cache."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.delenv(CPU_KERNELS_ENV, raising=False)
    calls: dict = {}

    def load(name: str, *, build_directory: str, sources: list[str], **kwargs) -> None:
        calls.update(name=name, directory=Path(build_directory), sources=sources)
        calls["marker_present"] = (Path(build_directory) / "lock").exists()

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    return calls


def test_build_goes_to_a_folder_per_torch_version(fake_load: dict, tmp_path: Path) -> None:
    assert cpu.cpu_kernels.__wrapped__() is True
    name = fake_load["name"]
    assert name == cpu.build_name(cpu._compiler_flags()[2])
    # e.g. "2.14.1+cu130" appears as "2_14_1_cu130"
    assert torch.__version__.replace(".", "_").replace("+", "_") in name
    assert fake_load["directory"] == tmp_path / "lightnets" / name


def test_two_checkouts_of_the_same_sources_share_one_build(
    fake_load: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build compiles copies in its own folder: the same command from every checkout."""
    builds = []
    for checkout in ("clone_a", "clone_b"):
        folder = tmp_path / checkout / "src" / "kernels" / "cpu"
        folder.mkdir(parents=True)
        for path in cpu.SOURCES + cpu.HEADERS:
            (folder / path.name).write_bytes(path.read_bytes())
        monkeypatch.setattr(cpu, "SOURCES", tuple(folder / p.name for p in cpu.SOURCES))
        monkeypatch.setattr(cpu, "HEADERS", tuple(folder / p.name for p in cpu.HEADERS))
        assert cpu.cpu_kernels.__wrapped__() is True
        builds.append(dict(fake_load))
    first, second = builds
    assert first["name"] == second["name"] and first["directory"] == second["directory"]
    assert first["sources"] == second["sources"]
    staged = [Path(s) for s in first["sources"]]
    assert all(s.parent == first["directory"] / "src" for s in staged)
    assert (first["directory"] / "src" / "common.h").read_bytes() == cpu.HEADERS[0].read_bytes()
    # a changed source is a new build folder, not a rebuild of this one
    changed = tmp_path / "clone_b" / "src" / "kernels" / "cpu" / "dice.cpp"
    changed.write_bytes(changed.read_bytes() + b"\n// changed\n")
    assert cpu.cpu_kernels.__wrapped__() is True
    assert fake_load["directory"] != first["directory"]


def test_a_renamed_source_is_a_new_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's command names the sources: a checkout with a source renamed, same bytes, does
    not share the folder of one with the old name (each would rebuild it for the other)."""
    before = cpu.build_name("avx2")
    folder = tmp_path / "cpu"
    folder.mkdir()
    first, *rest = cpu.SOURCES
    renamed = [folder / f"renamed_{first.name}", *(folder / p.name for p in rest)]
    for source, copy in zip(cpu.SOURCES, renamed, strict=True):
        copy.write_bytes(source.read_bytes())
    monkeypatch.setattr(cpu, "SOURCES", tuple(renamed))
    assert cpu.build_name("avx2") != before


def test_stale_build_marker_is_removed_before_building(fake_load: dict) -> None:
    # what a build killed under PyTorch < 2.14 leaves: later builds there would wait forever
    directory = cpu.build_directory(cpu.build_name(cpu._compiler_flags()[2]))
    (directory / "lock").touch()
    assert cpu.cpu_kernels.__wrapped__() is True
    assert fake_load["directory"] == directory
    assert fake_load["marker_present"] is False


def test_failed_build_warns_and_keeps_the_eager_path(
    fake_load: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args, **kwargs) -> None:
        raise RuntimeError("Error building extension\nc++: fatal error: no input files")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", broken)
    with pytest.warns(RuntimeWarning, match="no input files.*the CPU uses the eager PyTorch"):
        assert cpu.cpu_kernels.__wrapped__() is False


@pytest.mark.parametrize(
    ("capability", "isa_flags"),
    [("DEFAULT", []), ("AVX2", ["-mavx2", "-mfma"]),
     ("AVX512", ["-mavx2", "-mfma", "-DLIGHTNETS_AVX512"])],
)  # fmt: skip
def test_build_targets_the_isa_level_pytorch_dispatches_to(
    monkeypatch: pytest.MonkeyPatch, capability: str, isa_flags: list[str]
) -> None:
    """AVX2 code where PyTorch runs AVX2 or AVX-512, and the sources that switch to AVX-512
    themselves told so only where PyTorch runs it: the build never uses an ISA the CPU lacks."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    cflags, _, suffix = cpu._compiler_flags()
    assert [f for f in cflags if f.startswith(("-mavx", "-mfma", "-DLIGHTNETS"))] == isa_flags
    assert suffix == capability.lower()
