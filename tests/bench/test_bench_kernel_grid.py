"""The kernel-grid mode of bin/gpu-campaign (ksae_cupy.bench.kernel_grid): on a GPU, and elsewhere on the
CuPy stand-in, where the timings mean nothing but the checks, the grid and the JSON all run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_cupy")]


def test_kernel_grid_writes_json_with_device_versions_commit_date(tmp_path, capsys):
    from ksae_cupy.bench import kernel_grid

    status = kernel_grid.run(tmp_path / "grid", 3, include_torch=False, Ns=(40,), Hs=(300,), ks=(5, 299),
                             repeats=2, copy_bytes=1 << 20)
    out = capsys.readouterr().out
    assert status == 0
    path = Path(out.strip().splitlines()[-1].split("kernel grid JSON: ")[1])
    assert path.parent == tmp_path / "grid"
    data = json.loads(path.read_text())
    for key in ("device", "cupy", "commit", "date", "numpy", "python"):
        assert data["meta"][key], key
    assert data["absent"]["torch"] == "left out (--no-torch)"
    names = {r["candidate"] for r in data["results"]}
    assert {"ksae_sort", "ksae_threshold", "ksae_radix_sort", "ksae_radix_threshold", "cupy_argpartition"} <= names
    assert all(r["valid"] for r in data["results"])
    assert {(r["k"]) for r in data["results"]} == {5, 299}


def _campaign(args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run([sys.executable, str(REPO / "bin" / "gpu-campaign"), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def test_kernel_grid_fails_fast_without_torch(tmp_path):
    """Where torch does not import (here a ``torch`` package that raises, ahead of any real one), the mode
    stops at its checks: one error line, exit status 2, nothing written."""
    (tmp_path / "fake" / "torch").mkdir(parents=True)
    (tmp_path / "fake" / "torch" / "__init__.py").write_text("raise ImportError('no torch in this test')\n")
    path = os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")])
    proc = _campaign([str(tmp_path / "g"), "--kernel-grid", "--budget-minutes", "7"], {"PYTHONPATH": path})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: torch with CUDA does not import")
    assert not (tmp_path / "g").exists()


def test_kernel_grid_refuses_a_budget_too_short(tmp_path):
    proc = _campaign([str(tmp_path / "g"), "--kernel-grid", "--budget-minutes", "1", "--no-torch"])
    assert proc.returncode == 2
    assert "--budget-minutes 1 is too short" in proc.stderr and not (tmp_path / "g").exists()


def test_kernel_grid_tiny_through_the_campaign(tmp_path):
    proc = _campaign([str(tmp_path / "g"), "--kernel-grid", "--tiny", "--no-torch", "--budget-minutes", "3"])
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.strip().splitlines()[-1].split("kernel grid JSON: ")[1])
    data = json.loads(path.read_text())
    assert data["config"]["Hs"] == [128] and all(r["valid"] for r in data["results"])
