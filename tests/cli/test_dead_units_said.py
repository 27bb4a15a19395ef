"""Issue 55: a run's dead units are explained where they appear. The done line says what the
figure counts; more than a third dead gets one line naming the options that keep units alive."""
import json

import numpy as np
from click.testing import CliRunner

from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.wording import DEAD_MEANING, dead_units_note

QUICK = ["--hidden", "16", "--k", "2", "--no-k-schedule", "--epochs", "2", "--batch-size", "20", "--device", "cpu",
         "--threads", "1"]


def train(tmp_path, X_nd):
    np.save(tmp_path / "x.npy", X_nd.astype(np.float32))
    result = CliRunner().invoke(train_command, [str(tmp_path / "x.npy"), *QUICK, "--run-dir", str(tmp_path / "run")],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    last = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    return result.output.splitlines(), last["dead_fraction"]


def test_a_run_that_ends_mostly_dead_says_so_and_names_the_fixes(tmp_path):
    # Every row nearly the same: the same few units win every top 2, the rest are never kept.
    X_nd = 0.5 + 0.001 * np.random.default_rng(0).standard_normal((400, 8))
    lines, dead = train(tmp_path, X_nd)
    assert dead > 1 / 3, dead
    assert lines[-2] == dead_units_note(dead, 16)
    assert lines[-2].startswith(f"dead units: {round(16 * dead)} of 16 ended dead, more than a third")
    assert "--center-input or --aux-k 16 keeps every unit alive" in lines[-2]  # --aux-k at most --hidden
    assert lines[-1].startswith("done: 2 epochs in ")
    assert f"(dead {100 * dead:.1f}%: {DEAD_MEANING})" in lines[-1]


def test_a_healthy_run_explains_its_figure_without_a_warning(tmp_path):
    X_nd = make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0]
    lines, dead = train(tmp_path, X_nd)
    assert dead <= 1 / 3, dead
    assert not any(line.startswith("dead units:") for line in lines)
    assert lines[-1].startswith("done: 2 epochs in ") and f"(dead {100 * dead:.1f}%: {DEAD_MEANING})" in lines[-1]


def test_the_note_starts_above_a_third():
    assert dead_units_note(1 / 3, 1000) is None and dead_units_note(None, 1000) is None
    assert dead_units_note(0.531, 1000).startswith("dead units: 531 of 1000 ended dead")
    assert "--aux-k 256" in dead_units_note(0.531, 1000)  # Gao et al.'s figure where the units allow it
