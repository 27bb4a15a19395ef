"""The Numba CPU kernels (ksae_cupy/cpu/numba_kernels.py) against the NumPy/SciPy paths they replace."""
import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.cpu import numba_kernels as kernels
from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.momentum_sgd import MomentumSGD

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")


def _numpy_update(theta, velocity, grad, momentum, lr):
    velocity *= theta.dtype.type(momentum)
    velocity -= theta.dtype.type(lr) * grad
    theta += velocity


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("order", ["C", "F"])
def test_momentum_kernel_is_bit_for_bit_the_numpy_update(dtype, order):
    rng = np.random.default_rng(0)
    theta, velocity, grad = (np.asarray(rng.standard_normal((37, 23)), dtype=dtype, order=order) for _ in range(3))
    expected_theta, expected_velocity = theta.copy(order="K"), velocity.copy(order="K")
    for _ in range(5):
        _numpy_update(expected_theta, expected_velocity, grad, 0.9, 0.013)
        assert kernels.momentum_update(theta, velocity, grad, 0.9, 0.013)
    np.testing.assert_array_equal(theta, expected_theta)
    np.testing.assert_array_equal(velocity, expected_velocity)


def test_momentum_kernel_declines_mixed_layouts_and_the_fused_update_falls_back():
    rng = np.random.default_rng(1)
    params = {"W": np.asfortranarray(rng.standard_normal((5, 4)).astype(np.float32))}
    grads = {"W": np.ascontiguousarray(rng.standard_normal((5, 4)).astype(np.float32))}  # C order: mixed
    assert not kernels.momentum_update(params["W"].copy(order="K"), np.zeros_like(params["W"]), grads["W"], 0.9, 0.1)
    results = {}
    for update in (cpu_momentum.fused_step, MomentumSGD.step):  # the kernels' update, the optimizer's
        run = {"W": params["W"].copy(order="K")}
        optimizer = MomentumSGD(run, 0.9, np)
        for _ in range(3):
            update(optimizer, run, grads, 0.1)
        results[update] = run["W"]
    np.testing.assert_array_equal(results[cpu_momentum.fused_step], results[MomentumSGD.step])


def _problem(N, D, H, k, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    W_hd = rng.standard_normal((H, D)).astype(dtype)
    X_nd = rng.standard_normal((N, D)).astype(dtype)
    c_d = rng.standard_normal(D).astype(dtype)
    idx_nk = np.stack([rng.choice(H, k, replace=False) for _ in range(N)]).astype(np.int32)
    val_nk = rng.standard_normal((N, k)).astype(dtype)
    return W_hd, c_d, X_nd, idx_nk, val_nk


@pytest.mark.parametrize("relu", [False, True])
def test_decode_and_backprop_matches_the_dense_formulas(relu):
    W_hd, c_d, X_nd, idx_nk, val_nk = _problem(9, 13, 40, 5, seed=2)
    if relu:
        val_nk = np.maximum(val_nk, 0)  # what select_units hands over for ReLU: some kept units are 0
        assert (val_nk == 0).any()
    Zs_nh = model.scatter_rows(idx_nk, val_nk, 40)
    R_nd = (Zs_nh @ W_hd + c_d - X_nd) / 9
    dZ_nk = np.take_along_axis(R_nd @ W_hd.T, idx_nk, axis=1) * ((val_nk > 0) if relu else 1)
    loss, R_got, dZ_got = kernels.decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu)
    assert loss == pytest.approx(0.5 * 9 * np.sum(R_nd ** 2), rel=1e-12)
    np.testing.assert_allclose(R_got, R_nd, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dZ_got, dZ_nk, rtol=1e-12, atol=1e-14)


def test_weight_gradient_matches_the_dense_product_and_leaves_unkept_rows_zero():
    W_hd, _, X_nd, idx_nk, dZ_nk = _problem(9, 13, 40, 5, seed=3)
    val_nk = np.random.default_rng(4).standard_normal(idx_nk.shape)
    R_nd = np.random.default_rng(5).standard_normal(X_nd.shape)
    expected_hd = model.scatter_rows(idx_nk, dZ_nk, 40).T @ X_nd + model.scatter_rows(idx_nk, val_nk, 40).T @ R_nd
    got_hd = kernels.weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, 40)
    np.testing.assert_allclose(got_hd, expected_hd, rtol=1e-12, atol=1e-13)
    unkept = np.setdiff1d(np.arange(40), idx_nk)
    assert unkept.size and not got_hd[unkept].any()


def test_the_environment_switch_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv("KSAE_CPU_KERNELS", "0")
    assert not kernels.enabled()
    monkeypatch.setenv("KSAE_CPU_KERNELS", "1")
    assert kernels.enabled()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_by_row_momentum_update_equals_building_the_gradient_then_updating(dtype):
    W_hd, _, X_nd, idx_nk, dZ_nk = _problem(9, 13, 40, 5, seed=6, dtype=dtype)
    val_nk = np.random.default_rng(7).standard_normal(idx_nk.shape).astype(dtype)
    R_nd = np.random.default_rng(8).standard_normal(X_nd.shape).astype(dtype)
    V_hd = np.random.default_rng(9).standard_normal(W_hd.shape).astype(dtype)
    expected_W, expected_V = W_hd.copy(), V_hd.copy()
    _numpy_update(expected_W, expected_V, kernels.weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, 40), 0.9, 0.05)
    kernels.momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, 0.9, 0.05)
    # Sums of the same terms, possibly contracted differently: equal to rounding of the largest entry.
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(V_hd, expected_V, rtol=0, atol=16 * eps * np.abs(expected_V).max())
    np.testing.assert_allclose(W_hd, expected_W, rtol=0, atol=16 * eps * np.abs(expected_W).max())


def test_the_trainer_path_with_the_gradient_in_parts_equals_the_array_path():
    from ksae_cupy.sparse_step import RowScatterGradient, loss_and_grads_sparse, sparse_layout

    rng = np.random.default_rng(10)
    params = model.init_params(30, 60, 0.1, rng, np.float32)
    params["W_dh"] = sparse_layout(params["W_dh"])
    batches = [rng.random((16, 30), dtype=np.float32) for _ in range(4)]
    runs = {}
    for defer in (False, True):
        run = {name: value.copy(order="K") for name, value in params.items()}
        optimizer = MomentumSGD(run, 0.9, np)
        for X_nd in batches:
            _, grads, _ = loss_and_grads_sparse(run, X_nd, 5, defer_weight_gradient=defer)
            assert isinstance(grads["W_dh"], RowScatterGradient) == defer
            # The update the trainer chooses for each (ksae_cupy.training.steps).
            (cpu_momentum.rows_step if defer else cpu_momentum.fused_step)(optimizer, run, grads, 0.05)
        runs[defer] = run
    for name in model.PARAM_NAMES:
        np.testing.assert_allclose(runs[True][name], runs[False][name], rtol=1e-5, atol=1e-7, err_msg=name)
    # Made an array, the gradient in parts is the gradient.
    _, grads, _ = loss_and_grads_sparse(params, batches[0], 5, defer_weight_gradient=True)
    _, dense, _ = loss_and_grads_sparse(params, batches[0], 5)
    np.testing.assert_array_equal(np.asarray(grads["W_dh"]), dense["W_dh"])


def test_reconstruction_error_is_the_dense_squared_error():
    W_hd, c_d, X_nd, idx_nk, val_nk = _problem(11, 13, 40, 5, seed=11)
    R_nd = model.scatter_rows(idx_nk, val_nk, 40) @ W_hd + c_d - X_nd
    assert kernels.reconstruction_error(W_hd, c_d, X_nd, idx_nk, val_nk) == pytest.approx(np.sum(R_nd ** 2), rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["random", "ties", "negative", "constant", "special"])
@pytest.mark.parametrize("H", [1, 7, 31, 100, 1000])
def test_the_selection_inside_the_decoder_is_exactly_the_numpy_top_k(dtype, kind, H):
    """Same sets and the same order as topk_sort / topk_threshold: ties, NaN, infinities, signed zeros; for
    k small against H (the kernel looks first at the entries above a threshold of the row), and large."""
    from test_topk import draw_rows
    from ksae_cupy.topk import topk_sort, topk_threshold

    rng = np.random.default_rng(H)
    Z_nh = draw_rows(kind, 9, H, dtype, rng)
    D = 5
    W_hd, c_d, X_nd = rng.standard_normal((H, D)).astype(dtype), np.zeros(D, dtype), np.zeros((9, D), dtype)
    for k in sorted({1, max(1, H // 40), max(1, H // 2), H}):
        for descending, numpy_topk in ((True, topk_sort), (False, topk_threshold)):
            for relu in (False, True):
                idx_nk, val_nk = numpy_topk(Z_nh, k)
                if relu:
                    val_nk = np.maximum(val_nk, 0)
                _, got_idx, got_val, _, _ = kernels.select_decode_and_backprop(Z_nh, k, descending, W_hd, c_d, X_nd,
                                                                              relu)
                assert got_idx.dtype == np.int32 and got_val.dtype == Z_nh.dtype
                np.testing.assert_array_equal(got_idx, idx_nk)
                np.testing.assert_array_equal(got_val, val_nk)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_selection_from_the_candidates_above_a_threshold_keeps_ties_and_signed_zeros_in_order(dtype):
    """Rows whose threshold leaves more than k candidates (the kernel then looks at those only), with ties at
    the k-th value and signed zeros among the largest: the same units, in the same order, as NumPy's top-k."""
    from ksae_cupy.topk import topk_sort, topk_threshold

    rng = np.random.default_rng(31)
    Z_nh = np.round(rng.standard_normal((40, 1000)) * 4) / 4  # steps of 0.25: ties at every value
    Z_nh[:10] -= Z_nh[:10].max(axis=1, keepdims=True)  # rows whose largest entries are 0 ...
    Z_nh[:5][Z_nh[:5] == 0] = -0.0  # ... some of them -0.0
    Z_nh = Z_nh.astype(dtype)
    D = 3
    W_hd, c_d, X_nd = rng.standard_normal((1000, D)).astype(dtype), np.zeros(D, dtype), np.zeros((40, D), dtype)
    for k in (1, 25, 60):
        for descending, numpy_topk in ((True, topk_sort), (False, topk_threshold)):
            _, got_idx, _, _, _ = kernels.select_decode_and_backprop(Z_nh, k, descending, W_hd, c_d, X_nd, False)
            np.testing.assert_array_equal(got_idx, numpy_topk(Z_nh, k)[0])


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("descending", [False, True])
def test_selecting_in_the_kernel_gives_what_selecting_first_gives(relu, descending):
    from ksae_cupy.topk import topk_sort, topk_threshold

    W_hd, c_d, X_nd, _, _ = _problem(23, 17, 50, 6, seed=3)
    Z_nh = np.random.default_rng(4).standard_normal((23, 50))
    idx_nk, val_nk = (topk_sort if descending else topk_threshold)(Z_nh, 6)
    if relu:
        val_nk = np.maximum(val_nk, 0)
    loss, R_nd, dZ_nk = kernels.decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, relu)
    got = kernels.select_decode_and_backprop(Z_nh, 6, descending, W_hd, c_d, X_nd, relu)
    assert got[0] == loss
    for name, expected, value in zip(("idx", "val", "R", "dZ"), (idx_nk, val_nk, R_nd, dZ_nk), got[1:]):
        np.testing.assert_array_equal(value, expected, err_msg=name)
    assert (kernels.select_and_reconstruction_error(Z_nh, 6, descending, W_hd, c_d, X_nd, relu)
            == kernels.reconstruction_error(W_hd, c_d, X_nd, idx_nk, val_nk))


def _every_kernel(dtype):
    """Run each parallel kernel once on fresh copies of one problem; every output, by name."""
    W_hd, c_d, X_nd, idx_nk, val_nk = _problem(130, 57, 300, 9, seed=12, dtype=dtype)
    loss, R_nd, dZ_nk = kernels.decode_and_backprop(W_hd, c_d, X_nd, idx_nk, val_nk, False)
    W_rows, V_rows = W_hd.copy(), np.ones_like(W_hd)
    kernels.momentum_update_rows(W_rows, V_rows, X_nd, R_nd, idx_nk, dZ_nk, val_nk, 0.9, 0.01)
    theta, velocity = W_hd.copy(), np.ones_like(W_hd)
    kernels.momentum_update(theta, velocity, W_hd[::-1].copy(), 0.9, 0.01)
    Z_nh = np.random.default_rng(13).standard_normal((130, 300)).astype(dtype)
    selected = kernels.select_decode_and_backprop(Z_nh, 9, True, W_hd, c_d, X_nd, False)
    return {"selected " + name: np.asarray(value) for name, value in zip(("loss", "idx", "val", "R", "dZ"), selected)} | {"loss": np.array(loss), "R": R_nd, "dZ": dZ_nk, "dW": kernels.weight_gradient(X_nd, R_nd, idx_nk, dZ_nk, val_nk, 300),
            "W rows": W_rows, "V rows": V_rows, "theta": theta, "velocity": velocity,
            "error": np.array(kernels.reconstruction_error(W_hd, c_d, X_nd, idx_nk, val_nk)),
            "selected error": np.array(kernels.select_and_reconstruction_error(Z_nh, 9, False, W_hd, c_d, X_nd, True))}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_give_the_same_bits_on_one_thread_and_on_every_core(dtype):
    import numba
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(f"Numba has {numba.config.NUMBA_NUM_THREADS} thread on this machine: nothing to compare")
    try:
        kernels.set_threads(1)
        one = _every_kernel(dtype)
        assert kernels.threads() == 1
        kernels.set_threads(numba.config.NUMBA_NUM_THREADS)
        assert kernels.threads() == numba.config.NUMBA_NUM_THREADS
        many = _every_kernel(dtype)
    finally:
        kernels.set_threads(None)
    for name in one:
        np.testing.assert_array_equal(many[name], one[name], err_msg=name)


def test_a_training_run_is_bit_identical_whatever_the_kernels_thread_count():
    import numba
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(f"Numba has {numba.config.NUMBA_NUM_THREADS} thread on this machine: nothing to compare")
    X_nd = np.random.default_rng(13).random((300, 40), dtype=np.float32)
    results = []
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            kernels.set_threads(threads)
            trainer = Trainer(TrainConfig(hidden=80, k=6, k_start=12, epochs=2, batch_size=32, step="sparse"),
                              resolve_device("cpu"), D=40)
            reports = [trainer.run_epoch(X_nd, X_nd[:64]) for _ in range(2)]
            results.append((trainer.params, [(r.train_loss, r.valid_loss) for r in reports]))
    finally:
        kernels.set_threads(None)
    (params_one, losses_one), (params_many, losses_many) = results
    assert losses_one == losses_many
    for name in model.PARAM_NAMES:
        np.testing.assert_array_equal(params_many[name], params_one[name], err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lanes_give_the_same_bits_as_one_thread(dtype):
    """Each lane owns whole examples (then whole units) and computes them as one thread would."""
    from ksae_cupy.sparse_step import sparse_layout

    rng = np.random.default_rng(21)
    W_dh = sparse_layout(rng.standard_normal((57, 300)).astype(dtype) * 0.1)
    b_h, c_d = rng.standard_normal(300).astype(dtype), rng.standard_normal(57).astype(dtype)
    X_nd = rng.random((131, 57)).astype(dtype)
    results = []
    for lanes in (1, 2, 3):
        forward = kernels.encode_select_decode_and_backprop(W_dh, b_h, c_d, X_nd, 9, True, False, lanes)
        _, idx_nk, val_nk, R_nd, dZ_nk = forward
        W_hd, V_hd = W_dh.T.copy(), np.ones_like(W_dh.T)
        kernels.momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, 0.9, 0.01, lanes)
        error = kernels.encode_and_reconstruction_error(W_dh, b_h, c_d, X_nd, 9, False, True, lanes)
        results.append([np.asarray(forward[0]), *forward[1:], W_hd, V_hd, np.asarray(error)])
    for other in results[1:]:
        for name, expected, got in zip(("loss", "idx", "val", "R", "dZ", "W", "V", "error"), results[0], other):
            np.testing.assert_array_equal(got, expected, err_msg=name)
    # And the selection is topk_sort's of X W + b.
    from ksae_cupy.topk import topk_sort

    np.testing.assert_array_equal(results[0][1], topk_sort(X_nd @ W_dh + b_h, 9)[0])


def test_an_error_in_a_lane_reaches_the_caller_after_every_lane_finished():
    from ksae_cupy.cpu.lanes import Lanes

    finished = []

    def task(lane):
        if lane == 1:
            raise ValueError("lane 1 failed")
        finished.append(lane)

    lanes = Lanes(3)
    with pytest.raises(ValueError, match="lane 1 failed"):
        lanes.run(task)
    assert sorted(finished) == [0, 2]
    lanes.run(finished.append)  # the lanes still serve after a failure
    assert sorted(finished) == [0, 0, 1, 2, 2]


def test_the_update_lanes_share_the_blocks_by_their_work():
    """Lanes of the W update take contiguous blocks of units, cut where the kept pairs (plus a fixed cost a
    unit the update visits) reach an even share, not at an even count of blocks; a still unit that no example
    kept (skipped by the update) costs nothing."""
    units_per_block = kernels._UNITS_PER_BLOCK
    H, blocks = 100, -(-100 // kernels._UNITS_PER_BLOCK)
    pairs_h = np.zeros(H, dtype=np.int64)
    pairs_h[:20] = 30  # the first units hold most of the kept pairs
    start_h = np.concatenate([[0], np.cumsum(pairs_h)])
    none_still_h = np.zeros(H, dtype=np.bool_)
    for lanes in (1, 2, 3):
        bounds = kernels._blocks_balanced_by_work(start_h, none_still_h, lanes)
        assert bounds[0] == 0 and bounds[-1] == blocks and len(bounds) == lanes + 1
        assert all(a <= b for a, b in zip(bounds, bounds[1:]))
        work_h = pairs_h + kernels._FIXED_WORK_PER_UNIT
        work = [work_h[a * units_per_block:b * units_per_block].sum() for a, b in zip(bounds, bounds[1:])]
        biggest_block = max(work_h[b * units_per_block:(b + 1) * units_per_block].sum() for b in range(blocks))
        assert max(work) - min(work) <= biggest_block  # even within one block's work
    assert kernels._blocks_balanced_by_work(start_h, none_still_h, 2)[1] < blocks // 2  # not the even count's cut
    # Units 0-49 hold no pair, 50-99 two each: an even share of the work is at unit 64 (block 8) when every unit
    # is visited, at unit 75 when units 0-49 are still (skipped, no work): the cut moves up to block 9.
    pairs_h = np.where(np.arange(H) < 50, 0, 2)
    start_h = np.concatenate([[0], np.cumsum(pairs_h)])
    still_h = np.arange(H) < 50
    assert kernels._blocks_balanced_by_work(start_h, none_still_h, 2)[1] == 8
    assert kernels._blocks_balanced_by_work(start_h, still_h, 2)[1] == 9
