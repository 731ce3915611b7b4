"""``benchmarks/commit_choices.py``: a visit's measured GPU choices merged into a committed table,
which :func:`src.kernels.choose` then takes without timing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.commit_choices import main

H200 = "NVIDIA H200 | torch 2.14.0+cu130 | triton 3.8.0 | 0123456789abcdef"
CPU = "AMD EPYC | ATen AVX512 | oneDNN all | torch 2.14.0 | 0123456789abcdef"


def write_store(path: Path) -> Path:
    path.write_text(json.dumps({
        H200: {
            "dim_conv": {"((8, 24, 56, 56), torch.bfloat16, True)": "reference"},
            "eesp.pyramid": {"((8, 58, 28, 28), torch.bfloat16, True)": "fused"},
            "no_such_op": {"(1,)": "fast"},
            "linear": {"(4, 8)": "no_such_candidate"},
        },
        CPU: {"batch_norm": {"(1, 2)": "ours"}},
    }))  # fmt: skip
    return path


def test_gpu_choices_merge_into_the_arch_table(tmp_path: Path) -> None:
    store = write_store(tmp_path / "auto_choices.json")
    tables = tmp_path / "committed"
    tables.mkdir()
    (tables / "sm_90.json").write_text(json.dumps({
        "dim_conv": [{"key": "((8, 24, 56, 56), torch.bfloat16, True)", "choice": "triton",
                      "source": "an earlier visit"}],
    }))  # fmt: skip
    summary = main([str(store), "--arch", "sm_90", "--visit", "Visit 4",
                    "--table-dir", str(tables)])  # fmt: skip
    table = json.loads((tables / "sm_90.json").read_text())
    # the committed entry wins over a new measurement unless --replace
    assert table["dim_conv"] == [{"key": "((8, 24, 56, 56), torch.bfloat16, True)",
                                  "choice": "triton", "source": "an earlier visit"}]  # fmt: skip
    (entry,) = table["eesp.pyramid"]
    assert entry["choice"] == "fused" and entry["source"].startswith("Visit 4: ")
    assert "NVIDIA H200" in entry["source"] and "torch 2.14.0+cu130" in entry["source"]
    # undeclared ops and candidates, and the CPU's choices, stay out
    assert set(table) == {"dim_conv", "eesp.pyramid"}
    ops = summary["ops"]
    assert ops["dim_conv"]["kept"] == 1 and ops["eesp.pyramid"]["added"] == 1
    assert ops["no_such_op"]["skipped"] == 1 and ops["linear"]["skipped"] == 1
    assert "batch_norm" not in ops

    main([str(store), "--arch", "sm_90", "--visit", "Visit 5", "--replace",
          "--table-dir", str(tables)])  # fmt: skip
    table = json.loads((tables / "sm_90.json").read_text())
    assert table["dim_conv"][0]["choice"] == "reference"
    assert table["dim_conv"][0]["source"].startswith("Visit 5: ")


def test_a_store_without_gpu_choices_is_refused(tmp_path: Path, capsys) -> None:
    store = tmp_path / "auto_choices.json"
    store.write_text(json.dumps({CPU: {"batch_norm": {"(1, 2)": "ours"}}}))
    with pytest.raises(SystemExit) as exit_:
        main([str(store), "--arch", "sm_90", "--visit", "Visit 4", "--table-dir", str(tmp_path)])
    assert exit_.value.code == 2
    assert "holds no choices measured on a GPU" in capsys.readouterr().err
    assert not (tmp_path / "sm_90.json").exists()


def test_the_kernels_choices_are_declared_too() -> None:
    pytest.importorskip("triton")
    from benchmarks.commit_choices import declared_candidates

    candidates = declared_candidates()
    # declared beside its Triton kernel (src/kernels/group_linear/triton_kernel.py), not in src/ops
    assert "group_linear.weight_grad" in candidates and "group_linear" in candidates
