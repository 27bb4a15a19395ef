"""ksae-eval gives the same bits at every thread count: its features, its choice and its test error."""
import json

import numpy as np
from threadpoolctl import threadpool_limits

from ksae_cupy.evaluation import features, run_evaluation, selection
from runfolder import make_run, sparse_signal_dataset

THREAD_COUNTS = (1, 2, 3)


def signals():
    # Large enough that OpenBLAS splits X W over its threads (it keeps small products on one), and over
    # ROWS_PER_PIECE rows so that the lanes share several pieces.
    data, W_dh = sparse_signal_dataset(n_train=2500, n_valid=1000, n_test=1000, D=256, H=1000, k=10)
    rng = np.random.default_rng(1)
    W_dh = (W_dh + 0.05 * rng.standard_normal(W_dh.shape)).astype(np.float32)
    return data, W_dh


def test_top_units_are_the_same_bits_at_every_lane_and_blas_thread_count():
    data, W_dh = signals()
    params = {"W_dh": W_dh, "b_h": np.linspace(-0.1, 0.1, W_dh.shape[1], dtype=np.float32)}
    assert len(data.X_train) > 2 * features.ROWS_PER_PIECE
    tops = {}
    for threads in THREAD_COUNTS:
        with threadpool_limits(limits=threads, user_api="blas"):  # as ksae-eval --threads leaves the BLAS
            tops[threads] = features.top_units(params, data.X_train, 30, lanes=threads)
    for threads in THREAD_COUNTS[1:]:
        assert np.array_equal(tops[threads][0], tops[1][0]), f"{threads} threads chose other units"
        assert tops[threads][1].tobytes() == tops[1][1].tobytes(), f"{threads} threads gave other values"
    # Control: the pieces are real rows of X W + b, in descending order.
    Z_nh = data.X_train.astype(np.float64) @ W_dh + params["b_h"]
    np.testing.assert_allclose(tops[1][1], np.take_along_axis(Z_nh, tops[1][0].astype(np.int64), axis=1),
                               rtol=1e-4, atol=1e-4)
    assert (np.diff(tops[1][1], axis=1) <= 0).all()


def test_evaluate_run_writes_the_same_report_at_every_thread_count(tmp_path):
    data, W_dh = signals()
    reports = {}
    for threads in THREAD_COUNTS:
        run = make_run(tmp_path / f"run-{threads}", W_dh, k=10)
        with threadpool_limits(limits=threads, user_api="blas"):  # ksae-eval --threads N: N BLAS threads, N workers
            run_evaluation.evaluate_run(run, alphas=[1, 2, 3], l2_grid=[1e-2, 1e-3, 1e-4], dataset=data, workers=threads,
                                  log=lambda *_: None)
        reports[threads] = without_timings(json.loads((run / "eval.json").read_text()))
    assert 0 < reports[1]["features"]["test_error"] < 0.75  # the features do carry the labels (chance: 0.75)
    for threads in THREAD_COUNTS[1:]:
        assert reports[threads]["features"] == reports[1]["features"], f"{threads} threads chose or fitted otherwise"
        assert reports[threads]["reconstruction"] == reports[1]["reconstruction"]


def without_timings(report: dict) -> dict:
    """The report less what a clock measured and where it was written."""
    report.pop("seconds"), report.pop("run_dir")
    for trial in report["features"]["trials"]:
        trial.pop("seconds")
    return report


def test_eval_json_records_the_protocol_and_the_code(tmp_path):
    from ksae_cupy.made_with import code_commit, package_code_clean

    data, W_dh = sparse_signal_dataset(n_train=400, n_valid=100, n_test=100)
    run = make_run(tmp_path / "run", W_dh, k=5)
    run_evaluation.evaluate_run(run, alphas=[1], l2_grid=[1e-3], dataset=data, log=lambda *_: None)
    report = json.loads((run / "eval.json").read_text())
    assert report["protocol"] == selection.PROTOCOL == 4
    assert (report["commit"], report["code_clean"]) == (code_commit()[0], package_code_clean())
    assert report["package_version"]
