"""The sparse step against the dense reference: same loss, same gradients, same training run."""
import numpy as np
import pytest

from ksae_cupy import model
from ksae_cupy.errors import KsaeError, OptionError
from ksae_cupy.sparse_step import choose_step, loss_and_grads_sparse


def draw(N, D, H, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = model.init_params(D, H, sigma=0.3, rng=rng, dtype=dtype)
    params["b_h"] = (rng.standard_normal(H) * 0.1).astype(dtype)
    params["c_d"] = (rng.standard_normal(D) * 0.1).astype(dtype)
    return params, rng.standard_normal((N, D)).astype(dtype)


@pytest.mark.parametrize("activation", model.ACTIVATIONS)
@pytest.mark.parametrize("k", [1, 4, 30])  # k = 1, a middle k, k = H
def test_sparse_step_equals_dense_step_in_float64(k, activation, cpu_path):
    params, X_nd = draw(16, 11, 30, seed=k)
    loss_d, grads_d, cache_d = model.loss_and_grads(params, X_nd, k, activation=activation)
    loss_s, grads_s, cache_s = loss_and_grads_sparse(params, X_nd, k, activation=activation)
    assert loss_s == pytest.approx(loss_d, rel=1e-12)
    np.testing.assert_array_equal(cache_s.idx_nk, cache_d.idx_nk)
    for name in model.PARAM_NAMES:
        assert grads_s[name].shape == params[name].shape
        assert grads_s[name].dtype == params[name].dtype
        np.testing.assert_allclose(grads_s[name], grads_d[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_sparse_step_keeps_float32(cpu_path):
    params, X_nd = draw(8, 6, 12, seed=0, dtype=np.float32)
    _, grads, _ = loss_and_grads_sparse(params, X_nd, 3)
    assert all(grads[name].dtype == np.float32 for name in model.PARAM_NAMES)


def test_auto_picks_sparse_for_small_k_over_h_and_dense_otherwise(cpu_path):
    assert choose_step("auto", 25, 1000) == "sparse"
    assert choose_step("auto", 1000, 1000) == "dense"
    # Up to k/H = 0.25 with the CPU kernels, 0.1 without (where each stops winning, measured).
    assert choose_step("auto", 250, 1000) == ("sparse" if cpu_path == "numba" else "dense")
    assert choose_step("auto", 251, 1000) == "dense"
    assert choose_step("dense", 1, 1000) == "dense"
    # The trainer takes the step its k resolves to (training/steps.py picks it once an epoch).
    from ksae_cupy.training.steps import step_kind
    from ksae_cupy.training.trainer import TrainConfig

    assert step_kind(TrainConfig(hidden=1000, k=1000, k_start=None, step="sparse"), 1000) == "sparse"
    assert step_kind(TrainConfig(hidden=1000, k=1000, k_start=None), 1000) == "dense"
    assert step_kind(TrainConfig(hidden=1000, k=25, k_start=None), 25, sparse=False) == "dense"


def test_unknown_step_is_a_one_line_error():
    with pytest.raises(OptionError, match="^step 'fast' is not allowed; use one of dense, sparse, auto$") as refused:
        choose_step("fast", 25, 1000)
    assert refused.value.field == "step"  # the CLI prints it as --step 'fast' ...


def _train(step: str):
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    X_nd = np.random.default_rng(5).random((200, 30), dtype=np.float32)
    config = TrainConfig(hidden=60, k=6, k_start=20, epochs=3, batch_size=32, lr=0.05, step=step)
    trainer = Trainer(config, resolve_device("cpu"), D=30)
    reports = [trainer.run_epoch(X_nd) for _ in range(config.epochs)]
    return trainer.params, [r.train_loss for r in reports]


def test_a_sparse_training_run_ends_within_float32_rounding_of_a_dense_run(cpu_path):
    dense_params, dense_losses = _train("dense")
    sparse_params, sparse_losses = _train("sparse")
    assert dense_losses[-1] < dense_losses[0]  # it trained
    np.testing.assert_allclose(sparse_losses, dense_losses, rtol=1e-4)
    for name in model.PARAM_NAMES:
        scale = np.max(np.abs(dense_params[name]))
        assert np.max(np.abs(sparse_params[name] - dense_params[name])) <= 1e-4 * scale, name


def test_config_without_step_loads_as_auto_and_rejects_unknown_step():
    from ksae_cupy.training.trainer import TrainConfig

    old = TrainConfig().to_dict()
    del old["step"]  # a checkpoint written before the switch existed
    assert TrainConfig.from_dict(old).step == "auto"
    with pytest.raises(OptionError, match="^step 'fast' is not allowed") as refused:
        TrainConfig(step="fast").validate()
    assert refused.value.spelled("--step") == "--step 'fast' is not allowed; use one of dense, sparse, auto"


def test_fortran_ordered_weights_give_a_fortran_ordered_gradient_and_the_same_values(cpu_path):
    from ksae_cupy.sparse_step import sparse_layout

    params, X_nd = draw(16, 11, 30, seed=2, dtype=np.float32)
    fortran = dict(params, W_dh=sparse_layout(params["W_dh"]))
    assert fortran["W_dh"].flags.f_contiguous and not params["W_dh"].flags.f_contiguous
    loss_c, grads_c, _ = loss_and_grads_sparse(params, X_nd, 4)
    loss_f, grads_f, _ = loss_and_grads_sparse(fortran, X_nd, 4)
    assert loss_f == loss_c
    assert grads_c["W_dh"].flags.c_contiguous  # the optimizer adds it to a C-ordered W
    assert grads_f["W_dh"].flags.f_contiguous  # a view of dW_hd: no copy
    for name in model.PARAM_NAMES:
        np.testing.assert_array_equal(grads_f[name], grads_c[name], err_msg=name)


def test_the_trainer_stores_w_in_the_layout_of_its_step():
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.trainer import TrainConfig, Trainer

    for step, fortran in (("sparse", True), ("dense", False)):
        trainer = Trainer(TrainConfig(hidden=60, k=6, k_start=20, step=step), resolve_device("cpu"), D=30)
        assert trainer.params["W_dh"].flags.f_contiguous == fortran, step
        assert trainer.optimizer.velocities["W_dh"].flags.f_contiguous == fortran, step


def test_the_data_parallel_trainer_keeps_w_c_ordered_for_its_dense_step():
    from types import SimpleNamespace

    from ksae_cupy.backend import resolve_device
    from ksae_cupy.parallel.data_parallel import DataParallelTrainer
    from ksae_cupy.training.trainer import TrainConfig

    one_rank = SimpleNamespace(rank=0, size=1)
    config = TrainConfig(hidden=60, k=6, k_start=20, step="auto")  # auto resolves to sparse here
    trainer = DataParallelTrainer(config, resolve_device("cpu"), 30, one_rank, allreduce=lambda flat: flat)
    assert trainer.params["W_dh"].flags.c_contiguous
