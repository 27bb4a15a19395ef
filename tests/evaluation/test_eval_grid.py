"""ksae-eval's grid: fits side by side, a warning for an unconverged fit, progress per fit, and an
interrupted evaluation that keeps its finished fits and continues from them."""
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.evaluate import eval_command
from ksae_cupy.evaluation import classifier, grid
from ksae_cupy.evaluation import run_evaluation, selection
from ksae_cupy.datasets.synthetic import make_sparse_signals
from clicheck import assert_one_line_error
from runfolder import make_run, sparse_signal_dataset


def without_seconds(trials):
    return [{key: value for key, value in t.items() if key != "seconds"} for t in trials]


REAL_FIT = classifier.fit


def counting_fits(monkeypatch, stop_after=None):
    """Count classifier.fit calls; with ``stop_after``, the call after that many raises Ctrl-C."""
    calls = []
    real_fit = REAL_FIT

    def fit(*args, **kwargs):
        if stop_after is not None and len(calls) == stop_after:
            raise KeyboardInterrupt
        calls.append(kwargs.get("init") is not None)
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(classifier, "fit", fit)
    return calls


def interrupt_after(fits, monkeypatch, run, **grid_args):
    """Evaluate ``run`` on ``grid_args`` with a Ctrl-C after ``fits`` classifier fits: the evaluation
    stops, saying it kept them."""
    counting_fits(monkeypatch, stop_after=fits)
    with pytest.raises(grid.EvaluationInterrupted, match=f"{fits} finished classifier fit"):
        run_evaluation.evaluate_run(run, **grid_args)


TWO_FITS = dict(alphas=[1], l2_grid=[1e-2, 1e-3], log=lambda *_: None, l2_extend=0)  # then the refit


@pytest.fixture
def run_and_data(tmp_path):
    data, W_dh = sparse_signal_dataset(n_train=800, n_valid=200, n_test=200)
    return make_run(tmp_path / "run", W_dh, k=5), data


def test_fits_side_by_side_give_the_same_trials_as_one_at_a_time(run_and_data):
    run, data = run_and_data
    # the grid as given (l2_extend=0): its fits are counted below
    one = run_evaluation.evaluate_run(run, alphas=[1, 2, 3], l2_grid=[1e-2, 1e-4], dataset=data, log=lambda *_: None,
                                l2_extend=0)
    lines = []
    two = run_evaluation.evaluate_run(run, alphas=[1, 2, 3], l2_grid=[1e-2, 1e-4], dataset=data, log=lines.append,
                                workers=2, l2_extend=0)
    assert without_seconds(two["features"]["trials"]) == without_seconds(one["features"]["trials"])
    assert two["features"]["test_error"] == one["features"]["test_error"]
    assert any("2 side by side" in line for line in lines), lines
    # One progress line per fit, numbered, each but the last with an estimate of the time left (the refit's
    # included: the last grid fit says it too); the last says the total.
    fit_lines = [line for line in lines if line.lstrip().startswith("fit ")]
    total = len(two["features"]["trials"]) + 1
    assert [line.split()[1] for line in fit_lines] == [str(i) for i in range(1, total + 1)]
    assert fit_lines[-1].split()[:4] == ["fit", str(total), "of", str(total)] and "refit" in fit_lines[-1]
    assert all("left" in line for line in fit_lines[:-1]) and "left" not in fit_lines[-1]


def test_each_alpha_walks_the_l2_path_warm_started(run_and_data, monkeypatch):
    run, data = run_and_data
    warm = counting_fits(monkeypatch)
    result = run_evaluation.evaluate_run(run, alphas=[1, 2], l2_grid=[1e-4, 1e-2, 1e-3], dataset=data,
                                   log=lambda *_: None, l2_extend=0)
    trials = result["features"]["trials"]
    # The first alpha starts from zero at the grid's middle (1e-3), the second from its fit; then each walks
    # from its best so far, warm-started; the refit warm-starts from the chosen fit.
    assert [(t["alpha"], t["l2"]) for t in trials][:2] in ([(1, 1e-2), (1, 1e-3)], [(1, 1e-3), (1, 1e-4)])
    assert warm == [False] + [True] * (len(trials) - 1) + [True]


def test_the_walk_skips_a_value_that_cannot_beat_the_best_if_the_error_is_convex():
    def fits(**errors):  # {l2: (trial, model)} from valid errors by name
        values = {"s": 1e-3, "m": 1e-4, "w": 1e-5}
        return {values[name]: (selection.Trial(1, values[name], e, 0, 1, True, 0), f"model {name}")
                for name, e in errors.items()}

    lattice = [1e-3, 1e-4, 1e-5]
    # The start (1e-4) alone: its weaker neighbour first, warm-started from it.
    assert selection._next_step(1, fits(m=0.30), lattice, 0.10) == (1, 1e-5, "model m")
    # Weaker was worse: the stronger neighbour is at least 0.30 - (0.35 - 0.30) = 0.25 ...
    assert selection._next_step(1, fits(m=0.30, w=0.35), lattice, 0.25) is None  # ... which cannot beat 0.25
    assert selection._next_step(1, fits(m=0.30, w=0.35), lattice, 0.26) == (1, 1e-3, "model m")
    # Weaker was better and is the lattice's end: done; both neighbours tried: done.
    assert selection._next_step(1, fits(m=0.30, w=0.20), lattice, 0.20) is None
    assert selection._next_step(1, fits(s=0.4, m=0.30, w=0.35), lattice, 0.30) is None
    # A tie keeps the stronger L2 as the alpha's best.
    assert selection._next_step(1, fits(m=0.30, w=0.30), lattice, 0.29) is None


def test_the_lattice_adds_exact_decades_beyond_each_edge():
    assert selection.l2_lattice([1e-4, 1e-3, 1e-5], 2) == [0.1, 0.01, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]
    assert selection.l2_lattice([1e-3, 1e-5], 0) == [1e-3, 1e-5]
    assert selection.l2_lattice([1e-3], 3) == [1e-3]  # one value: a fixed L2
    assert selection.l2_lattice([1e-3, 0.0], 1) == [1e-2, 1e-3, 0.0]  # nothing weaker than 0


def test_an_unconverged_fit_is_a_warning_line(run_and_data):
    run, data = run_and_data
    lines = []
    result = run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-5], dataset=data, max_iter=2, log=lines.append)
    assert not result["features"]["trials"][0]["converged"]
    warnings = [line for line in lines if "warning:" in line]
    assert len(warnings) == 2, lines  # the fit and the refit
    assert "alpha=1 l2=1e-05" in warnings[0] and "reached max_iter 2" in warnings[0]
    converged = []
    run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-2], dataset=data, log=converged.append)
    assert not any("warning:" in line for line in converged)  # control: a converged fit says nothing


def test_ctrl_c_keeps_the_finished_fits_and_a_rerun_continues_from_them(run_and_data, monkeypatch):
    run, data = run_and_data
    grid_args = dict(alphas=[1, 2], l2_grid=[1e-2, 1e-3, 1e-4], dataset=data, log=lambda *_: None,
                     l2_extend=0)
    interrupt_after(4, monkeypatch, run, **grid_args)
    assert (run / grid.FITS_FILE).is_file() and not (run / "eval.json").exists()
    calls = counting_fits(monkeypatch)
    resumed = run_evaluation.evaluate_run(run, **grid_args)
    assert len(calls) == len(resumed["features"]["trials"]) + 1 - 4  # the fits left, and the refit
    assert all(calls)  # each warm-starts from a stored (or new) fit
    assert not (run / grid.FITS_FILE).exists()  # the report holds everything now
    monkeypatch.undo()
    fresh = run_evaluation.evaluate_run(run, **grid_args)
    assert without_seconds(resumed["features"]["trials"]) == without_seconds(fresh["features"]["trials"])
    assert resumed["features"]["test_error"] == fresh["features"]["test_error"]


def test_fits_of_another_protocol_are_not_reused(run_and_data, monkeypatch):
    run, data = run_and_data
    interrupt_after(1, monkeypatch, run, dataset=data, **TWO_FITS)
    monkeypatch.setattr(selection, "PROTOCOL", selection.PROTOCOL + 1)  # e.g. a later release's walk
    calls = counting_fits(monkeypatch)
    result = run_evaluation.evaluate_run(run, dataset=data, **TWO_FITS)
    assert len(calls) == len(result["features"]["trials"]) + 1  # the kept fit was made again
    assert result["protocol"] == selection.PROTOCOL


def test_fits_of_another_checkpoint_are_not_reused(run_and_data, monkeypatch):
    run, data = run_and_data
    interrupt_after(1, monkeypatch, run, dataset=data, **TWO_FITS)
    _, W_dh = sparse_signal_dataset(seed=1)
    make_run(run, W_dh, k=5)  # another model in the same folder
    calls = counting_fits(monkeypatch)
    run_evaluation.evaluate_run(run, dataset=data, **TWO_FITS)
    assert len(calls) == 3


def test_a_damaged_fits_file_is_made_again(run_and_data, monkeypatch):
    run, data = run_and_data
    (run / grid.FITS_FILE).write_bytes(b"not an npz")
    calls = counting_fits(monkeypatch)
    run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-2], dataset=data, log=lambda *_: None)
    assert len(calls) == 2


# -- through the command ---------------------------------------------------------------------

@pytest.fixture
def synthetic_run(tmp_path):
    return make_run(tmp_path / "run-k5", make_sparse_signals(1)[2], k=5, dataset="synthetic")


def test_command_ctrl_c_then_the_same_command_continues(synthetic_run, monkeypatch):
    args = [str(synthetic_run), "--alphas", "1,2", "--l2", "1e-2,1e-3", "--l2-extend", "0", "--device", "cpu",
            "--threads", "1"]
    counting_fits(monkeypatch, stop_after=3)
    stopped = CliRunner().invoke(eval_command, args)
    assert stopped.exit_code == 130, stopped.output
    assert stopped.stderr.rstrip().splitlines()[-1] == (
        f"interrupted: 3 finished classifier fit(s) kept in {synthetic_run / grid.FITS_FILE}; run the same command "
        f"again to continue from them")
    assert "Traceback" not in stopped.output and "Aborted" not in stopped.output
    calls = counting_fits(monkeypatch)
    again = CliRunner().invoke(eval_command, args)
    assert again.exit_code == 0, again.output
    assert "3 kept from an interrupted run" in again.stderr
    assert len(calls) == 2  # alpha 2's weaker L2, and the refit
    assert json.loads((synthetic_run / "eval.json").read_text())["features"]["test_error"] < 0.75


def test_command_refuses_zero_threads(synthetic_run):
    result = CliRunner().invoke(eval_command, [str(synthetic_run), "--threads", "0"])
    assert_one_line_error(result, "--threads 0 is not allowed", status=2)


@pytest.mark.parametrize("args,expected", [
    (["--l2", "1e-3,-1"], "--l2 '1e-3,-1': l2=-1 is not allowed; use a finite l2 >= 0"),  # l2_grid in Python
    (["--alphas", "0.5"], "--alphas '0.5': alpha=0.5 is not allowed; use a finite alpha >= 1"),
    (["--alphas", ","], "--alphas is empty; give comma-separated numbers"),
])
def test_command_names_its_flags_where_the_library_names_parameters(synthetic_run, args, expected):
    result = CliRunner().invoke(eval_command, [str(synthetic_run), *args, "--device", "cpu"])
    assert_one_line_error(result, expected, status=2)


HELD_EVAL = """\
import signal
import sys
from ksae_cupy.evaluation import grid

# Ctrl-C's handler, as in a terminal: a test run started in the background (`cmd &` in a script, as a CI
# runner may) hands its children SIGINT ignored, and Python then installs no handler of its own.
signal.signal(signal.SIGINT, signal.default_int_handler)

put, held = grid.FitStore.put, []


def put_then_hold(self, key, trial, model):
    put(self, key, trial, model)
    if not held:
        held.append(key)
        print("held after a fit", flush=True)
        sys.stdin.read()  # until the test closes this process's stdin


grid.FitStore.put = put_then_hold
from ksae_cupy.cli.evaluate import eval_command

eval_command()
"""


@pytest.mark.parametrize("threads, signum", [("1", signal.SIGTERM), ("2", signal.SIGTERM), ("1", signal.SIGINT),
                                             ("2", signal.SIGINT)])
def test_a_stop_signal_mid_grid_exits_128_plus_it_and_keeps_the_fits(synthetic_run, threads, signum):
    # The evaluation holds after its first stored fit; the signal lands then, however loaded the machine.
    args = [str(synthetic_run), "--alphas", "1,2", "--l2", "1e-2,1e-3", "--l2-extend", "0", "--device", "cpu",
            "--threads", threads]
    proc = subprocess.Popen([sys.executable, "-c", HELD_EVAL, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("held after a fit"):
            break
    else:
        raise AssertionError(f"ended without holding: {proc.wait()} {proc.stderr.read()}")
    proc.send_signal(signum)
    _, err = proc.communicate(input="", timeout=600)  # releases the hold; the timeout is a hang guard only
    assert proc.returncode == 128 + signum, err
    assert "interrupted: " in err and "run the same command again" in err and "Traceback" not in err
    stored = np.load(synthetic_run / grid.FITS_FILE)
    assert len(json.loads(str(stored["meta"]))["fits"]) >= 1
    assert not (synthetic_run / "eval.json").exists()


def test_a_long_fit_says_it_is_still_working(run_and_data, monkeypatch):
    run, data = run_and_data
    monkeypatch.setattr(grid, "HEARTBEAT_S", 0.0)  # every pass after the first counts as long
    lines = []
    run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-2], dataset=data, log=lines.append)
    still = [line for line in lines if "still fitting" in line]
    fit = [line for line in still if "alpha=1 l2=0.01: still fitting" in line]
    refit = [line for line in still if "refit on train+valid: still fitting" in line]
    assert fit and refit and len(fit) + len(refit) == len(still)
    counts = [int(line.split("still fitting, ")[1].split()[0]) for line in fit]
    assert counts == list(range(1, len(counts) + 1))  # the passes made so far, one more each time
    quiet = []
    monkeypatch.setattr(grid, "HEARTBEAT_S", 1e9)
    run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-2], dataset=data, log=quiet.append)
    assert not any("still fitting" in line for line in quiet)  # control: a fit shorter than the beat is silent


def test_fits_made_with_other_labels_are_not_reused(run_and_data, monkeypatch):
    run, data = run_and_data
    interrupt_after(1, monkeypatch, run, dataset=data, **TWO_FITS)
    data.y_train = (data.y_train + 1) % 4  # e.g. another --labels file, same shapes
    calls = counting_fits(monkeypatch)
    run_evaluation.evaluate_run(run, dataset=data, **TWO_FITS)
    assert len(calls) == 3


def test_command_ends_with_the_test_error_and_its_warnings_name_max_iter(synthetic_run):
    args = [str(synthetic_run), "--alphas", "1", "--l2", "1e-5", "--device", "cpu", "--threads", "1"]
    capped = CliRunner().invoke(eval_command, [*args, "--max-iter", "2"])
    assert capped.exit_code == 0, capped.output
    saved = json.loads((synthetic_run / "eval.json").read_text())
    last = capped.stderr.rstrip().splitlines()[-1]
    assert last.startswith(f"test error {100 * saved['features']['test_error']:.2f}% (alpha=1, l2=1e-05, refit on")
    warnings = [line for line in capped.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 2 and all("reached --max-iter 2 before converging" in w for w in warnings), warnings
    assert "the chosen fit (alpha=1 l2=1e-05)" in warnings[0] and "the refit" in warnings[1]
    assert "at the cap, not converged" in capped.stderr  # the fit's own progress line
    converged = CliRunner().invoke(eval_command, args)
    assert converged.exit_code == 0 and "warning:" not in converged.stderr  # control: converged fits say nothing


def test_early_stopping_reaches_its_cap_without_a_warning(run_and_data):
    _, data = run_and_data
    lines = []
    capped = selection.select_and_test(lambda alpha, X: X, data, [None], [1e-6], max_iter=2, log=lines.append,
                                      early_stop=True)
    assert not capped["trials"][0]["converged"]
    assert not any("warning:" in line for line in lines) and any("(the cap)" in line for line in lines)
    selection.select_and_test(lambda alpha, X: X, data, [None], [1e-6], max_iter=2, log=lines.append)
    assert any("warning:" in line for line in lines)  # control: the same fits warn when the cap is no regulariser


def test_time_left_counts_the_refit_and_ranges_to_what_the_walk_may_add():
    lines = []
    progress = grid.GridProgress(1, lines.append, refit_scale=1.2)
    progress.start_round([1, 2], {1: 2, 2: 0}, refit_alpha=1)  # this round: alphas 1 and 2; alpha 1 may fit 2 more
    progress.fitted(1, "a", 10.0)
    # Left: alpha 2's fit (10 s, the mean so far) and the refit (alpha 1's 10 s x 1.2); at most 2 x 10 s more.
    assert lines[-1] == "  fit 1 of 3 (at most 5) a; 22 s to 42 s left"
    progress.fitted(2, "b", 20.0)
    assert lines[-1] == "  fit 2 of 3 (at most 5) b; 12 s to 32 s left"
    progress.start_round([], {}, refit_alpha=1)  # the walk ended: the refit alone
    progress.refitted("r", 12.0)
    assert lines[-1] == "  fit 3 of 3 r"


def test_the_walks_fits_stop_at_a_gradient_of_their_l2_and_the_refit_at_tol(run_and_data, monkeypatch):
    # Protocol 3: a fit that only chooses stops at a gradient of max(l2, TOL), at most CHOICE_TOL; the refit,
    # which meets the test set, goes on to TOL.
    run, data = run_and_data
    tols = []

    def fit(*args, **kwargs):
        tols.append((args[3], kwargs.get("tol", classifier.TOL)))
        return REAL_FIT(*args, **kwargs)

    monkeypatch.setattr(classifier, "fit", fit)
    result = run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-2, 1e-3, 1e-4, 1e-5, 1e-6], dataset=data,
                                   log=lambda *_: None, l2_extend=0)
    walk, (refit_l2, refit_tol) = tols[:-1], tols[-1]
    assert len(walk) == len(result["features"]["trials"]) >= 2
    expected = {1e-2: 1e-4, 1e-3: 1e-4, 1e-4: 1e-4, 1e-5: 1e-5, 1e-6: 1e-5}
    assert all(tol == expected[l2] for l2, tol in walk), walk
    assert (classifier.CHOICE_TOL, classifier.TOL) == (1e-4, 1e-5)
    assert refit_l2 == result["features"]["selected"]["l2"] and refit_tol == classifier.TOL
    assert result["protocol"] == 4  # 3: the same tolerances, X W on the BLAS threads
