"""No state array holds a denormal, and the W update skips the units that cannot move.

A unit no example keeps gets a zero gradient; its velocity decays by the momentum each step and, without a
flush, stops at the smallest denormals (0.9 times them rounds back to themselves), where x86 arithmetic is
many times slower. Every momentum update flushes denormals to zero (``ksae_cupy.momentum_sgd.flush_denormals``,
the CPU kernels' ``_flushed``, the GPU step's ``_flush_denormals``). Once a dead unit's velocity is zero, the
row-by-row W update skips it (``still_h``), which must change no bit.
"""
import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.cpu import momentum as cpu_momentum
from ksae_cupy.cpu import numba_kernels as kernels
from ksae_cupy.momentum_sgd import MomentumSGD, flush_denormals, momentum_update
from ksae_cupy.packed_step import stacked_momentum_update

needs_numba = pytest.mark.skipif(not kernels.available(),
                                 reason="Numba is not installed (pip install '.[fast]'): the CPU kernels cannot run")

DTYPES = [np.float32, np.float64]


def _smallest_denormal(dtype):
    return np.nextafter(dtype(0), dtype(1))


def _has_denormal(a) -> bool:
    a = np.asarray(a)
    return bool(np.any((a != 0) & (np.abs(a) < np.finfo(a.dtype).tiny)))


def _planted(dtype, shape=(6, 5), order="C"):
    """``(theta, velocity, grad)``: a velocity at the smallest denormal (and its negative) where the gradient
    is zero, ordinary values elsewhere; ``theta`` holds a denormal too."""
    rng = np.random.default_rng(0)
    theta = np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)
    velocity = np.asarray(rng.standard_normal(shape) * 0.01, dtype=dtype, order=order)
    grad = np.asarray(rng.standard_normal(shape), dtype=dtype, order=order)
    tiny = _smallest_denormal(dtype)
    velocity[0, :], grad[0, :] = tiny, 0
    velocity[1, 0], grad[1, 0] = -tiny, 0
    theta[2, 2] = 3 * tiny
    return theta, velocity, grad


@pytest.mark.parametrize("dtype", DTYPES)
def test_flush_sets_denormals_and_negative_zero_to_plus_zero_and_keeps_the_rest(dtype):
    tiny = np.finfo(dtype).tiny
    a = np.array([_smallest_denormal(dtype), -tiny / 2, -0.0, tiny, -tiny, 1.5, np.nan, np.inf, -np.inf], dtype=dtype)
    flush_denormals(a)
    np.testing.assert_array_equal(a[:3], 0)
    assert not np.signbit(a[:3]).any()
    np.testing.assert_array_equal(a[3:6], np.array([tiny, -tiny, 1.5], dtype=dtype))
    assert np.isnan(a[6]) and a[7] == np.inf and a[8] == -np.inf


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_velocity_at_the_smallest_denormal_is_zero_after_one_numpy_update(dtype):
    theta, velocity, grad = _planted(dtype)
    momentum_update(theta, velocity, grad, 0.9, 0.01)
    assert velocity[0].tolist() == [0.0] * 5 and velocity[1, 0] == 0
    assert not _has_denormal(velocity) and not _has_denormal(theta)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_stacked_update_of_packed_runs_flushes_too(dtype):
    theta, velocity, grad = _planted(dtype)
    theta_m, v_m, grad_m = (np.stack([a, a]) for a in (theta, velocity, grad))
    stacked_momentum_update(theta_m, v_m, grad_m, np.array([0.9, 0.5], dtype=dtype), np.array([0.01, 0.1], dtype=dtype))
    assert v_m[:, 0].tolist() == [[0.0] * 5] * 2
    assert not _has_denormal(v_m) and not _has_denormal(theta_m)


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_the_fused_kernel_flushes_as_the_numpy_update_does_bit_for_bit(dtype, order):
    theta, velocity, grad = _planted(dtype, (40, 30), order)
    expected_theta, expected_velocity = theta.copy(order="K"), velocity.copy(order="K")
    for _ in range(3):
        momentum_update(expected_theta, expected_velocity, grad, 0.9, 0.01)
        assert kernels.momentum_update(theta, velocity, grad, 0.9, 0.01)
    assert velocity[0].tolist() == [0.0] * 30 and not _has_denormal(velocity) and not _has_denormal(theta)
    assert theta.tobytes() == expected_theta.tobytes() and velocity.tobytes() == expected_velocity.tobytes()


def _row_problem(dtype, N=12, D=9, H=40, k=3, seed=3):
    """A batch whose kept units are the first ``H // 2`` only: the others get no gradient."""
    rng = np.random.default_rng(seed)
    X_nd = rng.standard_normal((N, D)).astype(dtype)
    R_nd = rng.standard_normal((N, D)).astype(dtype)
    idx_nk = np.stack([rng.choice(H // 2, k, replace=False) for _ in range(N)]).astype(np.int32)
    dZ_nk, val_nk = (rng.standard_normal((N, k)).astype(dtype) for _ in range(2))
    W_hd = rng.standard_normal((H, D)).astype(dtype)
    V_hd = (rng.standard_normal((H, D)) * 0.01).astype(dtype)
    return W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_dead_units_velocity_in_the_row_update_is_zero_after_one_step_from_the_smallest_denormal(dtype):
    W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk = _row_problem(dtype)
    V_hd[30:] = _smallest_denormal(dtype)  # units no example keeps
    V_hd[25, 0] = -_smallest_denormal(dtype)
    kernels.momentum_update_rows(W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk, 0.9, 0.01)
    assert not V_hd[30:].any() and V_hd[25, 0] == 0
    assert not _has_denormal(V_hd) and not _has_denormal(W_hd)


@needs_numba
def test_the_fine_tuning_row_updates_flush_denormals():
    from ksae_cupy.cpu import finetune_kernels

    rng = np.random.default_rng(4)
    W_im, V_im = rng.standard_normal((10, 6)).astype(np.float32), np.zeros((10, 6), dtype=np.float32)
    V_im[5:] = _smallest_denormal(np.float32)
    idx_nk = np.array([[0, 1], [2, 3]], dtype=np.int32)  # rows 5-9 get no gradient
    coef_nk = rng.standard_normal((2, 2)).astype(np.float32)
    finetune_kernels.momentum_update_dense_rows(W_im, V_im, idx_nk, coef_nk, rng.standard_normal((2, 6)).astype(
        np.float32), 0.9, 0.01)
    assert not V_im[5:].any() and not _has_denormal(V_im)
    V_im[5:] = _smallest_denormal(np.float32)
    idx_nt = np.array([[0, 4], [1, 5]], dtype=np.int32)
    finetune_kernels.momentum_update_sparse_rows(W_im, V_im, idx_nk, coef_nk, idx_nt, coef_nk.copy(), 0.9, 0.01)
    assert not V_im[5:].any() and not _has_denormal(V_im)


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lanes", [1, 2])
def test_skipping_still_units_changes_no_bit_and_skips_them(dtype, lanes):
    """Many steps where half the units are never kept: the update with the still flags equals, bit for bit,
    the update that visits every unit, and once their velocities decayed to 0 those units are flagged still."""
    W_hd, V_hd, X_nd, R_nd, idx_nk, dZ_nk, val_nk = _row_problem(dtype)
    V_hd[20:] = np.linspace(-1e-3, 1e-3, V_hd[20:].size).reshape(V_hd[20:].shape)
    V_hd[20:25] = 0  # still from the start
    visit_all = W_hd.copy(), V_hd.copy()
    skipping = W_hd.copy(), V_hd.copy()
    still_h = np.zeros(W_hd.shape[0], dtype=np.bool_)
    steps = 1000 if dtype == np.float32 else 7000  # 0.9^n * 1e-3 below the smallest normal
    flagged_after_first = None
    for step in range(steps):
        kernels.momentum_update_rows(*visit_all, X_nd, R_nd, idx_nk, dZ_nk, val_nk, 0.9, 1e-6, lanes)
        kernels.momentum_update_rows(*skipping, X_nd, R_nd, idx_nk, dZ_nk, val_nk, 0.9, 1e-6, lanes, still_h)
        if step == 0:
            flagged_after_first = still_h.copy()
    assert flagged_after_first[20:25].all() and not flagged_after_first[25:].any()
    kept_h = np.zeros(W_hd.shape[0], dtype=np.bool_)
    kept_h[idx_nk.ravel()] = True  # within the first 20 units
    assert still_h[~kept_h].all() and not still_h[kept_h].any() and still_h[20:].all()
    for a, b in zip(visit_all, skipping):
        assert a.tobytes() == b.tobytes()
    assert not visit_all[1][20:].any()


@needs_numba
def test_the_optimizer_keeps_still_flags_for_its_own_velocity_and_starts_them_anew_for_another():
    params = {"W_dh": np.asfortranarray(np.ones((4, 8), dtype=np.float32))}
    optimizer = MomentumSGD(params, 0.9, np)
    flags = cpu_momentum.still_units(optimizer, optimizer.velocities["W_dh"])
    assert flags.shape == (8,) and not flags.any()
    flags[:] = True
    assert cpu_momentum.still_units(optimizer, optimizer.velocities["W_dh"]) is flags
    optimizer.velocities = {"W_dh": np.asfortranarray(np.ones((4, 8), dtype=np.float32))}  # shared or restored
    assert not cpu_momentum.still_units(optimizer, optimizer.velocities["W_dh"]).any()


@needs_numba
def test_a_run_with_dead_units_holds_no_denormal_after_fifty_epochs_and_skips_them():
    """The paper's recipe on data where most units die: after 50 epochs no parameter or velocity holds a
    denormal, the dead units' velocities are exactly zero, and the update flags them still."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    rng = np.random.default_rng(5)
    X_nd = (rng.random((256, 20)) ** 4).astype(np.float32)  # sparse-ish positive inputs: many units die
    trainer = Trainer(TrainConfig(hidden=64, k=3, k_start=12, epochs=50, batch_size=4, step="sparse", lr=0.05),
                      resolve_device("cpu"),
                      D=20)
    for _ in range(50):
        trainer.run_epoch(X_nd, X_nd[:64])
    for group in (trainer.params, trainer.optimizer.velocities):
        for name, value in group.items():
            assert not _has_denormal(value), name
    # Dead long enough: no example kept them over the last 20 epochs (1,280 steps; 0.9^770 takes a velocity of
    # 1e-3 below the smallest normal float32).
    dead = np.asarray(trainer.since_kept_h) >= 20 * len(X_nd)
    assert dead.sum() >= 8  # the premise: units die on these data
    V_dh = trainer.optimizer.velocities["W_dh"]
    assert not V_dh[:, dead].any()
    assert cpu_momentum.still_units(trainer.optimizer, V_dh)[dead].all()


def test_the_dense_numpy_step_and_the_kernel_step_agree_on_a_run_with_dead_units():
    """Float32 rounding only: the flushed update of the kernels against the NumPy optimizer on the dense step."""
    if not kernels.available():
        pytest.skip("Numba is not installed")
    rng = np.random.default_rng(6)
    params = model.init_params(20, 48, 0.1, rng, np.float32)
    X_nd = (rng.random((64, 20)) ** 4).astype(np.float32)
    results = []
    for update in (MomentumSGD.step, cpu_momentum.fused_step):
        run = {name: value.copy(order="K") for name, value in params.items()}
        optimizer = MomentumSGD(run, 0.9, np)
        for _ in range(300):
            _, grads, _ = model.loss_and_grads(run, X_nd, 3, "sort", "linear")
            update(optimizer, run, grads, 0.05)
        assert not any(_has_denormal(v) for v in optimizer.velocities.values())
        results.append(run)
    for name in model.PARAM_NAMES:
        assert results[0][name].tobytes() == results[1][name].tobytes(), name
