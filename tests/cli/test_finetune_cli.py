"""ksae-finetune: a tiny end-to-end run on the synthetic dataset, resume, and every bad input."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.finetune import finetune_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.supervised.baseline_trainer import load_baseline_checkpoint
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.session.runs import RunFolder
from clicheck import assert_one_line_error

FINETUNE = [sys.executable, "-c", "from ksae_cupy.cli.finetune import finetune_command; finetune_command()"]
ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1",
           OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
QUICK = ["--epochs", "1", "--batch-size", "500", "--device", "cpu", "--lr-start", "0.1", "--lr-end", "0.01"]


def make_run(path, D, H, k, seed=0, dataset="synthetic"):
    """A tiny pretrained ksae-train run folder (checkpoint.h5 and config.json)."""
    X = np.random.default_rng(seed).standard_normal((200, D)).astype(np.float32)
    model = KSparseAutoencoder(n_hidden=H, k=k, k_start=None, epochs=1, batch_size=100, device="cpu", seed=seed)
    model.fit(X)
    folder = RunFolder(path)
    folder.create()
    model.save(folder.checkpoint)
    folder.write_config({"dataset": dataset, "train": model.config().to_dict()})
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    return {"a": make_run(root / "a", D=64, H=20, k=4), "b": make_run(root / "b", D=20, H=12, k=3),
            "c": make_run(root / "c", D=64, H=10, k=4), "d": make_run(root / "d", D=16, H=8, k=2)}


def invoke(args, expect):
    result = CliRunner().invoke(finetune_command, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == expect, result.output
    return result


def test_deep_run_writes_results_and_resume_of_a_finished_run_is_idempotent(runs, tmp_path):
    out = tmp_path / "ft"
    invoke([runs["a"], runs["b"], "--alpha", "2", "--run-dir", out, *QUICK], expect=0)
    results = json.loads((out / "finetune.json").read_text())
    assert results["phases"] == ["softmax", "top", "all"] and results["kept"] == [8, 6]
    assert 0 <= results["valid_error"] <= 1 and 0 <= results["test_error"] <= 1
    assert len(RunFolder(out).read_metrics()) == 3
    # every phase's device, not only the last session's (a run resumed on another device ran on two)
    assert results["phase_devices"] == {"softmax": ["cpu"], "top": ["cpu"], "all": ["cpu"]}
    assert [record["device"] for record in RunFolder(out).read_metrics()] == ["cpu"] * 3
    config = RunFolder(out).read_config()
    assert [p["run_dir"] for p in config["pretrained"]] == [str(runs["a"]), str(runs["b"])]
    # the pretrained runs' recipe, for reports that tell the paper's from runs beyond it (bin/paper-tables)
    assert [(p["activation"], p["aux_k"], p["center_input"]) for p in config["pretrained"]] == [("linear", 0, False)] * 2
    invoke(["--resume", out, "--device", "cpu"], expect=0)
    again = json.loads((out / "finetune.json").read_text())
    assert again["test_error"] == results["test_error"]


def test_no_pretraining_run(tmp_path):
    out = tmp_path / "ft"
    invoke(["--no-pretraining", "--hidden", "16", "--k", "3", "--dataset", "synthetic", "--run-dir", out, *QUICK],
           expect=0)
    assert json.loads((out / "finetune.json").read_text())["kept"] == [9]


def test_no_pretraining_plain_relu_net_keeps_every_unit(tmp_path):
    """--units relu: Table fn_mnist's "without pre-training" row read as a plain ReLU network."""
    out = tmp_path / "ft"
    invoke(["synthetic", "--no-pretraining", "--units", "relu", "--hidden", "16", "--run-dir", out, *QUICK], expect=0)
    results = json.loads((out / "finetune.json").read_text())
    assert results["kept"] == [None] and 0 <= results["test_error"] < 1
    config = json.loads((out / "config.json").read_text())
    assert config["units"] == "relu" and config["finetune"]["activations"] == ["relu"]



def test_train_on_train_plus_valid_fine_tunes_on_both_and_reports_no_validation_error(runs, tmp_path):
    """--train-on train+valid (beyond the paper's stated split): the validation rows join the training rows,
    so no validation error is reported anywhere; the choice is the run's, recorded and kept on --resume."""
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.supervised.finetune import FinetuneConfig
    from ksae_cupy.supervised.finetune_run import training_rows

    data = load_dataset("synthetic")
    both, train = FinetuneConfig(train_on="train+valid"), FinetuneConfig(train_on="train")
    assert both.fits_valid_rows and not train.fits_valid_rows
    X_nd, y_n, X_valid_nd, y_valid_n = training_rows(data, both)
    assert X_valid_nd is None and y_valid_n is None
    np.testing.assert_array_equal(X_nd, np.concatenate([data.X_train, data.X_valid]))
    np.testing.assert_array_equal(y_n, np.concatenate([data.y_train, data.y_valid]))
    assert training_rows(data, train)[2] is data.X_valid

    out = tmp_path / "ft"
    result = invoke([runs["a"], "synthetic", "--train-on", "train+valid", "--run-dir", out, *QUICK, "--epochs", "2"],
                    expect=0)
    rows = len(data.X_train) + len(data.X_valid)
    assert f"fine-tuning on train+valid: {rows} rows" in result.output
    epoch_lines = [line for line in result.output.splitlines() if line.startswith("phase ")]
    assert len(epoch_lines) == 2 and not any("valid" in line for line in epoch_lines)
    results = json.loads((out / "finetune.json").read_text())
    assert results["train_on"] == "train+valid" and results["valid_error"] is None
    assert 0 <= results["test_error"] < 1 and "done: test error" in result.output
    assert json.loads((out / "config.json").read_text())["finetune"]["train_on"] == "train+valid"
    refused = invoke(["--resume", out, "--train-on", "train"], expect=2)
    assert "--train-on cannot change a run in progress" in refused.output

@pytest.mark.parametrize("args,message", [
    (["--units", "relu", "--k", "3"], "--k does not apply with --units relu"),
    (["--units", "relu", "--baseline", "rbm"], "--units relu only applies with --no-pretraining"),
])
def test_plain_relu_net_refuses_what_does_not_apply(tmp_path, args, message):
    extra = [] if "--baseline" in args else ["--no-pretraining"]
    result = invoke(["synthetic", *extra, *args, "--hidden", "16", "--run-dir", tmp_path / "ft", *QUICK], expect=2)
    assert message in result.output and not (tmp_path / "ft").exists()


def test_epoch_lines_carry_an_eta_per_phase_until_the_run_is_done(runs, tmp_path):
    out = tmp_path / "ft"
    result = invoke([runs["a"], runs["b"], "--alpha", "2", "--run-dir", out, *QUICK, "--epochs", "2"], expect=0)
    lines = [line for line in result.output.splitlines() if line.startswith("phase ")]
    assert [line.split()[1] + " " + line.split()[3] for line in lines] == [
        "softmax 1/2", "softmax 2/2", "top 1/2", "top 2/2", "all 1/2", "all 2/2"]
    assert "for this phase, then 2 more phases" in lines[0]  # later phases are not guessed at
    assert "for this phase, then 1 more phase" in lines[2] and "then" not in lines[4]
    assert "  ETA " in lines[4] and "ETA" not in lines[-1]


def test_phase_pace_weighs_each_phase_by_its_own_epochs():
    from types import SimpleNamespace

    from ksae_cupy.supervised.finetune_progress import PhasePace

    pace = PhasePace(["softmax", "top", "all"], epochs=10)
    trainer = SimpleNamespace(finished=False, phase="all", phase_index=2, epoch=4)
    assert pace.eta(trainer) == ""  # nothing timed in this phase yet
    pace.add(SimpleNamespace(phase="softmax", seconds=1.0))
    for seconds in (5.0, 7.0):
        pace.add(SimpleNamespace(phase="all", seconds=seconds))
    assert pace.eta(trainer) == "36s"  # 6 epochs left at 6 s, the softmax phase's pace not mixed in
    assert pace.eta(SimpleNamespace(finished=True, phase_index=3, epoch=0)) == ""


def test_kill_9_then_resume_ends_where_an_uninterrupted_run_does(runs, tmp_path):
    """A deep run checkpointing after every batch (--checkpoint-minutes 1e-9) holds still after it logs
    epoch 2 of its first phase (tests/heldrun.py) and is killed there with SIGKILL (no handler runs);
    --resume ends with the very parameters of the run that was never interrupted. The kill waits
    for that event, not a clock, so it lands mid-run however loaded the machine."""
    from heldrun import held_train, wait_until_held

    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    common = [str(runs["a"]), str(runs["b"]), "--alpha", "2", "--epochs", "4", "--batch-size", "100",
              "--device", "cpu", "--lr-start", "0.1", "--lr-end", "0.01", "--threads", "1"]
    whole = subprocess.run(FINETUNE + common + ["--quiet", "--run-dir", str(tmp_path / "whole")], capture_output=True,
                           text=True, env=ENV, timeout=600)
    assert whole.returncode == 0, whole.stderr
    killed = tmp_path / "killed"
    proc = subprocess.Popen(held_train(2, checkpoint=True, command="finetune") + common + [
        "--run-dir", str(killed), "--checkpoint-minutes", "1e-9"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=ENV)
    assert wait_until_held(proc) == 2
    proc.kill()
    proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL
    state = load_finetune_checkpoint(killed / "checkpoint.h5")
    assert state["phase_index"] == 0 and state["epoch"] < 4  # mid-run: two phases and more to go
    resumed = subprocess.run(FINETUNE + ["--resume", str(killed), "--device", "cpu", "--quiet"], capture_output=True,
                             text=True, env=ENV, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    expected = load_finetune_checkpoint(tmp_path / "whole" / "checkpoint.h5")["params"]
    got = load_finetune_checkpoint(killed / "checkpoint.h5")["params"]
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].tobytes() == value.tobytes(), name
    assert (json.loads((killed / "finetune.json").read_text())["test_error"]
            == json.loads((tmp_path / "whole" / "finetune.json").read_text())["test_error"])


@pytest.mark.parametrize("baseline,hidden,regularisation", [
    ("denoising-ae", "16", {"input_dropout": 0.2, "hidden_dropout": 0.0}),
    ("dropout-ae", "16,8", {"input_dropout": 0.0, "hidden_dropout": 0.5}),
    ("dropout-denoising-ae", "16", {"input_dropout": 0.2, "hidden_dropout": 0.5}),
])
def test_baseline_pretrained_here_then_fine_tuned_with_its_dropout(tmp_path, baseline, hidden, regularisation):
    out = tmp_path / "ft"
    shown = invoke(["--baseline", baseline, "--hidden", hidden, "--pretrain-epochs", "1", "--dataset", "synthetic",
                    "--run-dir", out, *QUICK], expect=0).output
    L = len(hidden.split(","))
    # each layer is a ksae-baseline run folder inside the run's, with its checkpoint and every epoch's metrics
    for layer in range(1, L + 1):
        folder = out / f"pretrain-layer{layer}"
        assert f"pretraining layer {layer} ({baseline}," in shown and f"run folder {folder}" in shown
        assert load_baseline_checkpoint(folder / "checkpoint.h5").epoch == 1
        assert [r["epoch"] for r in RunFolder(folder).read_metrics()] == [1]
        assert RunFolder(folder).read_config()["kind"] == "ksae-baseline"
    results = json.loads((out / "finetune.json").read_text())
    assert results["kept"] == [None] * L and 0 <= results["test_error"] <= 1
    config = RunFolder(out).read_config()
    assert config["baseline"] == baseline and config["pretrain_epochs"] == 1
    assert config["finetune"]["activations"] == ["sigmoid"] * L
    assert {k: config["finetune"][k] for k in regularisation} == regularisation
    # each layer's pretraining settings, recorded: an autoencoder's upper layers start at sigma 0.1
    layers = config["pretrain_layers"]
    assert [layer["hidden"] for layer in layers] == [int(h) for h in hidden.split(",")]
    assert [layer["sigma"] for layer in layers] == ([0.01] * L if baseline == "rbm" else [0.01, 0.1][:L])
    assert len(config["pretrain_seconds"]) == L and all(seconds > 0 for seconds in config["pretrain_seconds"])
    again = invoke(["--resume", out, "--device", "cpu"], expect=0).output  # a finished run: no pretraining again
    assert "pretraining layer" not in again
    assert json.loads((out / "finetune.json").read_text())["test_error"] == results["test_error"]
    if L == 1:  # layer 1 is a baseline run of the fine-tuning run's data: ksae-eval classifies its features
        from ksae_cupy.cli.evaluate import eval_command

        evaluated = CliRunner().invoke(eval_command, [str(out / "pretrain-layer1"), "--device", "cpu", "--l2", "1e-3",
                                                      "--l2-extend", "0", "--quiet"], catch_exceptions=False)
        assert evaluated.exit_code == 0, evaluated.output
        report = json.loads((out / "pretrain-layer1" / "eval.json").read_text())
        assert report["dataset"] == "synthetic" and 0 <= report["features"]["test_error"] <= 1


@pytest.mark.parametrize("held_epoch", [1, 3])
def test_baseline_stopped_while_pretraining_resumes_there_and_ends_bit_identical(tmp_path, held_epoch):
    """SIGTERM while --baseline pretrains layer 1 (at epoch 1 of 3, or at its last epoch, where the layer is
    done but the session must still stop): the layer's checkpoint is saved, the stop line tells to resume
    the fine-tuning run, and that resume goes on pretraining (layer 1 from its checkpoint, then layer 2)
    and fine-tunes to the very parameters of a run that was never stopped. The signal waits for the
    run to hold at the epoch (tests/heldrun.py): an event, not a clock."""
    from heldrun import held_train, wait_until_held

    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    common = ["synthetic", "--baseline", "dropout-ae", "--hidden", "16,8", "--pretrain-epochs", "3", "--epochs", "1",
              "--batch-size", "500", "--device", "cpu", "--lr-start", "0.1", "--lr-end", "0.01", "--threads", "1"]
    whole = subprocess.run(FINETUNE + common + ["--quiet", "--run-dir", str(tmp_path / "whole")], capture_output=True,
                           text=True, env=ENV, timeout=600)
    assert whole.returncode == 0, whole.stderr
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(held_train(held_epoch, command="finetune") + common + ["--run-dir", str(stopped)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    assert wait_until_held(proc) == held_epoch
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)  # closes stdin: the run goes on and stops
    assert proc.returncode == 128 + signal.SIGTERM, err
    layer1 = stopped / "pretrain-layer1"
    assert err.splitlines()[-1] == (f"interrupted in pretraining layer 1, after epoch {held_epoch}; checkpoint saved "
                                    f"to {layer1 / 'checkpoint.h5'}; continue with: ksae-finetune --resume {stopped}")
    assert load_baseline_checkpoint(layer1 / "checkpoint.h5").epoch == held_epoch
    assert not (stopped / "pretrain-layer2").exists() and not (stopped / "checkpoint.h5").exists()
    # --topk is applied on a resume, as to a checkpoint (the same math: sigmoid layers keep every unit)
    resumed = subprocess.run(FINETUNE + ["--resume", str(stopped), "--topk", "threshold"], capture_output=True,
                             text=True, env=ENV, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert RunFolder(stopped).read_config()["finetune"]["topk"] == "threshold"
    assert ("pretraining layer 1: done earlier" in resumed.stdout) == (held_epoch == 3)
    assert [r["epoch"] for r in RunFolder(layer1).read_metrics()] == [1, 2, 3]
    expected = load_finetune_checkpoint(tmp_path / "whole" / "checkpoint.h5")["params"]
    got = load_finetune_checkpoint(stopped / "checkpoint.h5")["params"]
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert got[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("case,fragments", [
    ("unknown_run", ["no such run folder"]),
    ("mismatch", ["layer 2 takes 20 inputs", "10 hidden units"]),
    ("alpha_too_big", ["alpha*k", "exceeds the 20 hidden units"]),
    ("wrong_dim", ["takes 16 dimensions", "64"]),
    ("three_runs", ["3 pretrained runs"]),
    ("none", ["missing PRETRAINED_RUN_DIR"]),
    ("both", ["--no-pretraining contradicts"]),
    ("phases", ["--phases 'bottom'"]),
    ("epochs", ["--epochs 0"]),
    ("momentum", ["--momentum 1.0"]),
    ("unlabelled", ["has no labels"]),
    ("resume_missing", ["--resume", "no such run folder"]),
    ("resume_options", ["--resume: --epochs", "leave them out"]),
    ("baseline_and_run", ["--baseline rbm contradicts the PRETRAINED_RUN_DIR"]),
    ("baseline_and_random", ["--baseline rbm contradicts --no-pretraining"]),
    ("baseline_epochs", ["--pretrain-epochs 0", "positive"]),
    ("checkpoint_minutes", ["--checkpoint-minutes -1", "minutes >= 0"]),
    ("rbm_on_signed_data", ["the RBM's input holds values in", "only values in [0, 1]"]),
    ("input_dropout", ["--input-dropout 1.0", "0 <= rate < 1"]),
    ("hidden_dropout_before_pretraining", ["--hidden-dropout -0.5", "0 <= rate < 1"]),
])
def test_bad_input_is_one_line_and_exit_2(runs, tmp_path, case, fragments):
    out = tmp_path / "ft"
    a, b, c, d = runs["a"], runs["b"], runs["c"], runs["d"]
    if case == "unlabelled":
        np.save(tmp_path / "x.npy", make_sparse_signals(300, D=64, seed=0)[0])
    args = {
        "unknown_run": [tmp_path / "nope"],
        "mismatch": [c, b],
        "alpha_too_big": [a, "--alpha", "6"],
        "wrong_dim": [d],
        "three_runs": [a, b, b],
        "none": [],
        "both": [a, "--no-pretraining"],
        "phases": [a, "--phases", "bottom"],
        "epochs": [a, "--epochs", "0"],
        "momentum": [a, "--momentum", "1"],
        "unlabelled": [a, "--dataset", tmp_path / "x.npy"],
        "resume_missing": ["--resume", tmp_path / "nope"],
        "resume_options": ["--resume", tmp_path / "nope"],
        "baseline_and_run": [a, "--baseline", "rbm"],
        "baseline_and_random": ["--no-pretraining", "--baseline", "rbm", "--dataset", "synthetic"],
        "baseline_epochs": ["--baseline", "rbm", "--pretrain-epochs", "0", "--dataset", "synthetic"],
        "checkpoint_minutes": [a, "--checkpoint-minutes", "-1"],
        "rbm_on_signed_data": ["--baseline", "rbm", "--hidden", "8", "--pretrain-epochs", "1", "--dataset",
                               "synthetic"],
        "input_dropout": [a, "--input-dropout", "1"],
        "hidden_dropout_before_pretraining": ["--baseline", "dropout-ae", "--hidden", "8", "--pretrain-epochs", "1",
                                              "--dataset", "synthetic", "--hidden-dropout", "-0.5"],
    }[case]
    # The case's own options come last, so they win over QUICK's.
    quick = ["--device", "cpu"] if case.startswith("resume") else [*QUICK, "--run-dir", out]
    if case == "resume_options":
        quick += ["--epochs", "3"]
    result = invoke([*quick, *args], expect=2)
    assert_one_line_error(result, *fragments)
    assert not (out / "checkpoint.h5").exists()
    assert not (out / "pretrain-layer1").exists()  # nothing pretrained before a bad option is named


def test_dropout_options_replace_the_baselines_own_rates_and_reach_each_step(runs, tmp_path):
    """--input-dropout / --hidden-dropout: in place of a baseline's own rates (here the dropout AE's 50% hidden
    dropout becomes 20% input dropout alone), or added to a k-sparse net (which then takes the dense step); the
    masks reach the update: the same seed without them ends at other weights."""
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    out = tmp_path / "baseline"
    invoke(["--baseline", "dropout-ae", "--hidden", "16", "--pretrain-epochs", "1", "--dataset", "synthetic",
            "--run-dir", out, *QUICK, "--input-dropout", "0.2", "--hidden-dropout", "0"], expect=0)
    tuned = RunFolder(out).read_config()["finetune"]
    assert (tuned["input_dropout"], tuned["hidden_dropout"]) == (0.2, 0.0)
    weights = {}
    for name, extra in (("plain", []), ("input", ["--input-dropout", "0.2"]), ("hidden", ["--hidden-dropout", "0.5"])):
        folder = tmp_path / name
        invoke([runs["a"], "--alpha", "2", "--run-dir", folder, *QUICK, *extra], expect=0)
        tuned = RunFolder(folder).read_config()["finetune"]
        assert (tuned["input_dropout"], tuned["hidden_dropout"]) == {"plain": (0.0, 0.0), "input": (0.2, 0.0),
                                                                      "hidden": (0.0, 0.5)}[name]
        weights[name] = load_finetune_checkpoint(folder / "checkpoint.h5")["params"]["W1_dh"]
    assert not np.allclose(weights["plain"], weights["input"]) and not np.allclose(weights["plain"], weights["hidden"])


def test_dataset_is_an_argument_as_in_ksae_train_and_topk_and_overwrite_are_offered(tmp_path):
    out = tmp_path / "ft"
    small = ["--no-pretraining", "--hidden", "16", "--k", "4", *QUICK, "--run-dir", out]
    invoke(["synthetic", *small, "--topk", "threshold"], expect=0)
    config = RunFolder(out).read_config()
    assert config["dataset"] == "synthetic" and config["finetune"]["topk"] == "threshold"
    refused = invoke(["synthetic", *small], expect=2)  # the folder holds that run now
    assert_one_line_error(refused, "already holds a run")
    invoke(["--dataset", "synthetic", *small, "--overwrite"], expect=0)  # the old spelling still works
    assert RunFolder(out).read_config()["finetune"]["topk"] == "sort"
    assert_one_line_error(invoke(["synthetic", "mnist", *small], expect=2), "2 datasets given")


def test_a_pretrained_run_that_names_no_dataset_needs_dataset(runs, tmp_path):
    run = tmp_path / "nameless"
    shutil.copytree(runs["a"], run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "dataset": None}))
    assert_one_line_error(invoke([run, *QUICK, "--run-dir", tmp_path / "ft"], expect=2), "missing DATASET")
    invoke(["synthetic", run, *QUICK, "--run-dir", tmp_path / "ft"], expect=0)  # DATASET given: it trains


def test_progress_lines_name_the_phase_and_the_batch(runs, tmp_path):
    """Off a terminal, --progress-seconds 0 gives a line after every batch (on stderr), worded by phase."""
    result = CliRunner().invoke(finetune_command, [str(runs["a"]), str(runs["b"]), *map(str, QUICK),
                                                   "--progress-seconds", "0", "--run-dir", str(tmp_path / "ft")])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("  phase ")]
    n_batches = len([1 for line in lines if line.startswith("  phase softmax epoch 1/1  batch ")])
    assert n_batches >= 2 and lines[0].startswith("  phase softmax epoch 1/1  batch 1/")
    assert any(line.startswith("  phase all epoch 1/1  batch ") and "samples/s  ETA " in line for line in lines)
    assert json.loads((tmp_path / "ft" / "config.json").read_text())["progress_seconds"] == 0


def test_baseline_overwrite_pretrains_again_and_a_foreign_layer_is_refused_on_resume(tmp_path):
    """A new --baseline run never takes up the layers an earlier run left in its folder: without --overwrite
    it is refused, with it the layers train again (their epoch count is the new run's); a resume refuses a
    layer checkpoint whose settings are not the run's (one copied in from another run)."""
    out = tmp_path / "ft"
    args = ["--baseline", "dropout-ae", "--hidden", "16", "--dataset", "synthetic", "--run-dir", out, *QUICK]
    invoke(args + ["--pretrain-epochs", "2"], expect=0)
    (out / "finetune.json").unlink()
    (out / "checkpoint.h5").unlink()
    (out / "config.json").unlink()
    (out / "metrics.jsonl").unlink()
    assert_one_line_error(invoke(args + ["--pretrain-epochs", "1"], expect=2),
                          f"{out / 'pretrain-layer1'} holds an earlier run's pretraining", "--overwrite")
    invoke(args + ["--pretrain-epochs", "1", "--overwrite"], expect=0)
    assert load_baseline_checkpoint(out / "pretrain-layer1" / "checkpoint.h5").epoch == 1
    other = tmp_path / "other"
    invoke(["--baseline", "denoising-ae", "--hidden", "16", "--dataset", "synthetic", "--run-dir", other,
            "--pretrain-epochs", "1", *QUICK], expect=0)
    for name in ("checkpoint.h5", "finetune.json"):
        (out / name).unlink()  # as if stopped before fine-tuning began
    shutil.copy(other / "pretrain-layer1" / "checkpoint.h5", out / "pretrain-layer1" / "checkpoint.h5")
    shutil.copy(other / "pretrain-layer1" / "config.json", out / "pretrain-layer1" / "config.json")
    assert_one_line_error(invoke(["--resume", out], expect=2), "is not the layer this run pretrains",
                          "input_dropout 0.2 (config.json: 0.0)")


def test_phase_devices_name_each_device_a_phase_ran_on_in_the_order_met():
    from ksae_cupy.supervised.finetune_run import phase_devices

    records = [{"phase": "softmax", "device": "gpu:0"}, {"phase": "top", "device": "gpu:0"},
               {"phase": "top", "device": "cpu"}, {"phase": "all", "device": "cpu"}, {"phase": "all"}]
    assert phase_devices(records) == {"softmax": ["gpu:0"], "top": ["gpu:0", "cpu"], "all": ["cpu", "unknown"]}
