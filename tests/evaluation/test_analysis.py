"""Section 3 analysis: coherence, ITI recovery, Theorem 3.1, encoder vs ITI."""
import numpy as np
import pytest

from ksae_cupy.evaluation import analysis
from ksae_cupy.errors import KsaeError


def test_coherence_of_an_orthonormal_dictionary_is_zero():
    Q_dd, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((16, 16)))
    assert analysis.mutual_coherence(Q_dd * np.arange(1, 17)) == pytest.approx(0, abs=1e-12)  # scale-free


def test_coherence_is_one_when_a_column_repeats():
    W_dh = np.random.default_rng(1).standard_normal((10, 20))
    W_dh[:, 7] = -3 * W_dh[:, 2]  # same atom up to sign and scale
    assert analysis.mutual_coherence(W_dh) == pytest.approx(1.0, abs=1e-12)


def test_coherence_matches_a_direct_computation_and_skips_zero_norm_columns():
    rng = np.random.default_rng(2)
    W_dh = rng.standard_normal((8, 12))
    Wn = W_dh / np.linalg.norm(W_dh, axis=0)
    G = np.abs(Wn.T @ Wn) - np.eye(12)
    W_zero = np.hstack([W_dh, np.zeros((8, 1))])
    assert analysis.mutual_coherence(W_zero) == pytest.approx(G.max(), rel=1e-12)
    report = analysis.coherence_report(W_zero)
    assert report["zero_norm_columns"] == 1 and report["welch_bound"] <= report["mu"]


def test_incoherent_pair_has_the_known_coherence():
    assert analysis.mutual_coherence(analysis.incoherent_dictionary(64)) == pytest.approx(1 / 8)


@pytest.mark.parametrize("kind,D,H,k", [("gaussian", 64, 128, 5), ("incoherent", 256, 512, 12)])
def test_iti_recovers_exact_support_and_values_where_one_step_fails(kind, D, H, k):
    rng = np.random.default_rng(3)
    W_dh = analysis.incoherent_dictionary(D) if kind == "incoherent" else analysis.gaussian_dictionary(D, H, rng)
    Z_nh, support_nk = analysis.draw_sparse_codes(H, k, 100, 0.1, True, rng)
    result = analysis.iti(W_dh, Z_nh @ W_dh.T, k)
    assert result.converged_n.all()
    assert np.array_equal(result.support_nk, support_nk)
    np.testing.assert_allclose(result.Z_nh, Z_nh, atol=1e-9)
    # The same codes are beyond a single thresholding step: ITI's iterations matter.
    assert analysis.support_recovery_rate(W_dh, Z_nh, support_nk) < 0.5


def test_iti_on_an_orthonormal_dictionary_stops_after_one_inversion():
    Q_dd, _ = np.linalg.qr(np.random.default_rng(4).standard_normal((20, 20)))
    Z_nh, support_nk = analysis.draw_sparse_codes(20, 3, 10, 0.2, True, np.random.default_rng(5))
    result = analysis.iti(Q_dd, Z_nh @ Q_dd.T, 3)
    assert (result.n_iter_n == 1).all() and np.array_equal(result.support_nk, support_nk)


def test_theorem_condition_guarantees_recovery_and_violation_does_not():
    report = analysis.theorem_experiment(analysis.incoherent_dictionary(256), k=8, n=400, seed=0)
    assert report["mu"] == pytest.approx(1 / 16) and report["condition_satisfiable"]
    assert report["recovery_when_satisfied"] == 1.0
    assert report["recovery_when_violated"] < 0.95


def test_theorem_codes_satisfy_or_violate_the_condition_as_asked():
    rng = np.random.default_rng(6)
    for satisfy in (True, False):
        Z_nh, support_nk = analysis.draw_sparse_codes(50, 4, 200, 0.6, satisfy, rng)
        vals = np.take_along_axis(Z_nh, support_nk, axis=1)
        ratio = vals.min(axis=1) / vals.max(axis=1)
        assert (vals > 0).all() and ((ratio >= 0.6) == satisfy).all()


def test_theorem_on_a_coherent_dictionary_says_the_condition_cannot_hold():
    W_dh = np.random.default_rng(7).standard_normal((4, 30))
    report = analysis.theorem_experiment(W_dh, k=3, n=50)
    assert report["condition_satisfiable"] is False and report["recovery_when_satisfied"] is None
    with pytest.raises(KsaeError, match="no k-sparse code can satisfy"):
        analysis.draw_sparse_codes(30, 3, 5, 1.5, True, np.random.default_rng(0))


def test_encoder_agrees_with_iti_on_an_incoherent_dictionary_with_biases():
    rng = np.random.default_rng(8)
    W_dh = analysis.incoherent_dictionary(64)
    Z_nh, _ = analysis.draw_sparse_codes(128, 2, 100, 0.5, True, rng)  # k mu = 1/4: theorem holds
    c_d = rng.standard_normal(64)
    # x = W z + c; the encoder bias b = -W^T c undoes c, so supp_k(W^T x + b) = supp_k(W^T W z).
    params = {"W_dh": W_dh, "b_h": -(c_d @ W_dh), "c_d": c_d}
    report = analysis.encoder_vs_iti(params, Z_nh @ W_dh.T + c_d, k=2)
    assert report["encoder_vs_iti"]["exact_support_rate"] == 1.0
    assert report["first_step_vs_iti"]["exact_support_rate"] == 1.0
    assert report["relative_residual_iti"] < 1e-9
    # Without the bias the encoder is thrown off by c.
    params["b_h"] = np.zeros(128)
    assert analysis.encoder_vs_iti(params, Z_nh @ W_dh.T + c_d, k=2)["encoder_vs_iti"]["exact_support_rate"] < 0.5


def test_iti_rejects_bad_k():
    with pytest.raises(KsaeError, match="k="):
        analysis.iti(np.eye(4), np.ones((2, 4)), 5)


def test_omp_encoder_recovers_codes_of_the_true_dictionary():
    pytest.importorskip("sklearn")
    from ksae_cupy.evaluation.compare import omp_encoder

    rng = np.random.default_rng(9)
    W_dh = analysis.gaussian_dictionary(64, 128, rng)
    Z_nh, support_nk = analysis.draw_sparse_codes(128, 4, 20, 0.3, True, rng)
    c_d = rng.standard_normal(64)
    codes = omp_encoder(3 * W_dh.T, 4, c_d)(Z_nh @ W_dh.T + c_d).toarray()  # atom scale must not matter
    assert (np.count_nonzero(codes, axis=1) <= 4).all()
    np.testing.assert_allclose(codes, Z_nh, atol=1e-6)
