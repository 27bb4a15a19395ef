"""docs/design.md's worked example, run as it stands: a learner with a setting of its own is one module file,
registered by importing it; ksae-baseline then offers its option and trains it, and refuses the setting, in one
line, for a learner that lacks it. The baseline registry imports no learner."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]

# The command, in a fresh interpreter: the example's module imported first (its one line), then ksae-baseline.
COMMAND = """\
import sys
sys.path.insert(0, sys.argv[1])
import contractive  # registers contractive-ae
from ksae_cupy.cli.baseline import baseline_command
baseline_command(sys.argv[2:])
"""


def design_example() -> str:
    """The code block of docs/design.md that begins ``# contractive.py``."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "design.md").read_text(), re.S)
    return next(block for block in blocks if block.startswith("# contractive.py"))


@pytest.fixture(scope="module")
def learner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner")
    (folder / "contractive.py").write_text(design_example())
    rows = np.random.default_rng(0).random((120, 12)).astype(np.float32)
    np.save(folder / "rows.npy", rows)
    return folder


def baseline(learner, *args):
    return subprocess.run([sys.executable, "-c", COMMAND, str(learner), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def train(learner, run_dir, *options):
    result = baseline(learner, learner / "rows.npy", "--hidden", 6, "--epochs", 2, "--batch-size", 40, "--device",
                      "cpu", "--threads", 1, "--run-dir", run_dir, "--quiet", *options)
    assert result.returncode == 0, result.stderr
    return json.loads((Path(run_dir) / "config.json").read_text())


def test_the_design_pages_learner_trains_through_ksae_baseline_with_its_own_setting(learner, tmp_path):
    from ksae_cupy.supervised.baseline_trainer import load_baseline_checkpoint

    config = train(learner, tmp_path / "half", "--model", "contractive-ae", "--penalty", 0.5)
    assert config["model"] == "contractive-ae" and config["baseline"]["penalty"] == 0.5
    assert train(learner, tmp_path / "default", "--model", "contractive-ae")["baseline"]["penalty"] == 0.1
    half, default = (load_baseline_checkpoint(tmp_path / name / "checkpoint.h5") for name in ("half", "default"))
    assert half.config["penalty"] == 0.5 and half.epoch == 2
    # The step read the setting: the larger penalty shrank the weights more (same seed, same batches).
    assert np.linalg.norm(half.params["W_dh"]) < np.linalg.norm(default.params["W_dh"])


def test_a_setting_given_to_a_learner_that_lacks_it_is_refused_in_one_line(learner, tmp_path):
    result = baseline(learner, learner / "rows.npy", "--model", "rbm", "--penalty", 0.5, "--epochs", 1,
                      "--device", "cpu", "--run-dir", tmp_path / "rbm")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith(
        "--penalty is a setting of contractive-ae; rbm has none (leave it out)")
    assert not (tmp_path / "rbm" / "checkpoint.h5").exists()
    bare = baseline(learner, learner / "rows.npy", "--model", "rbm", "--penalty")
    assert bare.returncode != 0 and "Traceback" not in bare.stderr and "--penalty" in bare.stderr


def test_the_baseline_registry_imports_no_learner():
    source = (REPO / "ksae_cupy" / "supervised" / "baseline_registry.py").read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                 for alias in node.names}
    assert not any(name.startswith("ksae_cupy.supervised") for name in imported), imported
