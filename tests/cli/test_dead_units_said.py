"""A run's dead units are explained where they appear. The done line says what the figure counts (one
definition: the final weights' k-codes of the training rows, kept in units.json, the count ksae-eval's train
row, ksae-plot and the export give); more than a third dead gets one line naming the options that keep units
alive, never one the run already used."""
import json

import numpy as np
from click.testing import CliRunner

from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.wording import DEAD_MEANING, dead_units_note

QUICK = ["--hidden", "16", "--k", "2", "--no-k-schedule", "--epochs", "2", "--batch-size", "20", "--device", "cpu",
         "--threads", "1"]


def train(tmp_path, X_nd, *more):
    np.save(tmp_path / "x.npy", X_nd.astype(np.float32))
    result = CliRunner().invoke(train_command, [str(tmp_path / "x.npy"), *QUICK, *more, "--run-dir",
                                                str(tmp_path / "run")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    units = json.loads((tmp_path / "run" / "units.json").read_text())
    # the count is the one metrics.firing_counts gives on the training rows with the final weights
    import ksae_cupy
    from ksae_cupy.metrics import firing_counts
    from ksae_cupy.datasets.preprocess import raw_input_params

    model = ksae_cupy.load(tmp_path / "run")
    params = raw_input_params({n: np.asarray(v) for n, v in model.params_.items()}, model.preprocess_)
    from ksae_cupy.datasets import load_dataset

    counts = firing_counts(params, load_dataset(str(tmp_path / "x.npy")).X_train, 2)  # the rows it trained on
    assert units["firing_counts"] == counts.tolist() and units["n_dead"] == int((counts == 0).sum())
    return result.output.splitlines(), units["n_dead"]


def test_a_run_that_ends_mostly_dead_says_so_and_names_the_fixes(tmp_path):
    # Every row nearly the same: the same few units win every top 2, the rest are never kept.
    X_nd = 0.5 + 0.001 * np.random.default_rng(0).standard_normal((400, 8))
    lines, dead = train(tmp_path, X_nd)
    assert dead > 16 / 3, dead
    assert lines[-2] == dead_units_note(dead, 16)
    assert lines[-2].startswith(f"dead units: {dead} of 16 ended dead, more than a third")
    assert "--center-input or --aux-k 16 keeps more units alive" in lines[-2]  # --aux-k at most --hidden
    assert lines[-1].startswith("done: 2 epochs in ")
    assert f"(dead {dead} of 16, {100 * dead / 16:.1f}%: {DEAD_MEANING})" in lines[-1]


def test_the_advice_never_names_what_the_run_already_used(tmp_path):
    X_nd = 0.5 + 0.001 * np.random.default_rng(0).standard_normal((400, 8))
    lines, dead = train(tmp_path, X_nd, "--aux-k", "16")
    note = [line for line in lines if line.startswith("dead units:")]
    assert all("--aux-k 16 keeps" not in line for line in note)
    assert dead_units_note(531, 1000, aux_k=256).count("--aux-k 256") == 1  # named as used, not recommended
    assert "--center-input keeps more units alive (this run had --aux-k 256)" in dead_units_note(531, 1000, aux_k=256)
    both = dead_units_note(531, 1000, aux_k=256, center_input=True)
    assert "keeps more units alive" not in both and "had --aux-k 256 and --center-input already" in both


def test_a_healthy_run_explains_its_figure_without_a_warning(tmp_path):
    X_nd = make_sparse_signals(400, D=8, H=16, k=2, seed=0)[0]
    lines, dead = train(tmp_path, X_nd, "--center-input", "--aux-k", "4")
    assert dead <= 16 / 3, dead
    assert not any(line.startswith("dead units:") for line in lines)
    assert lines[-1].startswith("done: 2 epochs in ") and f"(dead {dead} of 16, " in lines[-1]


def test_the_note_starts_above_a_third():
    assert dead_units_note(333, 1000) is None and dead_units_note(None, 1000) is None
    assert dead_units_note(531, 1000).startswith("dead units: 531 of 1000 ended dead")
    assert "--aux-k 256" in dead_units_note(531, 1000)  # Gao et al.'s figure where the units allow it
