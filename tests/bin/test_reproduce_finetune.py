"""bin/reproduce-finetune: Table fn_mnist as resumable steps (ksae-train, the codes, ksae-finetune in
child processes), tiny on the synthetic dataset; and write_codes, which feeds layer 2 its codes.

Interruptions are sent on an event, never after a clock: the step to stop holds still after an epoch
(tests/heldsteps/sitecustomize.py, reaching the script's children through PYTHONPATH) until the signal
has reached it, the same on a quiet or a loaded machine.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ksae_cupy.datasets import load_dataset
from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint
from ksae_cupy.supervised.pretrain import write_codes
from ksae_cupy.training.checkpoint import load_checkpoint
from ksae_cupy.training.estimator import KSparseAutoencoder
from ksae_cupy.session.runlock import check_unlocked
from ksae_cupy.session.runs import RunFolder

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bin" / "reproduce-finetune"
ENV = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
           OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
ROWS = ["no_pretraining", "ksparse", "deep_ksparse"]
# The script's children, with KSAE_TEST_HOLD set, hold still after an epoch until signalled.
HELD_STEPS = REPO / "tests" / "heldsteps"
TINY = ["--dataset", "synthetic", "--hidden", "16", "--k", "3", "--pretrain-epochs", "2", "--epochs", "2",
        "--rows", ",".join(ROWS), "--threads", "1", "--device", "cpu"]
# Long enough that a step stopped after its first or second epoch has epochs left to continue.
LONGER = ["--dataset", "synthetic", "--hidden", "16", "--k", "3", "--pretrain-epochs", "30", "--epochs", "10",
          "--rows", "deep_ksparse", "--threads", "1", "--device", "cpu"]
TIMEOUT = 900  # against a hang only: a tiny run takes ~25 s, far longer on a loaded 2-core machine


def reproduce(out: Path, *args: str):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), *args], env=ENV, capture_output=True,
                          text=True, timeout=TIMEOUT)
    return SimpleNamespace(status=proc.returncode, stdout=proc.stdout, stderr=proc.stderr,
                           output=proc.stdout + proc.stderr)


def table(out: Path) -> dict:
    return json.loads((out / "table_fn_mnist.json").read_text())


def rows_of(out: Path) -> list[dict]:
    return table(out)["rows"]


def run_files(out: Path) -> dict:
    """Every metrics.jsonl and checkpoint under OUT, with its bytes: what training would change."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.name in ("metrics.jsonl", "checkpoint.h5", "finetune.json")}


def epochs_logged(run_dir: Path) -> list:
    return [(r.get("phase"), r["epoch"]) for r in RunFolder(run_dir).read_metrics()]


def commands_started(output: str) -> list[str]:
    return [line.strip()[2:].split()[0] for line in output.splitlines() if line.strip().startswith("$ ")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("fn") / "out"
    result = reproduce(out, *TINY)
    assert result.status == 0, result.output
    return out, result


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The deep row, uninterrupted, at LONGER's sizes."""
    out = tmp_path_factory.mktemp("fn-reference") / "out"
    result = reproduce(out, *LONGER)
    assert result.status == 0, result.output
    return out


def test_a_full_run_writes_every_row_from_its_run_folders(finished):
    out, result = finished
    rows = {r["key"]: r for r in rows_of(out)}
    assert list(rows) == ROWS
    for key, r in rows.items():
        assert r["status"] == "done" and 0 <= r["test_error"] <= 1 and 0 <= r["valid_error"] <= 1, r
        assert r["test_error"] == json.loads((out / "finetune" / key / "finetune.json").read_text())["test_error"]
        assert r["finetune"]["threads"] == 1 and r["finetune"]["step_kind"] in ("sparse", "dense")
        assert r["finetune"]["seconds"] > 0 and r["finetune"]["epochs_per_phase"] == 2
    assert rows["no_pretraining"]["pretraining"] == [] and rows["ksparse"]["finetune"]["phases"] == ["all"]
    assert rows["deep_ksparse"]["finetune"]["phases"] == ["softmax", "top", "all"]
    assert rows["deep_ksparse"]["finetune"]["epochs_done"] == 6
    layer1, layer2 = rows["deep_ksparse"]["pretraining"]
    assert layer1["run_dir"] == str(out / "pretrain" / "ksparse1") and layer1["epochs_trained"] == 2
    assert layer2["run_dir"] == str(out / "pretrain" / "ksparse2") and layer2["epochs_trained"] == 2
    assert layer2["lr_auto"] is True and layer2["lr"] > 0  # ksae-train's default for a file, recorded
    assert layer2["codes"]["alpha"] == 3.0 and layer2["codes"]["shape"] == [10_000, 16]
    assert rows["deep_ksparse"]["pretrain_seconds"] == pytest.approx(layer1["seconds"] + layer2["seconds"])
    assert layer1["seconds"] == pytest.approx(
        sum(r["seconds"] for r in RunFolder(out / "pretrain" / "ksparse1").read_metrics()))
    md = (out / "table_fn_mnist.md").read_text()
    for name in ("Without Pre-Training", "k-Sparse AE + F.T.", "Deep k-Sparse AE + F.T."):
        assert name in md
    assert "2 x 3" in md and "ksparse1: 2, ksparse2: 2" in md
    # Each step was a child command, in its own folder, its output logged.
    assert commands_started(result.stdout) == ["ksae-finetune", "ksae-train", "ksae-finetune", "ksae-train",
                                               "ksae-finetune"]
    assert sorted(p.name for p in (out / "logs").iterdir()) == [
        "finetune-deep_ksparse.log", "finetune-ksparse.log", "finetune-no_pretraining.log",
        "pretrain-ksparse1.log", "pretrain-ksparse2.log"]
    assert not list(out.rglob("*.tmp"))


def test_the_same_command_again_trains_nothing_and_rewrites_the_same_table(finished):
    out, _ = finished
    before, rows_before = run_files(out), rows_of(out)
    again = reproduce(out, *TINY)
    assert again.status == 0, again.output
    assert commands_started(again.stdout) == []
    assert run_files(out) == before
    assert rows_of(out) == rows_before


def test_collect_only_writes_the_table_and_trains_nothing(finished, tmp_path):
    out, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for name in ("table_fn_mnist.md", "table_fn_mnist.json"):
        (copy / name).unlink()
    before = run_files(copy)
    result = reproduce(copy, *TINY, "--collect-only")
    assert result.status == 0, result.output
    assert commands_started(result.stdout) == [] and run_files(copy) == before
    assert [r["test_error"] for r in rows_of(copy)] == [r["test_error"] for r in rows_of(out)]
    assert "| Without Pre-Training (k-sparse units, alpha*k = 75 kept) |" in result.stdout  # the script's row: --k 25

    empty = reproduce(tmp_path / "nothing", *TINY, "--collect-only")
    assert empty.status == 0, empty.output
    assert [r["status"] for r in rows_of(tmp_path / "nothing")] == ["not started"] * 3
    assert sorted(p.name for p in (tmp_path / "nothing").iterdir()) == ["table_fn_mnist.json", "table_fn_mnist.md"]


def test_a_given_layer_1_run_is_used_as_it_stands(finished, tmp_path):
    out, _ = finished
    layer1 = tmp_path / "my-run"
    shutil.copytree(out / "pretrain" / "ksparse1", layer1)
    before = run_files(layer1)
    result = reproduce(tmp_path / "out", *TINY[:-6], "--rows", "ksparse", "--threads", "1", "--device", "cpu",
                       "--ksparse1", str(layer1))
    assert result.status == 0, result.output
    assert commands_started(result.stdout) == ["ksae-finetune"] and run_files(layer1) == before
    (row,) = rows_of(tmp_path / "out")
    assert row["pretraining"][0]["run_dir"] == str(layer1) and row["pretraining"][0]["epochs_trained"] == 2
    # The same network as the row fine-tuned from OUT/pretrain/ksparse1 (a copy of it).
    assert row["test_error"] == next(r for r in rows_of(out) if r["key"] == "ksparse")["test_error"]


def test_a_diverged_row_is_recorded_and_the_other_rows_still_run(tmp_path):
    out = tmp_path / "out"
    args = [*TINY[:-6], "--rows", "no_pretraining,ksparse", "--lr-start", "1e30", "--threads", "1", "--device", "cpu"]
    result = reproduce(out, *args)
    assert result.status == 0, result.output
    # The first row diverged; the next one still pretrained and fine-tuned (and diverged too, at this rate).
    assert commands_started(result.stdout) == ["ksae-finetune", "ksae-train", "ksae-finetune"]
    for row in rows_of(out):
        assert row["status"] == "diverged" and "cross-entropy became nan" in row["diverged"], row
        assert "--lr-start" in json.loads((out / "finetune" / row["key"] / "diverged.json").read_text())["message"]
    assert "diverged: the cross-entropy became nan" in (out / "table_fn_mnist.md").read_text()
    again = reproduce(out, *args)  # recorded: not tried again
    assert again.status == 0 and commands_started(again.stdout) == [], again.output
    assert "(earlier; remove" in again.stdout


def stop_on(out: Path, args: list[str], hold: str, after: list[str], signum: int):
    """Start the script with its child for run ``hold`` ("RUN [PHASE] EPOCH") held still after that
    epoch until signalled; send ``signum`` once the script's output has shown the lines starting with
    each of ``after`` (the last: the child's ``held after epoch``), in order; return its exit status
    and output."""
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(HELD_STEPS), ENV["PYTHONPATH"]]), KSAE_TEST_HOLD=hold)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(out), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, waiting = [], list(after)
    try:
        for line in proc.stdout:
            seen.append(line)
            if waiting and line.strip().startswith(waiting[0]):
                waiting.pop(0)
                if not waiting:
                    proc.send_signal(signum)
                    if signum == signal.SIGKILL:
                        break
        status = proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not waiting, "".join(seen)
    return status, "".join(seen)


def wait_unlocked(folder: Path) -> None:
    """Until the child a killed script left behind has saved and gone (it holds the run's lock)."""
    from ksae_cupy.errors import KsaeError

    for _ in range(600):
        try:
            return check_unlocked(folder)
        except KsaeError:
            time.sleep(0.5)
    raise AssertionError(f"{folder} stayed locked")


@pytest.mark.parametrize("where, hold, after, signum, log", [
    ("layer 1", "ksparse1 1", ["$ ksae-train synthetic", "held after epoch 1 (ksparse1)"], signal.SIGTERM,
     "pretrain-ksparse1"),
    ("layer 2", "ksparse2 1", ["$ ksae-train", "codes: 10000", "$ ksae-train", "held after epoch 1 (ksparse2)"],
     signal.SIGINT, "pretrain-ksparse2"),
    ("layer 2, its codes deleted", "ksparse2 1", ["$ ksae-train", "codes: 10000", "$ ksae-train",
                                                  "held after epoch 1 (ksparse2)"], signal.SIGINT, "pretrain-ksparse2"),
    ("layer 2, its --out folder moved", "ksparse2 1", ["$ ksae-train", "codes: 10000", "$ ksae-train",
                                                       "held after epoch 1 (ksparse2)"], signal.SIGINT,
     "pretrain-ksparse2"),
    ("fine-tuning", "deep_ksparse top 1", ["$ ksae-finetune", "phase softmax epoch 10/10",
                                           "held after epoch 1 (deep_ksparse)"], signal.SIGTERM,
     "finetune-deep_ksparse"),
    ("fine-tuning, kill -9", "deep_ksparse all 1", ["$ ksae-finetune", "phase top epoch 10/10",
                                                    "held after epoch 1 (deep_ksparse)"], signal.SIGKILL,
     "finetune-deep_ksparse"),
])
def test_stopped_then_continued_ends_bit_identical_to_an_uninterrupted_run(reference, tmp_path, where, hold, after,
                                                                           signum, log):
    out = tmp_path / "out"
    status, output = stop_on(out, LONGER, hold, after, signum)
    deep = out / "finetune" / "deep_ksparse"
    if signum == signal.SIGKILL:
        assert status == -signal.SIGKILL
        wait_unlocked(deep)  # the child got SIGTERM when its parent died: it saves, then ends
    else:
        assert status == 128 + signum, output
        assert "to continue, give the same command again" in output
    # The child got the signal once (kill -9 of the script: SIGTERM from the kernel) and saved.
    said = (out / "logs" / f"{log}.log").read_text()
    name = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    assert f"{name}: stopping after this step and saving a checkpoint" in said
    assert "stopped at once" not in said and "Traceback" not in said
    # Stopped mid-step, with a checkpoint to go on from: right after the epoch it was held at.
    assert not (deep / "finetune.json").exists()
    if where == "layer 1":
        assert load_checkpoint(out / "pretrain" / "ksparse1" / "checkpoint.h5").epoch == 1
        assert not (out / "pretrain" / "ksparse2").exists()
    elif where.startswith("layer 2"):
        assert load_checkpoint(out / "pretrain" / "ksparse2" / "checkpoint.h5").epoch == 1
    else:
        assert (deep / "checkpoint.h5").is_file() and len(epochs_logged(deep)) < 30
        assert epochs_logged(deep)[-1] == (hold.split()[1], 1)
    if signum != signal.SIGKILL:  # the table, written on the way out
        status = rows_of(out)[0]["status"]
        assert status.startswith("not started (pretraining: ksparse1 ") if where.startswith("layer") else \
            status.startswith("in progress"), status

    if where == "layer 2, its --out folder moved":  # run folders record absolute paths; the data is found again
        out = out.rename(tmp_path / "moved")
        deep = out / "finetune" / "deep_ksparse"
    codes = out / "pretrain" / "ksparse1-codes.npy"
    if where == "layer 2, its codes deleted":  # 200 MB at the paper's sizes: a stopped run may drop them
        codes.unlink()
    again = reproduce(out, *LONGER)
    assert again.status == 0, again.output
    assert "--resume" in again.stdout
    if where.startswith("layer 2"):  # written again when deleted, else read as they are
        assert ("codes: writing" in again.stdout) == (where == "layer 2, its codes deleted"), again.stdout
    assert codes.is_file()
    row, expected = rows_of(out)[0], rows_of(reference)[0]
    assert row["status"] == "done" and row["test_error"] == expected["test_error"]
    assert row["valid_error"] == expected["valid_error"]
    assert epochs_logged(deep) == [(p, e) for p in ("softmax", "top", "all") for e in range(1, 11)]  # each once
    for name in ("ksparse1", "ksparse2"):
        assert [r["epoch"] for r in RunFolder(out / "pretrain" / name).read_metrics()] == list(range(1, 31))
    ours = load_finetune_checkpoint(deep / "checkpoint.h5")["params"]
    theirs = load_finetune_checkpoint(reference / "finetune" / "deep_ksparse" / "checkpoint.h5")["params"]
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert np.array_equal(ours[name], theirs[name]), name  # bit-identical with one thread


def test_bad_options_are_refused_before_any_work(tmp_path):
    for args, fragment in [(["--rows", "ksparse,nope"], "--rows"), (["--epochs", "0"], "--epochs 0"),
                           (["--ksparse1", str(tmp_path)], "--ksparse1"),
                           (["--ksparse2", str(tmp_path)], "--ksparse2 needs --ksparse1")]:
        result = reproduce(tmp_path / "out", *args)
        assert result.status == 2 and fragment in result.stderr, result.output
    assert not (tmp_path / "out").exists()


def test_a_step_started_with_other_settings_is_not_continued_with_these(finished, tmp_path):
    out, _ = finished
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "finetune" / "ksparse" / "finetune.json").unlink()  # as if stopped: it would be resumed
    result = reproduce(copy, *TINY[:-6], "--rows", "ksparse", "--lr-start", "0.5", "--threads", "1")
    assert result.status == 2, result.output
    assert "--lr-start 0.5 (the run has 1.0)" in result.stderr and commands_started(result.stdout) == []


# -- write_codes ----------------------------------------------------------------------------------------

def test_write_codes_gives_the_runs_transform_of_its_training_rows_and_leaves_no_temp_file(tmp_path):
    data = load_dataset("synthetic")
    model = KSparseAutoencoder(n_hidden=12, k=3, k_start=None, epochs=1, batch_size=500, device="cpu", seed=0)
    model.fit(data.X_train)
    folder = RunFolder(tmp_path / "run")
    folder.create()
    model.save(folder.checkpoint)
    folder.write_config({"dataset": "synthetic", "train": model.config().to_dict()})
    folder.release()

    info = write_codes(folder.path, tmp_path / "codes.npy", alpha=2.0)
    codes = np.load(tmp_path / "codes.npy")
    assert codes.shape == (len(data.X_train), 12) and codes.dtype == np.float32
    # Computed in float64, rounded once: the same bytes whatever the BLAS threads or device that write them again.
    assert np.array_equal(codes, model.transform(data.X_train, alpha=2.0, dtype=np.float64).astype(np.float32))
    assert np.array_equal(codes, KSparseAutoencoder.load(folder.checkpoint, device="cpu").transform(
        data.X_train, alpha=2.0, dtype=np.float64).astype(np.float32))
    assert ((codes != 0).sum(axis=1) <= 6).all()  # alpha*k = 6 units kept per row
    assert info["shape"] == [len(data.X_train), 12] and info["epochs_trained"] == 1 and info["alpha"] == 2.0
    # no codes.npy.tmp; codes.json: where they came from (ksae_cupy.session.trained_on)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codes.json", "codes.npy", "run"]

    # Written again over a file a killed writer left half done: replaced whole.
    (tmp_path / "codes.npy.tmp").write_bytes(b"half")
    write_codes(folder.path, tmp_path / "codes.npy", alpha=2.0)
    assert np.array_equal(np.load(tmp_path / "codes.npy"), codes)
    assert not (tmp_path / "codes.npy.tmp").exists()
