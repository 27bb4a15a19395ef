"""ksae-eval's report of the autoencoder itself: FVE, L0 and dead units per split (eval.json and eval.md)."""
import json

import numpy as np
import pytest

from ksae_cupy import metrics
from ksae_cupy.evaluation import features, run_evaluation
from runfolder import make_run, sparse_signal_dataset


def test_eval_reports_fve_l0_and_dead_units_per_split(tmp_path):
    data, W_dh = sparse_signal_dataset(n_train=600, n_valid=150, n_test=150)
    b_h = np.zeros(W_dh.shape[1], np.float32)
    b_h[:13] = -1e3  # 13 of 128 units no example keeps
    run = make_run(tmp_path / "run", W_dh, k=5, b_h=b_h)
    result = run_evaluation.evaluate_run(run, alphas=[2], l2_grid=[1e-3], dataset=data, log=lambda *_: None)
    report = json.loads((run / "eval.json").read_text())
    saved = report["reconstruction"]
    assert report["dead_definition"] == metrics.DEAD_DEFINITION  # named where the count is
    assert saved == result["reconstruction"] and set(saved) == {"train", "valid", "test"}
    params = {"W_dh": W_dh.astype(np.float32), "b_h": b_h, "c_d": np.zeros(W_dh.shape[0], np.float32)}
    for split, X in (("train", data.X_train), ("valid", data.X_valid), ("test", data.X_test)):
        assert saved[split] == pytest.approx(metrics.reconstruction_metrics(params, X, 5, 2.0))
        assert saved[split]["rows"] == len(X) and (saved[split]["l0"], saved[split]["l0_alpha_k"]) == (5, 10)
        assert saved[split]["dead_fraction"] >= 13 / 128
        assert 0.5 < saved[split]["fve"] <= 1  # k-sparse signals of this very dictionary: mostly explained
    md = (run / "eval.md").read_text()
    train = saved["train"]
    assert (f"| train | 600 | {train['fve']:.4f} | 5.00 | 10.00 | {train['n_dead']} ({100 * train['dead_fraction']:.2f}%) |" in md)
    assert train["n_dead"] == round(128 * train["dead_fraction"]) >= 13
    assert "| split | examples | FVE | L0 (k) | L0 (alpha*k) | dead units |" in md
    rows = [line.split(" |")[0] for line in md.splitlines() if line.startswith(("| train |", "| valid |", "| test |"))]
    assert rows == ["| train", "| valid", "| test"]


def test_eval_encodes_each_split_once(tmp_path, monkeypatch):
    """The fits, the test error and the reconstruction metrics read one encoding of each split."""
    data, W_dh = sparse_signal_dataset(n_train=300, n_valid=100, n_test=100)
    run = make_run(tmp_path / "run", W_dh, k=5)
    encoded = []
    top_units = features.top_units

    def counted(params, X_nd, *args, **kwargs):
        encoded.append(len(X_nd))
        return top_units(params, X_nd, *args, **kwargs)

    monkeypatch.setattr(features, "top_units", counted)
    result = run_evaluation.evaluate_run(run, alphas=[1, 2], l2_grid=[1e-3], dataset=data, log=lambda *_: None)
    assert sorted(encoded) == [100, 100, 300]  # train, valid, test: once each
    assert set(result["reconstruction"]) == {"train", "valid", "test"}
