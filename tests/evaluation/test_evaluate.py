"""Feature evaluation: encoding matches the model, the choice never sees the test set."""
import json

import numpy as np
import pytest

from ksae_cupy.evaluation import classifier, features, run_evaluation, selection
from ksae_cupy import model
from ksae_cupy.errors import KsaeError, OptionError
from runfolder import make_run, sparse_signal_dataset


@pytest.mark.parametrize("alpha", [1, 2, 2.5])
def test_sparse_features_equal_model_encode(alpha):
    rng = np.random.default_rng(0)
    params = model.init_params(20, 30, 0.3, rng)
    params["b_h"] = rng.standard_normal(30).astype(np.float32) * 0.1
    X_nd = rng.standard_normal((25, 20)).astype(np.float32)
    F = features.sparse_features(params, X_nd, 4, alpha, batch=7)
    dense = model.encode(params, X_nd, 4, alpha)
    # Batching may change the last bit of the float32 products, never the kept set.
    assert np.array_equal(F.toarray() != 0, dense != 0)
    np.testing.assert_allclose(F.toarray(), dense, rtol=1e-5, atol=1e-6)
    assert F.nnz == 25 * model.alpha_k(4, alpha, 30)


def run_selection(data, W_dh, alphas=(1, 2), l2_grid=(1e-2, 1e-4)):
    params = {"W_dh": W_dh.astype(np.float32), "b_h": np.zeros(W_dh.shape[1], np.float32),
              "c_d": np.zeros(W_dh.shape[0], np.float32)}
    encode = lambda alpha, X: features.sparse_features(params, X, 5, alpha)  # noqa: E731
    return selection.select_and_test(encode, data, list(alphas), list(l2_grid), log=lambda *_: None)


def test_choice_is_the_best_validation_trial_and_ignores_test_labels():
    data, W_dh = sparse_signal_dataset()
    clean = run_selection(data, W_dh)
    best = min(clean["trials"], key=lambda t: t["valid_error"])
    assert clean["selected"]["valid_error"] == best["valid_error"]
    assert len(clean["trials"]) == 4 and clean["test_error"] < 0.6  # chance is 0.75
    # Poison the test labels: the selection must not move; only the reported test error does.
    data.y_test = (data.y_test + 1) % 4
    poisoned = run_selection(data, W_dh)
    assert poisoned["selected"] == clean["selected"]
    assert [t["valid_error"] for t in poisoned["trials"]] == [t["valid_error"] for t in clean["trials"]]
    assert poisoned["test_error"] > clean["test_error"] + 0.2


def test_poisoned_validation_labels_do_move_the_result():
    # Control for the test above: validation labels are what the choice is made on.
    data, W_dh = sparse_signal_dataset()
    clean = run_selection(data, W_dh)
    data.y_valid = (data.y_valid + 1) % 4
    assert run_selection(data, W_dh)["selected"]["valid_error"] > clean["selected"]["valid_error"] + 0.2


def test_evaluate_run_writes_json_and_markdown(tmp_path):
    data, W_dh = sparse_signal_dataset(n_train=800, n_valid=200, n_test=200)
    run = make_run(tmp_path / "run", W_dh, k=5)
    result = run_evaluation.evaluate_run(run, alphas=[1, 2], l2_grid=[1e-3], raw_baseline=True, dataset=data,
                                   log=lambda *_: None)
    saved = json.loads((run / "eval.json").read_text())
    assert saved["features"]["test_error"] == result["features"]["test_error"]
    assert saved["raw_baseline"]["selected"]["alpha"] is None
    md = (run / "eval.md").read_text()
    # Every trial has its own row: 2 alphas x 1 L2 for the features, 1 for raw pixels.
    assert md.count("| sparse |") == 2 and md.count("| raw |") == 1


def test_alpha_times_k_above_hidden_is_refused_before_any_work(tmp_path):
    data, W_dh = sparse_signal_dataset(n_train=50, n_valid=20, n_test=20)
    run = make_run(tmp_path / "run", W_dh, k=50)
    with pytest.raises(KsaeError, match="exceeds the 128 hidden units"):
        run_evaluation.evaluate_run(run, alphas=[1, 3], dataset=data, log=lambda *_: None)
    assert not (run / "eval.json").exists()


@pytest.mark.parametrize("text,parser,field", [("0.5,1", selection.parse_alphas, "alphas"),
                                               ("1,x", selection.parse_alphas, "alphas"),
                                               ("", selection.parse_alphas, "alphas"),
                                               ("-1e-3", selection.parse_l2, "l2_grid"), ("1,{", selection.parse_l2, "l2_grid")])
def test_bad_grids_are_user_errors_naming_the_parameter(text, parser, field):
    # The library names the Python parameter (evaluate_run's alphas, l2_grid); ksae-eval prints its flag.
    with pytest.raises(OptionError) as refused:
        parser(text)
    assert refused.value.field == field and str(refused.value).startswith(f"{field} ")
    assert text in str(refused.value)  # the value as typed, braces too


def test_linear_svm_rows_choose_C_on_validation_and_refit_on_train_and_valid(tmp_path):
    pytest.importorskip("sklearn", reason="the linear SVM rows need scikit-learn (the compare extra)")
    from ksae_cupy.evaluation.svm import linear_svm_rows

    data, W_dh = sparse_signal_dataset(n_train=800, n_valid=200, n_test=200)
    run = make_run(tmp_path / "run", W_dh, k=5)
    result = run_evaluation.evaluate_run(run, alphas=[1, 2], l2_grid=[1e-3], linear_svm=True, dataset=data,
                                   log=lambda *_: None)
    svm = result["linear_svm"]
    assert svm["alpha"] == result["features"]["selected"]["alpha"]
    assert svm["valid_error"] == min(t["valid_error"] for t in svm["trials"])
    assert svm["selected_C"] == next(t["C"] for t in svm["trials"] if t["valid_error"] == svm["valid_error"])
    assert (svm["n_train"], svm["n_train_valid"]) == (800, 1000)
    assert svm["test_error_fit_on_train"] < 0.6 and svm["test_error_refit_on_train_valid"] < 0.6  # chance: 0.75
    report = (tmp_path / "run" / "eval.md").read_text()
    assert "linear SVM" in report and "refit on 1,000" in report
    # The choice of C never reads the test labels.
    params = {"W_dh": W_dh.astype(np.float32), "b_h": np.zeros(W_dh.shape[1], np.float32),
              "c_d": np.zeros(W_dh.shape[0], np.float32)}
    encode = lambda alpha, X: features.sparse_features(params, X, 5, alpha)  # noqa: E731
    clean = linear_svm_rows(encode, data, 1.0, log=lambda *_: None)
    data.y_test = (data.y_test + 1) % 4
    poisoned = linear_svm_rows(encode, data, 1.0, log=lambda *_: None)
    assert poisoned["selected_C"] == clean["selected_C"] and poisoned["trials"] == [
        dict(t, seconds=p["seconds"]) for t, p in zip(clean["trials"], poisoned["trials"])]
    assert poisoned["test_error_fit_on_train"] > clean["test_error_fit_on_train"] + 0.2


def selection_over(data, encode, l2_grid, extend):
    """select_and_test over one feature map (no alpha); its log lines too."""
    lines = []
    result = selection.select_and_test(lambda alpha, X: encode(X), data, [None], list(l2_grid), log=lines.append,
                                      extend=extend)
    return result, lines


def test_a_best_l2_on_the_grids_weak_edge_is_followed_a_decade_further_per_step():
    data, _ = sparse_signal_dataset(n_train=600, n_valid=300, n_test=300)
    # On these rows the validation error falls with every weaker L2 down to about 1e-4.
    as_given, said = selection_over(data, lambda X: X, (1.0, 0.1), extend=0)
    assert [t["l2"] for t in as_given["trials"]] == [1.0, 0.1] and as_given["selected"]["l2"] == 0.1
    assert any("is on the edge of the values tried (1, 0.1)" in line for line in said)
    extended, said = selection_over(data, lambda X: X, (1.0, 0.1), extend=3)
    tried = [t["l2"] for t in extended["trials"]]
    assert tried == [1.0, 0.1, 0.01, 0.001, 0.0001]  # exact decades: no float noise in the new values
    assert "the best L2 (0.0001) lies beyond the --l2 grid (1, 0.1): the walk went weaker" in said
    assert extended["selected"]["valid_error"] < as_given["selected"]["valid_error"] - 0.03
    assert extended["selected"]["valid_error"] == min(t["valid_error"] for t in extended["trials"])
    assert extended["selected"]["l2"] == 0.0001 and any("a wider --l2 grid" in line for line in said)


def test_a_best_l2_on_the_grids_strong_edge_is_followed_stronger_until_a_best_inside(monkeypatch):
    # A validation error that is lowest at 1e-2, beyond the grid's strongest (the classifier stubbed out:
    # on real data near this edge the errors differ by noise only).
    curve = {1e-1: 0.30, 1e-2: 0.20, 1e-3: 0.25, 1e-4: 0.30, 1e-5: 0.35}
    monkeypatch.setattr(classifier, "fit", lambda X, y, C, l2, **_: classifier.SoftmaxModel(
        W_hc=np.zeros((X.shape[1], C)), b_c=np.zeros(C), l2=l2, converged=True))
    monkeypatch.setattr(classifier, "error_rate", lambda model, X, y: curve[model.l2])
    data, _ = sparse_signal_dataset(n_train=40, n_valid=40, n_test=40)
    as_given, _ = selection_over(data, lambda X: X, (1e-3, 1e-4, 1e-5), extend=0)
    assert as_given["selected"]["l2"] == 1e-3
    extended, said = selection_over(data, lambda X: X, (1e-3, 1e-4, 1e-5), extend=3)
    tried = [t["l2"] for t in extended["trials"]]
    assert tried == [1e-1, 1e-2, 1e-3, 1e-4, 1e-5]
    assert any("lies beyond the --l2 grid (0.001, 0.0001, 1e-05): the walk went stronger" in line for line in said)
    assert extended["selected"]["l2"] == 1e-2
    # the search stopped at a best inside what was tried: one decade past it, no more
    assert not any("on the edge" in line for line in said)


@pytest.mark.parametrize("topk_method, activation", [("sort", "linear"), ("threshold", "linear"), ("sort", "relu")])
def test_one_encoding_gives_every_alphas_codes(topk_method, activation):
    rng = np.random.default_rng(3)
    params = model.init_params(20, 30, 0.3, rng)
    params["b_h"] = rng.standard_normal(30).astype(np.float32)
    X_nd = rng.standard_normal((25, 20)).astype(np.float32)
    encode = features.CodesByAlpha(params, 4, [1, 2, 3.5], topk_method, activation=activation)
    for alpha in (3.5, 1, 2):
        shared = encode(alpha, X_nd).toarray()
        alone = features.sparse_features(params, X_nd, 4, alpha, topk_method, activation=activation).toarray()
        assert np.array_equal(shared, alone), alpha
        assert np.array_equal(shared != 0, model.encode(params, X_nd, 4, alpha, activation=activation) != 0) \
            or activation == "relu"  # relu: a kept unit may be clipped to an explicit zero
    assert len(encode._tops) == 1  # one encoding served the three alphas
