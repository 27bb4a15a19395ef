"""Issue 24's silently-wrong and noisy cases outside ksae-train's run folder, through the real
commands: each is one ``error:`` line, checked before any work, exit status 2."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from clicheck import assert_one_line_error
from ksae_cupy.cli.analyze import analyze_command
from ksae_cupy.cli.data import data_command
from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.cli.sweep import sweep_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.training.checkpoint import write_hdf5_atomically
from ksae_cupy.errors import KsaeError
from runfolder import make_run

SWEEP = ["synthetic", "--hidden", "16", "--k", "2", "--epochs", "1"]


@pytest.mark.parametrize("args,fragments", [
    (["--k", ""], ["--k ''", "comma-separated integers"]),
    (["--k", "50"], ["--k 50", "1 <= k <= hidden (16)"]),
    (["--alpha", "0"], ["alpha=0.0", "alpha >= 1"]),
    (["--alpha", "20"], ["alpha*k", "exceeds the 16 hidden units"]),
    (["--scheduler", "not a url"], ["--scheduler 'not a url'", "tcp://host:8786"]),
    (["--out", "{file}"], ["--out", "is a file, not a folder"]),
])
def test_sweep_options_are_checked_here_before_any_training(tmp_path, args, fragments):
    (tmp_path / "f").write_text("a file")
    args = [a.replace("{file}", str(tmp_path / "f")) for a in args]
    out = [] if "--out" in args else ["--out", str(tmp_path / "out")]
    result = CliRunner().invoke(sweep_command, [*SWEEP, *args, *out])
    assert_one_line_error(result, *fragments, status=2)
    assert "sweep:" not in result.output  # refused before a cluster was started
    assert not (tmp_path / "out").exists()


def test_a_scheduler_address_where_something_else_answers_is_one_line(tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_like_a_web_server():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed at the test's end
                return
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nnot a Dask scheduler\n")
            conn.close()

    threading.Thread(target=answer_like_a_web_server, daemon=True).start()
    try:
        result = CliRunner().invoke(sweep_command, [*SWEEP, "--scheduler", f"tcp://127.0.0.1:{port}", "--out",
                                                    str(tmp_path / "out")])
    finally:
        server.close()
    assert_one_line_error(result, f"--scheduler tcp://127.0.0.1:{port}: no Dask scheduler answers there",
                          "something else does: its answer is not Dask's protocol", status=2)
    assert "EiB" not in result.stderr  # once "(MemoryError: Unable to allocate 3.01 EiB ...)", Dask's misreading


def test_data_list_and_verify_refuse_a_file_as_data_root(tmp_path):
    (tmp_path / "f").write_text("a file")
    for sub in ("list", "verify"):
        result = CliRunner().invoke(data_command, [sub, "--data-dir", str(tmp_path / "f")])
        assert_one_line_error(result, f"--data-dir {tmp_path / 'f'} is a file, not a folder", status=2)


def test_progress_seconds_must_not_be_negative(tmp_path):
    np.save(tmp_path / "x.npy", make_sparse_signals(60, D=8, H=16, k=2, seed=0)[0])
    result = CliRunner().invoke(train_command, [str(tmp_path / "x.npy"), "--hidden", "16", "--k", "2", "--device",
                                                "cpu", "--progress-seconds", "-5", "--run-dir", str(tmp_path / "r")])
    assert_one_line_error(result, "--progress-seconds -5.0 is not allowed", "seconds >= 0", status=2)
    assert not (tmp_path / "r").exists()


def test_eval_and_analyze_check_where_they_write_before_the_work(tmp_path, monkeypatch):
    import ksae_cupy.paths as paths

    run = make_run(tmp_path / "run", np.random.default_rng(0).normal(size=(64, 32)), k=3)
    monkeypatch.setattr(paths, "writable", lambda folder: False)  # as a read-only folder is (root ignores bits)
    work = []
    import ksae_cupy.evaluation.run_evaluation as run_evaluation

    monkeypatch.setattr(run_evaluation, "evaluate_run", lambda *a, **k: work.append("eval"))
    result = CliRunner().invoke(eval_command, [str(run), "--device", "cpu"])
    assert_one_line_error(result, "eval.json", "not writable", status=2)
    result = CliRunner().invoke(analyze_command, ["theorem", "--dim", "8", "--k", "2", "-o",
                                                  str(tmp_path / "r.json")])
    assert_one_line_error(result, "-o", "not writable", status=2)
    assert work == []


def test_an_hdf5_error_running_over_lines_keeps_its_reason_on_one_line(tmp_path):
    message = ("Unable to synchronously write to dataset (file write failed: time = Mon,\n"
               " errno = 28, error message = 'No space left on device', buf = 0x1)")

    def fails_like_hdf5(f):
        raise OSError(message)  # h5py's OSError: no errno attribute, the reason inside the text

    with pytest.raises(KsaeError) as info:
        write_hdf5_atomically(tmp_path / "c.h5", fails_like_hdf5, lambda p: None)
    text = str(info.value)
    # The library does not know which command called it: its advice names no option (the commands name theirs)
    assert "\n" not in text and "No space left on device" in text and text.endswith("then try again")
    assert not (tmp_path / "c.h5.tmp").exists()


# -- found by the independent retry of issue 24 -----------------------------------------------------

def _file_data(tmp_path):
    np.save(tmp_path / "x.npy", make_sparse_signals(60, D=8, H=16, k=2, seed=0)[0])
    np.save(tmp_path / "x8.npy", (make_sparse_signals(60, D=8, H=16, k=2, seed=0)[0] * 10).astype(np.int8))
    return tmp_path


@pytest.mark.parametrize("args,fragments", [
    (["{x}", "--seeds", "-1"], ["--seeds -1 is not allowed", "from 0 to 4294967295"]),
    (["{x}", "--batch-size", "500"], ["--batch-size 500 is not allowed", "at most the 54 training examples"]),
    (["{missing}"], ["data file", "missing.npy does not exist"]),
    (["{x8}"], ["holds integers (dtype int8", "X / 255 for 8-bit pixels"]),
])
def test_sweep_data_and_seeds_are_checked_before_a_cluster_starts(tmp_path, args, fragments):
    """Once a worker's remote traceback, logged before the error line (a negative seed: a NumPy traceback)."""
    root = _file_data(tmp_path)
    args = [a.format(x=root / "x.npy", x8=root / "x8.npy", missing=root / "missing.npy") for a in args]
    result = CliRunner().invoke(sweep_command, [args[0], "--hidden", "16", "--k", "2", "--epochs", "1", *args[1:],
                                                "--out", str(tmp_path / "out")])
    assert_one_line_error(result, *fragments, status=2)
    assert "sweep:" not in result.output  # refused before a cluster was started
    assert not (tmp_path / "out").exists()


SWEEP_PROCESS = [sys.executable, "-c", "from ksae_cupy.cli.sweep import main; main()"]
SWEEP_ENV = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), PYTHONUNBUFFERED="1")


def test_a_sweep_training_that_diverges_on_its_worker_is_one_line(tmp_path):
    """Dask's worker log ("Compute Failed" and the remote traceback) and NumPy's overflow warnings
    once came before the line. A real process: the workers write to its stderr, not to CliRunner's."""
    root = _file_data(tmp_path)
    proc = subprocess.run(SWEEP_PROCESS + [str(root / "x.npy"), "--hidden", "16", "--k", "2", "--epochs", "2", "--lr",
                                           "1e6", "--batch-size", "10", "--workers", "1", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=SWEEP_ENV, timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the loss became ") and "at epoch 1" in lines[0] and \
        lines[0].endswith("with learning rate 1000000.0"), proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_sweep_says_so_in_one_line_and_exits_128_plus_the_signal(tmp_path, signum):
    """Ctrl-C once printed asyncio's "Task exception was never retrieved" traceback and click's
    "Aborted!" (status 1); SIGTERM killed it without a word. The signal is sent once the sweep
    says it has started its trainings (an event, not a clock); they are far from done then."""
    root = _file_data(tmp_path)
    proc = subprocess.Popen(SWEEP_PROCESS + [str(root / "x.npy"), "--hidden", "16", "--k", "2", "--epochs", "1000000",
                                             "--batch-size", "10", "--workers", "1", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=SWEEP_ENV)
    for line in proc.stdout:
        if line.startswith("sweep: 1 trainings on"):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=120)
    name = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}[signum]
    assert proc.returncode == 128 + signum, err
    assert err.splitlines() == [f"{name}: the sweep stopped; nothing was written to {tmp_path / 'out'} (a sweep "
                                f"keeps no checkpoints: run it again to redo its trainings)"], err
    assert not (tmp_path / "out").exists()


_HALF_BUILT_AT_STOP = """
import os, signal, sys
from ksae_cupy.parallel.sweep import stopped_by_signals


class HalfBuilt:  # as a Dask Future whose __init__ the interrupt cut short: its __del__ fails
    def __init__(self):
        os.kill(os.getpid(), signal.SIGNUM)  # the handler raises KeyboardInterrupt right here
        self.ready = True

    def __del__(self):
        self.ready


with stopped_by_signals() as received:
    try:
        HalfBuilt()
    except KeyboardInterrupt:
        print("stopped by", int(received[0]))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_sweep_stopped_inside_a_constructor_prints_no_ignored_exception(signum):
    """Under load, the stop signal once landed inside ``client.submit`` (a Dask ``Future`` half
    built); its ``__del__`` then failed at exit and Python printed "Exception ignored in" and a
    traceback under the one line. The signal is sent by the process itself at that point: no clock."""
    script = _HALF_BUILT_AT_STOP.replace("SIGNUM", signal.Signals(signum).name)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout == f"stopped by {int(signum)}\n", proc.stdout + proc.stderr
    assert proc.stderr == "", proc.stderr


def test_data_verify_refuses_a_data_root_that_does_not_exist_and_list_notes_it(tmp_path):
    """``verify`` once listed every file as missing and exited 0: a mistyped root passed as verified."""
    result = CliRunner().invoke(data_command, ["verify", "--data-dir", str(tmp_path / "nothere")])
    assert_one_line_error(result, f"data root {tmp_path / 'nothere'} does not exist: nothing to verify", status=2)
    result = CliRunner().invoke(data_command, ["list", "--data-dir", str(tmp_path / "nothere")])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"note: data root {tmp_path / 'nothere'} does not exist yet (ksae-data fetch NAME " \
                            f"creates it)\n"
    assert "mnist" in result.stdout


def _logged_run(tmp_path):
    run = make_run(tmp_path / "run", np.random.default_rng(0).normal(size=(16, 9)), k=2)
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 10, "k": 2, "train_loss": 1.0,
                                                   "valid_loss": 1.1, "seconds": 0.5}) + "\n")
    return run


def _cut_metrics(run):
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "lo')  # a kill -9 in the middle of an append: no newline


def _damage_metrics(run):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(["{\"epoch\": 0, \"lo", *lines]) + "\n")


def test_plot_curves_leaves_out_a_cut_last_metrics_line_and_names_a_damaged_one(tmp_path):
    """Both were a JSONDecodeError traceback."""
    pytest.importorskip("matplotlib")
    from ksae_cupy.cli.plot import plot_command

    run = _logged_run(tmp_path)
    _cut_metrics(run)
    result = CliRunner().invoke(plot_command, ["curves", str(run), "-o", str(tmp_path / "c.png")])
    assert result.exit_code == 0, result.output
    assert result.stderr == f"note: {run / 'metrics.jsonl'}: its last line was cut short (the run stopped while " \
                            f"writing it) and is left out\n"
    assert (tmp_path / "c.png").exists()
    _damage_metrics(run)
    result = CliRunner().invoke(plot_command, ["curves", str(run), "-o", str(tmp_path / "d.png")])
    assert_one_line_error(result, f"{run / 'metrics.jsonl'}: line 1 is not a JSON record", "remove that line",
                          status=2)
    assert not (tmp_path / "d.png").exists()


@pytest.mark.parametrize("record,fragment", [
    ({"phase": "all", "epoch": 1, "step": 8, "lr": 1.0, "train_loss": 1.3, "valid_error": 0.45},
     "is a ksae-finetune run's log"),
    ({"epoch": 1, "loss": 1.0}, "record 1 has no train_loss, k"),
])
def test_plot_curves_names_a_log_that_is_not_ksae_trains(tmp_path, record, fragment):
    """A fine-tuning run's folder given to ksae-plot curves was a KeyError traceback."""
    pytest.importorskip("matplotlib")
    from ksae_cupy.cli.plot import plot_command

    run = _logged_run(tmp_path)
    (run / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    result = CliRunner().invoke(plot_command, ["curves", str(run), "-o", str(tmp_path / "c.png")])
    assert_one_line_error(result, f"{run / 'metrics.jsonl'}", fragment, status=2)
    assert not (tmp_path / "c.png").exists()


def test_analyze_compare_names_a_damaged_metrics_line(tmp_path):
    pytest.importorskip("sklearn")
    run = _logged_run(tmp_path)
    _damage_metrics(run)
    result = CliRunner().invoke(analyze_command, ["compare", str(run), "--dict-seconds", "auto"])
    assert_one_line_error(result, f"{run / 'metrics.jsonl'}: line 1 is not a JSON record", status=2)
