"""examples/second_day.py runs end to end as CI runs it: train, filters, sparse codes, a classifier, the export,
and the export read back without this package (NumPy always; PyTorch where torch imports)."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "second_day.py"


def test_the_example_runs_end_to_end(tmp_path):
    out = tmp_path / "example"
    result = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(out)], capture_output=True, text=True,
                            timeout=600)  # a hang guard only
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(".")[0] for line in lines][:6] == ["1", "2", "3", "4", "5", "6"], result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "model.safetensors").is_file()
    assert summary["numpy_rows_differing"] <= 10  # ties within float rounding only (else the example fails)
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "filters.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if importlib.util.find_spec("sklearn") is not None:
        assert 0 <= summary["test_error"] < 0.75  # 4 classes: chance is 0.75
    has_torch = importlib.util.find_spec("torch") is not None
    assert ("torch_rows_differing" in summary) == has_torch
    assert ("6. PyTorch part skipped: torch is not installed" in lines) != has_torch


def test_the_example_refuses_to_write_into_an_existing_folder(tmp_path):
    result = subprocess.run([sys.executable, str(EXAMPLE), "--out", str(tmp_path)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode != 0 and result.stderr == f"--out {tmp_path} already exists; give a new folder\n"
