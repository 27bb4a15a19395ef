"""The sparse fine-tuning step against the dense one, finite differences, threads, and the trainer."""
import numpy as np
import pytest

from ksae_cupy.backend import CPU
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.sparse_step import sparse_layout
from ksae_cupy.supervised import finetune
from ksae_cupy.supervised import sparse_finetune as sf
from gradcheck import matches_finite_differences, relative_error

# (D, hidden sizes, kept per layer, classes): shallow and deep (2 hidden layers), some keeping every unit.
NETS = [(6, [9], [3], 4), (5, [8], [8], 3), (7, [10, 6], [4, 2], 3), (6, [8, 7], [8, 7], 4), (20, [30, 25], [7, 5], 5)]


def draw_net(D, hidden, C, seed, N=11, dtype=np.float64):
    rng = np.random.default_rng(seed)
    params = finetune.init_random(D, hidden, C, sigma=0.7, rng=rng, dtype=np.float64)
    for name in params:
        if name.startswith("b"):
            params[name] = rng.standard_normal(params[name].shape) * 0.3
    params = {name: value.astype(dtype) for name, value in params.items()}
    return params, rng.standard_normal((N, D)).astype(dtype), rng.integers(0, C, N)


def as_array(grad):
    return np.asarray(grad)


@pytest.mark.parametrize("dtype,tolerance", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("phase", finetune.PHASES)
@pytest.mark.parametrize("D,hidden,kept,C", NETS)
def test_sparse_step_equals_the_dense_step(cpu_path, D, hidden, kept, C, phase, dtype, tolerance):
    params, X_nd, y_n = draw_net(D, hidden, C, seed=3, dtype=dtype)
    names = finetune.trainable_names(phase, len(hidden))
    loss, dense = finetune.loss_and_grads(params, X_nd, y_n, kept, names)
    # As the trainer stores it (W1 in Fortran order) and takes it (gradients in parts), and plainly.
    stored = dict(params, W1_dh=sparse_layout(params["W1_dh"]))
    for run, defer in ((params, False), (stored, True)):
        sparse_loss, sparse = sf.loss_and_grads_sparse(run, X_nd, y_n, kept, names, defer_weight_gradient=defer)
        assert sparse_loss == pytest.approx(loss, rel=tolerance)
        assert set(sparse) == set(dense) == set(names)
        for name in names:
            grad = as_array(sparse[name])
            assert grad.shape == dense[name].shape and grad.dtype == dense[name].dtype, name
            assert relative_error(grad, dense[name]) < tolerance, (name, defer)
            if name.startswith("W") and defer:
                assert hasattr(sparse[name], "momentum_update") == (cpu_path == "numba"), name


def test_the_dense_weight_gradients_are_zero_outside_the_kept_units(cpu_path):
    params, X_nd, y_n = draw_net(20, [30, 25], 5, seed=4)
    _, grads = sf.loss_and_grads_sparse(params, X_nd, y_n, [7, 5])
    _, cache = sf.forward_sparse(params, X_nd, [7, 5])
    kept_1, kept_2 = (np.unique(idx) for idx in cache.idx)
    assert not np.any(np.delete(grads["W1_dh"], kept_1, axis=1))  # only kept columns of W1
    assert not np.any(np.delete(grads["W2_hh"], kept_1, axis=0))  # rows of kept input units ...
    assert not np.any(np.delete(grads["W2_hh"], kept_2, axis=1))  # ... and columns of kept units
    assert not np.any(np.delete(grads["W_hc"], kept_2, axis=0))


@pytest.mark.parametrize("D,hidden,kept,C", NETS)
def test_sparse_step_matches_finite_differences(cpu_path, D, hidden, kept, C):
    for seed in range(20):  # redraw when a top-k support is not locally constant
        params, X_nd, y_n = draw_net(D, hidden, C, seed)

        def loss():
            return finetune.softmax_cross_entropy(sf.forward_sparse(params, X_nd, kept)[0], y_n)[0]

        def support():
            return np.concatenate([np.sort(idx, axis=1).ravel() for idx in sf.forward_sparse(params, X_nd, kept)[1].idx])

        _, grads = sf.loss_and_grads_sparse(params, X_nd, y_n, kept)
        assert set(grads) == set(params)
        if matches_finite_differences({n: as_array(g) for n, g in grads.items()}, loss, params, unchanged=support):
            return
    pytest.fail("every drawn point sat on a top-k kink")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_row_by_row_update_is_the_full_momentum_update(dtype):
    """Applied in parts, the update still decays the velocity of every entry, not only the kept ones."""
    if not cpu_kernels.enabled():
        pytest.skip("the gradient comes in parts only on the CPU kernels (Numba)")
    params, X_nd, y_n = draw_net(20, [30, 25], 5, seed=5, N=4, dtype=dtype)
    params["W1_dh"] = sparse_layout(params["W1_dh"])
    _, parts = sf.loss_and_grads_sparse(params, X_nd, y_n, [7, 5], defer_weight_gradient=True)
    assert isinstance(parts["W1_dh"], sf.InputLayerGradient)
    assert isinstance(parts["W2_hh"], sf.SparseOuterGradient) and isinstance(parts["W_hc"], sf.SparseOuterGradient)
    rng = np.random.default_rng(6)
    V0 = {name: rng.standard_normal(value.shape).astype(dtype) for name, value in params.items()}
    results = {}
    for how in ("parts", "arrays"):
        run = {name: value.copy(order="K") for name, value in params.items()}
        optimizer = MomentumSGD(run, 0.9, np)
        for name, v in optimizer.velocities.items():  # a velocity everywhere, as after earlier steps
            v[...] = V0[name]
        grads = parts if how == "parts" else {name: np.asarray(g) for name, g in parts.items()}
        optimizer.step(run, grads, 0.05)
        results[how] = (run, optimizer.velocities)
    eps = np.finfo(dtype).eps
    for name in params:
        for got, expected in zip((results["parts"][0][name], results["parts"][1][name]),
                                 (results["arrays"][0][name], results["arrays"][1][name])):
            # The same terms, possibly contracted (FMA) differently: equal to rounding.
            np.testing.assert_allclose(got, expected, rtol=0, atol=16 * eps * np.abs(expected).max(), err_msg=name)
    untouched = np.ones(params["W1_dh"].shape[1], bool)
    untouched[parts["W1_dh"].idx_nk.ravel()] = False
    assert untouched.any()  # some unit of layer 1 no example kept: its column moved by momentum alone
    np.testing.assert_array_equal(results["parts"][1]["W1_dh"][:, untouched], V0["W1_dh"][:, untouched] * dtype(0.9))


def test_sparse_step_refuses_non_numpy_arrays():
    class NotNumpy:
        pass

    with pytest.raises(KsaeError, match="NumPy arrays"):
        sf.forward_sparse({}, NotNumpy(), [3])


# -- the trainer --------------------------------------------------------------------------------

X_all, y_all, _ = make_sparse_signals(700, D=16, H=24, k=2, n_classes=3, seed=2)
X_tr, y_tr = X_all[:500], y_all[:500]


def make_trainer(step, phases=("softmax", "top", "all"), epochs=2, hidden=(20, 12), kept=(6, 4), dtype="float32",
                 **network):
    rng = np.random.default_rng(5)
    params = finetune.init_random(16, list(hidden), 3, sigma=0.1, rng=rng)
    config = finetune.FinetuneConfig(kept=list(kept), phases=list(phases), epochs=epochs, batch_size=40,
                                     lr_start=0.3, lr_end=0.01, momentum=0.5, dtype=dtype, step=step, **network)
    return finetune.FinetuneTrainer(config, CPU, params, rng)


@pytest.mark.parametrize("hidden,kept", [((20,), (6,)), ((20, 12), (6, 4))])
def test_sparse_and_dense_training_end_within_float32_rounding(cpu_path, hidden, kept):
    trainers = {step: make_trainer(step, hidden=hidden, kept=kept, epochs=3) for step in ("dense", "sparse")}
    assert trainers["sparse"].step_kind == "sparse" and trainers["dense"].step_kind == "dense"
    assert trainers["sparse"].params["W1_dh"].flags.f_contiguous
    losses = {}
    for step, trainer in trainers.items():
        losses[step] = []
        trainer.fit(X_tr, y_tr, on_epoch=lambda report, out=losses[step]: out.append(report.train_loss))
        assert trainer.finished
    np.testing.assert_allclose(losses["sparse"], losses["dense"], rtol=1e-5)
    for name, dense in trainers["dense"].params.items():
        sparse = trainers["sparse"].params[name]
        # A few float32 ulps of the largest entry (measured: at most 3).
        np.testing.assert_allclose(sparse, dense, rtol=0, atol=16 * np.finfo(np.float32).eps * np.abs(dense).max(),
                                   err_msg=name)


def test_sparse_training_is_bit_identical_whatever_the_kernels_thread_count():
    if not cpu_kernels.available():
        pytest.skip("Numba is not installed: the CPU kernels cannot run")
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip(f"Numba has {numba.config.NUMBA_NUM_THREADS} thread on this machine: nothing to compare")
    runs = []
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            cpu_kernels.set_threads(threads)
            trainer = make_trainer("sparse", hidden=(40, 30), kept=(9, 7))
            trainer.fit(X_tr, y_tr)
            runs.append(trainer.params)
    finally:
        cpu_kernels.set_threads(None)
    for name in runs[0]:
        assert runs[1][name].tobytes() == runs[0][name].tobytes(), name


# -- choosing the step --------------------------------------------------------------------------

@pytest.mark.parametrize("network,expected", [
    ({}, "sparse"),
    (dict(input_dropout=0.2), "dense"),
    (dict(hidden_dropout=0.5), "dense"),
    (dict(kept=(None, 4), activations=["sigmoid", "ksparse"]), "dense"),
])
def test_auto_takes_the_sparse_step_for_ksparse_nets_without_dropout(network, expected):
    assert make_trainer("auto", **network).step_kind == expected
    assert make_trainer("dense", **network).step_kind == "dense"


def test_auto_takes_the_dense_step_on_a_gpu_and_sparse_is_refused_there():
    from types import SimpleNamespace

    gpu = SimpleNamespace(is_gpu=True)
    assert finetune.FinetuneConfig(kept=[4], step="auto").resolved_step(gpu) == "dense"
    with pytest.raises(KsaeError, match="^step sparse runs on the CPU only"):  # the Python parameter
        finetune.FinetuneConfig(kept=[4], step="sparse").resolved_step(gpu)


@pytest.mark.parametrize("changes,fragments", [
    # in Python terms (the CLI's --step: test_cli_bad_step_or_threads_is_one_line)
    (dict(step="fast"), ["step 'fast' is not allowed", "dense, sparse, auto"]),
    (dict(step="sparse", hidden_dropout=0.5), ["step sparse needs every hidden layer ksparse and no dropout",
                                               "use step dense or auto"]),
    (dict(step="sparse", kept=[None], activations=["sigmoid"]), ["step sparse needs", "'sigmoid'"]),
    (dict(topk="fast"), ["topk 'fast' is not allowed"]),
    (dict(hidden_dropout=1.0), ["hidden_dropout 1.0 is not allowed; use a dropout rate 0 <= rate < 1"]),
])
def test_bad_step_options_are_one_line_errors(changes, fragments):
    settings = dict(kept=[4], phases=["all"], epochs=1)
    settings.update(changes)
    with pytest.raises(KsaeError) as info:
        finetune.FinetuneConfig(**settings).validate(hidden=[8])
    assert "\n" not in str(info.value) and "--" not in str(info.value)  # no command-line flag in the library
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_a_checkpoint_written_before_the_step_existed_resumes_with_the_sparse_step():
    trainer = make_trainer("dense", phases=["all"])
    trainer.run_epoch(X_tr, y_tr)
    state = trainer.state()
    del state["config"]["step"]
    resumed = finetune.FinetuneTrainer.from_state(state, CPU)
    assert resumed.config.step == "auto" and resumed.step_kind == "sparse"
    assert resumed.params["W1_dh"].flags.f_contiguous and resumed.optimizer.velocities["W1_dh"].flags.f_contiguous
    for name, value in state["velocities"].items():
        np.testing.assert_array_equal(resumed.optimizer.velocities[name], value)
    resumed.fit(X_tr, y_tr)
    assert resumed.finished


def test_configs_without_a_step_load_as_auto():
    old = {"kept": [75], "phases": ["all"], "epochs": 200, "batch_size": 128, "lr_start": 1.0, "lr_end": 0.001,
           "momentum": 0.25, "sigma": 0.01, "topk": "sort", "seed": 0, "dtype": "float32"}
    loaded = finetune.FinetuneConfig.from_dict(old)
    assert loaded.step == "auto"
    assert finetune.FinetuneConfig.from_dict(loaded.to_dict()) == loaded


# -- ksae-finetune --step, --threads --------------------------------------------------------------

QUICK = ["--no-pretraining", "--hidden", "16", "--k", "3", "--dataset", "synthetic", "--epochs", "1",
         "--batch-size", "500", "--device", "cpu", "--lr-start", "0.1", "--lr-end", "0.01"]


def finetune_cli(args):
    from click.testing import CliRunner

    from ksae_cupy.cli.finetune import finetune_command

    return CliRunner().invoke(finetune_command, [str(a) for a in args], catch_exceptions=False)


def test_cli_step_and_threads_are_recorded_and_may_change_on_resume(tmp_path):
    from ksae_cupy.session.runs import RunFolder

    out = tmp_path / "ft"
    result = finetune_cli([*QUICK, "--step", "sparse", "--threads", "1", "--run-dir", out])
    assert result.exit_code == 0, result.output
    assert "step: sparse (--step sparse)" in result.output
    config = RunFolder(out).read_config()
    assert config["finetune"]["step"] == "sparse" and config["threads"] == 1
    result = finetune_cli(["--resume", out, "--device", "cpu", "--step", "dense"])
    assert result.exit_code == 0, result.output
    assert "step: dense (--step dense)" in result.output
    config = RunFolder(out).read_config()
    assert config["finetune"]["step"] == "dense" and config["threads"] == 1  # the run's count, kept
    cpu_kernels.set_threads(None)


@pytest.mark.parametrize("args,fragments", [
    (["--step", "fast"], ["--step 'fast' is not allowed", "dense, sparse, auto"]),
    (["--step", "sparse", "--baseline", "dropout-ae"], ["--step sparse needs k-sparse layers", "--baseline dropout-ae"]),
    (["--threads", "0"], ["--threads 0 is not allowed"]),
])
def test_cli_bad_step_or_threads_is_one_line(tmp_path, args, fragments):
    from clicheck import assert_one_line_error

    quick = QUICK
    if "--baseline" in args:  # a baseline pretrains its own sigmoid layers: no --no-pretraining, no --k
        at = QUICK.index("--k")
        quick = [a for a in QUICK[:at] + QUICK[at + 2:] if a != "--no-pretraining"]
    result = finetune_cli([*quick, "--run-dir", tmp_path / "ft", *args])
    assert_one_line_error(result, *fragments, status=2)
    assert not (tmp_path / "ft" / "checkpoint.h5").exists()
