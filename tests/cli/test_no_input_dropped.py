"""No input dropped without a word, and every message names its real cause (issue 54, items 3 and 4):
an option with no effect is refused in one line, data with no variance is refused, a repeated fine-tuning
phase and a damaged cache are named, and the mistakes once told in another command's words name their own."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy import KSparseAutoencoder
from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.data import data_command
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.errors import KsaeError

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["--batch-size", "60", "--lr", "0.01", "--epochs", "1", "--device", "cpu", "--threads", "1", "--quiet"]
FT = ["--epochs", "1", "--batch-size", "60", "--device", "cpu", "--threads", "1", "--quiet"]


def invoke(command, *args):
    return CliRunner().invoke(command, [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A labelled file, a ksae-train layer 1 on it, its codes, a layer 2 on them, and a ksae-baseline run."""
    root = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(0)
    X = rng.random((300, 16)).astype(np.float32)
    np.savez(root / "rows.npz", X=X, y=rng.integers(0, 3, 300))
    layer1, layer2, baseline = root / "layer1", root / "layer2", root / "baseline"
    for result in (
        invoke(train_command, root / "rows.npz", "--hidden", "12", "--k", "3", "--no-k-schedule", *TRAIN,
               "--test-fraction", "0.2", "--run-dir", layer1),
        invoke(data_command, "codes", layer1, root / "codes.npy"),
        invoke(train_command, root / "codes.npy", "--hidden", "10", "--k", "3", "--no-k-schedule", *TRAIN,
               "--run-dir", layer2),
        invoke(baseline_command, root / "rows.npz", "--model", "dropout-ae", "--hidden", "8", *TRAIN,
               "--run-dir", baseline),
    ):
        assert result.exit_code == 0, result.output
    return root


# -- options with no effect ------------------------------------------------------------------------------

def test_an_auxk_coefficient_without_auxk_is_refused_by_the_command_and_named_by_the_estimator(runs, tmp_path):
    result = invoke(train_command, runs / "rows.npz", "--hidden", "12", "--k", "3", *TRAIN, "--aux-coef", "0.1",
                    "--run-dir", tmp_path / "r")
    assert_one_line_error(result, "--aux-coef 0.1 has no effect with --aux-k 0", status=2)
    assert not (tmp_path / "r").exists()
    # the estimator says so in a warning (a grid search may pair aux_coef with aux_k=0), and trains the paper's step
    from ksae_cupy.errors import KsaeNote

    with pytest.warns(KsaeNote, match=r"^aux_coef 0.5 has no effect with aux_k 0 \(the auxiliary loss is off\)"):
        KSparseAutoencoder(n_hidden=12, k=3, epochs=1, lr=0.01, aux_coef=0.5).fit(np.load(runs / "rows.npz")["X"])
    # with AuxK on, it acts, and is taken
    assert invoke(train_command, runs / "rows.npz", "--hidden", "12", "--k", "3", *TRAIN, "--aux-k", "2",
                  "--aux-coef", "0.1", "--run-dir", tmp_path / "on").exit_code == 0


def test_alphas_given_to_the_evaluation_of_a_baseline_folder_are_refused(runs):
    result = invoke(eval_command, runs / "baseline", "--alphas", "2", "--device", "cpu")
    assert_one_line_error(result, "--alphas 2 has no effect on", "a ksae-baseline run folder", status=2)
    assert not (runs / "baseline" / "eval.json").exists()


def test_an_alpha_given_for_the_codes_of_a_baseline_folder_is_refused(runs, tmp_path):
    result = invoke(data_command, "codes", runs / "baseline", tmp_path / "codes.npy", "--alpha", "2")
    assert_one_line_error(result, "--alpha 2.0 has no effect on", "a ksae-baseline run folder", status=2)
    assert not (tmp_path / "codes.npy").exists()


@pytest.mark.parametrize("args, fragment", [
    (["{layer1}", "--pretrain-epochs", "5"], "--pretrain-epochs 5 only applies with --baseline"),
    (["{rows}", "--baseline", "rbm", "--hidden", "8", "--alpha", "2"],
     "--alpha 2.0 has no effect with --baseline rbm: its layers keep every unit"),
    (["{rows}", "--no-pretraining", "--units", "relu", "--hidden", "8", "--alpha", "2"],
     "--alpha 2.0 has no effect with --units relu"),
    (["{baseline}", "--alpha", "2"], "--alpha 2.0 has no effect on ksae-baseline layers"),
])
def test_fine_tuning_options_with_no_effect_are_refused(runs, tmp_path, args, fragment):
    paths = {"layer1": runs / "layer1", "rows": runs / "rows.npz", "baseline": runs / "baseline"}
    result = invoke(finetune_command, *[a.format(**paths) for a in args], *FT, "--run-dir", tmp_path / "ft")
    assert_one_line_error(result, fragment, status=2)
    assert not (tmp_path / "ft").exists()


def test_progress_seconds_with_quiet_is_named_by_the_training_commands(runs, tmp_path):
    note = "note: --progress-seconds 5.0 has no effect with --quiet, which shows no progress"
    result = invoke(train_command, runs / "rows.npz", "--hidden", "12", "--k", "3", *TRAIN, "--progress-seconds",
                    "5", "--run-dir", tmp_path / "r")
    assert result.exit_code == 0 and note in result.stderr.splitlines(), result.output
    tuned = invoke(finetune_command, runs / "layer1", *FT, "--progress-seconds", "5", "--run-dir", tmp_path / "ft")
    assert tuned.exit_code == 0 and note in tuned.stderr.splitlines(), tuned.output


def test_a_repeated_fine_tuning_phase_is_named(runs, tmp_path):
    result = invoke(finetune_command, runs / "layer1", *FT, "--phases", "all,all", "--run-dir", tmp_path / "ft")
    assert result.exit_code == 0, result.output
    assert ("note: --phases all,all: phase all comes more than once; each time it runs its --epochs again with its "
            "rate schedule restarted from the start (--lr-start), not continued") in result.stderr.splitlines()


@pytest.mark.parametrize("values", [np.zeros((60, 8)), np.full((60, 8), 0.5), np.tile(np.linspace(0, 1, 8), (60, 1))])
def test_data_with_no_variance_is_refused_by_every_trainer(values, tmp_path):
    path = tmp_path / "flat.npy"
    np.save(path, values.astype(np.float32))
    for command, extra in ((train_command, ["--k", "2"]), (baseline_command, ["--model", "rbm"])):
        result = invoke(command, path, "--hidden", "8", *extra, *TRAIN, "--batch-size", "10",
                        "--run-dir", tmp_path / "r")
        assert_one_line_error(result, "X has no variance: its 54 rows are all the same", status=2)
        assert not (tmp_path / "r").exists()
    with pytest.raises(KsaeError, match="X has no variance: its 60 rows are all the same"):
        KSparseAutoencoder(n_hidden=8, k=2, epochs=1, lr=0.01, batch_size=10).fit(values)


def test_a_damaged_cache_of_fits_is_set_aside_with_a_note_and_the_fits_made_again(runs):
    run = runs / "layer1"
    cache = run / "eval-fits.npz"
    np.savez(cache, meta=np.array("{}"))
    cache.write_bytes(cache.read_bytes()[:40])  # a zip cut short: once a traceback in every later ksae-eval
    args = [run, "--alphas", "1", "--l2", "1e-3", "--l2-extend", "0", "--device", "cpu", "--threads", "1"]
    result = invoke(eval_command, *args)
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"note: {cache} could not be read (BadZipFile"), notes
    assert notes[0].endswith(f"set aside as {cache}.damaged; its classifier fits are made again")
    assert (run / "eval-fits.npz.damaged").is_file() and (run / "eval.json").is_file()
    again = invoke(eval_command, *args)
    assert again.exit_code == 0 and "note:" not in again.stderr


# -- messages that name their real cause -----------------------------------------------------------------

def test_layers_in_the_wrong_order_are_refused_as_such_not_as_data_without_labels(runs, tmp_path):
    result = invoke(finetune_command, runs / "layer2", runs / "layer1", *FT, "--run-dir", tmp_path / "ft")
    assert_one_line_error(result, "the pretrained runs are in the wrong order", "give layer 1 first: ksae-finetune "
                          f"{runs / 'layer1'} {runs / 'layer2'}", status=2)
    assert "labels" not in result.stderr
    unstacked = invoke(finetune_command, runs / "layer1", runs / "layer1", *FT, "--run-dir", tmp_path / "ft")
    assert_one_line_error(unstacked, "layer 2 takes 16 inputs but layer 1 has 12 hidden units",
                          "the pretrained runs do not stack", status=2)


@pytest.mark.parametrize("option", ["--softmax-lr-start", "--lr-start", "--lr-end"])
def test_a_negative_rate_is_refused_as_a_rate_not_as_a_rising_schedule(runs, tmp_path, option):
    result = invoke(finetune_command, runs / "layer1", *FT, "--phases", "softmax,all", option, "-0.1",
                    "--run-dir", tmp_path / "ft")
    assert_one_line_error(result, f"{option} -0.1 is not allowed; use a positive learning rate", status=2)
    assert "rise" not in result.stderr and not (tmp_path / "ft").exists()


def test_a_truncated_baseline_checkpoint_is_named_as_such_by_the_evaluation(runs, tmp_path):
    cut = tmp_path / "cut"
    cut.mkdir()
    for name in ("config.json", "metrics.jsonl"):
        (cut / name).write_bytes((runs / "baseline" / name).read_bytes())
    whole = (runs / "baseline" / "checkpoint.h5").read_bytes()
    (cut / "checkpoint.h5").write_bytes(whole[:len(whole) // 2])
    result = invoke(eval_command, cut, "--device", "cpu")
    assert_one_line_error(result, f"{cut / 'checkpoint.h5'} is corrupt or truncated", status=2)
    assert "ksae-train" not in result.stderr


def test_the_codes_of_a_fine_tuning_folder_are_refused_in_the_codes_words(runs, tmp_path):
    assert invoke(finetune_command, runs / "layer1", *FT, "--run-dir", tmp_path / "ft").exit_code == 0
    result = invoke(data_command, "codes", tmp_path / "ft", tmp_path / "codes.npy")
    assert_one_line_error(result, f"RUN_DIR {tmp_path / 'ft'}: a ksae-finetune run folder",
                          "ksae-data codes reads the layers a stack is built from", status=2)
    assert "fine-tuning starts from" not in result.stderr
    # and ksae-eval, which reads baseline folders too, says so
    evaluated = invoke(eval_command, tmp_path / "ft", "--device", "cpu")
    assert_one_line_error(evaluated, "ksae-eval reads ksae-train and ksae-baseline run folders", status=2)


def test_the_mpi_trainers_usage_line_names_how_it_is_started():
    result = subprocess.run([sys.executable, "-m", "ksae_cupy.cli.mpi_train", "train", "--no-such-option"],
                            capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 2
    assert result.stderr.startswith("Usage: mpiexec -n R python -m mpi4py -m ksae_cupy.cli.mpi_train train"), \
        result.stderr
    assert "ksae-dist" not in result.stderr


def test_a_layout_for_grey_filters_is_refused(runs, tmp_path):
    pytest.importorskip("matplotlib")
    from ksae_cupy.cli.plot import plot_command

    result = invoke(plot_command, "filters", runs / "layer1", "--layout", "chw", "--output", tmp_path / "f.png")
    assert_one_line_error(result, "--layout chw has no effect on grey filters", status=2)
    assert not (tmp_path / "f.png").exists()


def test_workers_with_a_scheduler_are_refused_before_any_connection(runs, tmp_path):
    from ksae_cupy.cli.sweep import sweep_command

    result = invoke(sweep_command, runs / "rows.npz", "--k", "2", "--hidden", "8", "--epochs", "1",
                    "--scheduler", "tcp://127.0.0.1:1", "--workers", "4", "--out", tmp_path / "s")
    assert_one_line_error(result, "--workers 4 has no effect with --scheduler tcp://127.0.0.1:1", status=2)
    assert not (tmp_path / "s").exists()
