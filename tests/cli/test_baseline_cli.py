"""ksae-baseline: a baseline learner trained as a run folder (resume, stop signals, one-line mistakes),
and ksae-eval of that folder with the protocol of section 5."""
import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.baseline import baseline_command
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.supervised import baselines
from ksae_cupy.supervised.baseline_trainer import FORMAT, load_baseline_checkpoint
from ksae_cupy.session.runs import RunFolder
from clicheck import assert_one_line_error
from heldrun import held_train, wait_until_held

ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")
MODELS = ("rbm", "dropout-ae", "denoising-ae", "dropout-denoising-ae")


def common(labelled_rows_file, model):
    return [str(labelled_rows_file), "--model", model, "--hidden", "12", "--batch-size", "50", "--test-fraction", "0.2",
            "--device", "cpu", "--threads", "1", "--lr", "0.01"]


def invoke(args, expect=0):
    result = CliRunner().invoke(baseline_command, [str(a) for a in args], catch_exceptions=False)
    if expect is not None:
        assert result.exit_code == expect, result.output
    return result


def same_state(a: Path, b: Path) -> None:
    """Two checkpoints hold the very same parameters, velocities, counters and generator state."""
    got, expected = load_baseline_checkpoint(a / "checkpoint.h5"), load_baseline_checkpoint(b / "checkpoint.h5")
    assert (got.epoch, got.step, got.batch_in_epoch) == (expected.epoch, expected.step, expected.batch_in_epoch)
    for group in ("params", "velocities"):
        for name, value in getattr(expected, group).items():
            assert getattr(got, group)[name].tobytes() == value.tobytes(), (group, name)
    assert got.rng_state == expected.rng_state


@pytest.mark.parametrize("model", MODELS)
def test_two_epochs_then_resume_to_four_equals_four_epochs_at_once(labelled_rows_file, tmp_path, model):
    whole, split = tmp_path / "whole", tmp_path / "split"
    invoke(common(labelled_rows_file, model) + ["--epochs", "4", "--run-dir", whole])
    first = invoke(common(labelled_rows_file, model) + ["--epochs", "2", "--run-dir", split])
    assert "done: 2 epochs" in first.output and f"evaluate with: ksae-eval {split}" in first.output
    assert [r["epoch"] for r in RunFolder(split).read_metrics()] == [1, 2]
    resumed = invoke(["--resume", split, "--epochs", "4"])
    assert "resuming" in resumed.output and "applied: epochs 2 -> 4" in resumed.output
    same_state(split, whole)
    records = RunFolder(split).read_metrics()
    assert [r["epoch"] for r in records] == [1, 2, 3, 4] and all(r["valid_loss"] > 0 for r in records)
    config = RunFolder(split).read_config()
    assert config["model"] == model and config["baseline"]["model"] == model and config["baseline"]["epochs"] == 4
    assert config["threads"] == 1  # kept for a resume: BLAS sums differ between thread counts
    regularisation = {"input_dropout": 0.0, "hidden_dropout": 0.0, **baselines.REGULARISATION[model]}
    if model != "rbm":
        assert {k: config["baseline"][k] for k in regularisation} == regularisation
    import h5py
    with h5py.File(split / "checkpoint.h5") as f:
        assert f.attrs["format"] == FORMAT  # not a k-sparse checkpoint: a reader of those refuses it by name
        assert f.attrs["run_id"] == config["run_id"] and config["kind"] == "ksae-baseline"
    again = invoke(["--resume", split])
    assert "nothing to train: the run had already trained all its 4 epochs" in again.output


@pytest.mark.parametrize("model", ["rbm", "dropout-denoising-ae"])
def test_sigterm_saves_prints_the_resume_line_and_the_resume_ends_bit_identical(labelled_rows_file, tmp_path, model):
    """The run holds after logging epoch 1 (tests/heldrun.py) and SIGTERM arrives there: an event,
    not a clock. The step under way is the epoch's last, so the run stops after it, at the boundary."""
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    invoke(common(labelled_rows_file, model) + ["--epochs", "3", "--run-dir", whole, "--quiet"])
    proc = subprocess.Popen(held_train(1, command="baseline") + common(labelled_rows_file, model) + [
        "--epochs", "3", "--run-dir", str(stopped)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=ENV)
    assert wait_until_held(proc) == 1
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)  # closes stdin: the run goes on and stops
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "SIGTERM: stopping after this step and saving a checkpoint" in err
    assert err.splitlines()[-1] == (f"interrupted after epoch 1; checkpoint saved to {stopped / 'checkpoint.h5'}; "
                                    f"continue with: ksae-baseline --resume {stopped}")
    assert load_baseline_checkpoint(stopped / "checkpoint.h5").epoch == 1
    resumed = invoke(["--resume", stopped])
    assert f"resuming {stopped} after epoch 1 (step " in resumed.output
    same_state(stopped, whole)
    assert [r["epoch"] for r in RunFolder(stopped).read_metrics()] == [1, 2, 3]


@pytest.mark.parametrize("model", ["rbm", "dropout-denoising-ae"])
def test_kill_9_after_a_mid_epoch_checkpoint_then_resume_ends_bit_identical(labelled_rows_file, tmp_path, model):
    """A checkpoint after every batch (--checkpoint-minutes 1e-9); the run holds once it has logged
    epoch 1, before that epoch's own checkpoint, and is killed there: the last checkpoint is mid-epoch
    (its last batch still to do), the metrics line of epoch 1 lies past it and is dropped on resume."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    invoke(common(labelled_rows_file, model) + ["--epochs", "3", "--run-dir", whole, "--quiet"])
    proc = subprocess.Popen(held_train(1, command="baseline") + common(labelled_rows_file, model) + [
        "--epochs", "3", "--run-dir", str(killed), "--checkpoint-minutes", "1e-9"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    assert wait_until_held(proc) == 1
    proc.kill()
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    saved = load_baseline_checkpoint(killed / "checkpoint.h5")
    assert saved.epoch == 0 and saved.batch_in_epoch > 0 and saved.epoch_perm is not None
    resumed = invoke(["--resume", killed])
    assert f"resuming {killed} after epoch 0, batch {saved.batch_in_epoch}" in resumed.output
    assert "metrics.jsonl: dropped 1 line(s): epoch 1, logged after the checkpoint (epoch 0), which runs again" \
        in resumed.output
    same_state(killed, whole)
    assert [r["epoch"] for r in RunFolder(killed).read_metrics()] == [1, 2, 3]


@pytest.mark.parametrize("model", ["dropout-ae", "denoising-ae"])
def test_eval_classifies_every_hidden_unit_of_the_uncorrupted_input(labelled_rows_file, tmp_path, model, monkeypatch):
    run = tmp_path / "run"
    invoke(common(labelled_rows_file, model) + ["--epochs", "2", "--run-dir", run, "--quiet"])
    from ksae_cupy.evaluation import selection

    seen = []
    real = selection.select_and_test
    monkeypatch.setattr(selection, "select_and_test", lambda encode, *a, **k: seen.append(encode) or real(encode, *a, **k))
    result = CliRunner().invoke(eval_command, [str(run), "--device", "cpu", "--l2", "1e-3,1e-5", "--l2-extend", "0",
                                                    "--threads", "1"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    saved = json.loads((run / "eval.json").read_text())
    assert saved["model"] == model and saved["epoch"] == 2 and 0 <= saved["features"]["test_error"] <= 1
    assert [t["alpha"] for t in saved["features"]["trials"]] == [None, None]  # no alpha: every unit is kept
    assert "every hidden unit of the uncorrupted input" in (run / "eval.md").read_text()
    # The classifier saw sigmoid(x W + b) of the clean rows, with all units: no dropout, no noise.
    params = load_baseline_checkpoint(run / "checkpoint.h5").params
    X = np.load(labelled_rows_file)["X"][:50]
    expected = 1 / (1 + np.exp(-(X.astype(np.float64) @ params["W_dh"] + params["b_h"])))
    np.testing.assert_allclose(seen[0](None, X), expected, rtol=1e-5, atol=1e-6)
    assert seen[0](None, X).shape == (50, 12)


def test_mistakes_are_one_line(labelled_rows_file, tmp_path):
    run = tmp_path / "run"
    assert_one_line_error(invoke([labelled_rows_file, "--epochs", "1"], expect=None), "missing --model", "rbm",
                          status=2)
    assert_one_line_error(invoke(["synthetic", "--model", "rbm", "--hidden", "8", "--epochs", "1", "--device", "cpu",
                                  "--run-dir", tmp_path / "signed"], expect=None),
                          "the RBM's input holds values in", "only values in [0, 1]", status=2)
    assert_one_line_error(invoke(common(labelled_rows_file, "denoising-ae") + ["--epochs", "1", "--weight-decay", "-1"],
                                 expect=None), "--weight-decay -1.0", ">= 0", status=2)
    invoke(common(labelled_rows_file, "dropout-ae") + ["--epochs", "2", "--run-dir", run, "--quiet"])
    assert_one_line_error(invoke(["--resume", run, "--hidden", "8", "--lr", "0.01"], expect=None),
                          "--resume: options contradict the checkpoint", "--hidden 8 (the run has 12)", status=2)
    assert_one_line_error(invoke(["--resume", run, "--epochs", "1"], expect=None),
                          "--epochs 1 is not allowed on resume", "use at least 2", status=2)
    assert_one_line_error(invoke(common(labelled_rows_file, "dropout-ae") + ["--epochs", "2", "--run-dir", run],
                                 expect=None),
                          "already holds a run", "--resume", status=2)
    from ksae_cupy.cli.train import train_command

    refused = CliRunner().invoke(train_command, ["--resume", str(run), "--device", "cpu"], catch_exceptions=False)
    assert_one_line_error(refused, "a ksae-baseline run folder, not a ksae-train one",
                          f"continue it with ksae-baseline --resume {run}", status=2)


@pytest.mark.parametrize("model", ["rbm", "dropout-denoising-ae"])
def test_finetune_starts_from_a_baseline_run_with_its_dropout(labelled_rows_file, tmp_path, model):
    from ksae_cupy.cli.finetune import finetune_command

    run, out = tmp_path / "run", tmp_path / "ft"
    invoke(common(labelled_rows_file, model) + ["--epochs", "2", "--run-dir", run, "--quiet"])
    result = CliRunner().invoke(finetune_command, [str(run), "--epochs", "1", "--batch-size", "50", "--device", "cpu",
                                                   "--lr-start", "0.1", "--lr-end", "0.01", "--run-dir", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = RunFolder(out).read_config()
    regularisation = {"input_dropout": 0.0, "hidden_dropout": 0.0, **baselines.REGULARISATION[model]}
    assert {k: config["finetune"][k] for k in regularisation} == regularisation  # section 4.5: its own dropout
    assert config["finetune"]["activations"] == ["sigmoid"] and config["finetune"]["kept"] == [None]
    assert config["pretrained"][0]["model"] == model and config["pretrained"][0]["epochs_trained"] == 2
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    assert 0 <= json.loads((out / "finetune.json").read_text())["test_error"] <= 1
    assert load_finetune_checkpoint(out / "checkpoint.h5")["params"]["W1_dh"].shape == (16, 12)
    two = CliRunner().invoke(finetune_command, [str(run), str(run), "--device", "cpu", "--run-dir", str(tmp_path / "b")],
                             catch_exceptions=False)
    assert_one_line_error(two, "layer 2 takes 16 inputs but layer 1 has 12 hidden units", "do not stack", status=2)


def test_a_stack_of_baseline_runs_fine_tunes_deep_layer_wise(labelled_rows_file, tmp_path):
    """Section 4.6 with run folders: layer 2 a ksae-baseline run on layer 1's features (write_codes),
    fine-tuned softmax -> top -> all with the baseline's dropout in both layers and the softmax phase's
    own first rate."""
    from ksae_cupy.cli.data import data_command
    from ksae_cupy.cli.finetune import finetune_command
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.datasets.user_files import DataSpec
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint
    from ksae_cupy.supervised.pretrain import write_codes

    layer1, layer2, features, out = (tmp_path / name for name in ("layer1", "layer2", "features.npy", "ft"))
    invoke(common(labelled_rows_file, "dropout-ae") + ["--epochs", "2", "--run-dir", layer1, "--quiet"])
    wrote = CliRunner().invoke(data_command, ["codes", str(layer1), str(features)], catch_exceptions=False)
    assert wrote.exit_code == 0 and f"wrote {features}: 490 x 12 dense float32" in wrote.output, wrote.output
    info = write_codes(layer1, tmp_path / "again.npy")
    assert np.load(tmp_path / "again.npy").tobytes() == np.load(features).tobytes()
    config1, ckpt1 = RunFolder(layer1).read_config(), load_baseline_checkpoint(layer1 / "checkpoint.h5")
    X_train = load_dataset(DataSpec.from_record(config1["dataset"], config1["data"])).X_train
    expected = 1 / (1 + np.exp(-(X_train.astype(np.float64) @ ckpt1.params["W_dh"] + ckpt1.params["b_h"])))
    written = np.load(features)
    assert info["alpha"] is None and info["shape"] == [len(X_train), 12] and written.dtype == np.float32
    np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-6)  # every unit of the uncorrupted input
    invoke([features, "--model", "dropout-ae", "--hidden", "8", "--batch-size", "50", "--device", "cpu",
            "--threads", "1", "--lr", "0.01", "--seed", "1", "--epochs", "2", "--run-dir", layer2, "--quiet"])
    result = CliRunner().invoke(finetune_command, [str(layer1), str(layer2), "--epochs", "2", "--batch-size", "50",
                                                   "--device", "cpu", "--lr-start", "0.1", "--lr-end", "0.01",
                                                   "--softmax-lr-start", "0.03", "--run-dir", str(out)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    config = RunFolder(out).read_config()
    assert config["finetune"]["activations"] == ["sigmoid", "sigmoid"] and config["finetune"]["kept"] == [None, None]
    assert config["finetune"]["phases"] == ["softmax", "top", "all"] and config["finetune"]["hidden_dropout"] == 0.5
    assert [source["model"] for source in config["pretrained"]] == ["dropout-ae", "dropout-ae"]
    params = load_finetune_checkpoint(out / "checkpoint.h5")["params"]
    assert params["W1_dh"].shape == (16, 12) and params["W2_hh"].shape == (12, 8)
    first_rates = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        first_rates.setdefault(record["phase"], record["lr"])
    assert first_rates == pytest.approx({"softmax": 0.03, "top": 0.1, "all": 0.1})
    assert 0 <= json.loads((out / "finetune.json").read_text())["test_error"] <= 1


def test_a_baseline_stack_is_one_baseline_and_not_mixed_with_k_sparse_layers(labelled_rows_file, tmp_path):
    from ksae_cupy.cli.data import data_command
    from ksae_cupy.cli.finetune import finetune_command
    from ksae_cupy.cli.train import train_command
    from ksae_cupy.supervised.pretrain import write_codes

    layer1, layer2, ksparse = tmp_path / "layer1", tmp_path / "layer2", tmp_path / "ksparse"
    invoke(common(labelled_rows_file, "dropout-ae") + ["--epochs", "1", "--run-dir", layer1, "--quiet"])
    write_codes(layer1, tmp_path / "features.npy")
    invoke([tmp_path / "features.npy", "--model", "rbm", "--hidden", "8", "--batch-size", "50", "--device", "cpu",
            "--epochs", "1", "--run-dir", layer2, "--quiet"])
    other = CliRunner().invoke(finetune_command, [str(layer1), str(layer2), "--device", "cpu", "--run-dir",
                                                  str(tmp_path / "a")], catch_exceptions=False)
    assert_one_line_error(other, f"{layer2} is a rbm run but layer 1 ({layer1}) is a dropout-ae run",
                          "one baseline throughout", status=2)
    for args, fragments in ((["codes", str(layer1), str(tmp_path / "f.txt")], ["OUT", "f.txt", "name an .npy file"]),
                            (["codes", str(tmp_path / "none"), str(tmp_path / "f.npy")], ["no such run folder"]),
                            (["codes", str(layer1), str(tmp_path / "f.npy"), "--alpha", "0"], ["--alpha 0.0"])):
        assert_one_line_error(CliRunner().invoke(data_command, args, catch_exceptions=False), *fragments)
        assert not (tmp_path / "f.npy").exists() and not (tmp_path / "f.txt").exists()
    trained = CliRunner().invoke(train_command, [str(labelled_rows_file), "--hidden", "12", "--k", "3", "--epochs", "1",
                                                 "--batch-size", "50", "--device", "cpu", "--run-dir", str(ksparse),
                                                 "--quiet"], catch_exceptions=False)
    assert trained.exit_code == 0, trained.output
    mixed = CliRunner().invoke(finetune_command, [str(ksparse), str(layer1), "--device", "cpu", "--run-dir",
                                                  str(tmp_path / "b")], catch_exceptions=False)
    assert_one_line_error(mixed, "mix k-sparse and baseline layers", f"{layer1} (ksae-baseline)",
                          f"{ksparse} (ksae-train)", status=2)
