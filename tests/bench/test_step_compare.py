"""The step comparison (ksae_cupy.bench.step_compare): every variant validated against NumPy float64 before it
is timed, and no time for a run whose loss is not finite or grew. On a GPU, and elsewhere on the CuPy stand-in,
where the timings mean nothing but every line of our side runs; PyTorch's side runs where torch imports."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ksae_cupy.bench import step_compare
from ksae_cupy.bench.step_compare import StepSetup, refusal


@pytest.mark.parametrize("losses, fragment", [
    ([3.0, math.nan], "epoch 2's mean loss is nan: not finite"),
    ([math.inf], "epoch 1's mean loss is inf: not finite"),
    ([3.0, 2.0, 5.5], "diverged: epoch 3's mean loss 5.5 is above the untrained model's 5"),
])
def test_a_loss_not_finite_or_above_the_untrained_models_is_refused(losses, fragment):
    assert fragment in refusal(losses, 5.0)


def test_a_loss_that_falls_is_not_refused():
    assert refusal([4.9, 3.0, 2.5], 5.0) is None


class _Scripted:
    """A variant whose losses are given: the protocol around it is what is tested."""

    name, path = "scripted", "scripted"

    def __init__(self, steps, epochs):
        self._steps, self._epochs, self.resets = steps, iter(epochs), 0
        self.device_order = np.asarray

    def reset(self):
        self.resets += 1

    def steps(self, order, n_steps):
        return self._steps[:n_steps]

    def epoch(self, order):
        return next(self._epochs)


def _protocol(variant, reference, initial=10.0):
    setup = StepSetup(D=4, H=8, k=2, batch=2, validate_steps=2, epochs=5)
    orders = [np.arange(8)] * 6
    return step_compare._validate_and_time(variant, setup, orders[0], reference, orders, initial)


def test_a_variant_is_timed_only_after_its_losses_equal_the_reference():
    reference = [5.0, 4.0, 3.0, 2.5]
    good = _protocol(_Scripted(reference, [4.0, 3.0, 2.0, 2.0, 1.9, 1.8]), reference)
    assert good["validation_max_rel_diff"] == 0.0 and good["timed_epochs"] == 5 and len(good["epoch_seconds"]) == 5
    assert good["seconds_per_epoch"] == pytest.approx(float(np.median(good["epoch_seconds"])))
    # 1% off the reference (a wrong rate does more): refused before any epoch, never timed
    off = _protocol(_Scripted([5.0, 4.04, 3.0, 2.5], [4.0] * 6), reference)
    assert off["refused"].startswith("validation: losses differ") and "epoch_losses" not in off
    assert "seconds_per_epoch" not in off


def test_a_run_that_goes_to_nan_or_diverges_gets_no_time_and_says_why():
    reference = [5.0, 4.0, 3.0, 2.5]
    nan = _protocol(_Scripted(reference, [4.0, 3.0, math.nan, 2.0, 2.0, 2.0]), reference)
    assert "not finite" in nan["refused"] and "no time reported" in nan["refused"]
    assert not {"seconds_per_epoch", "epoch_seconds", "warmup_seconds"} & set(nan)
    grew = _protocol(_Scripted(reference, [4.0, 3.0, 2.0, 2.0, 2.0, 11.0]), reference)
    assert "diverged: epoch 6's" in grew["refused"] and "seconds_per_epoch" not in grew


def test_mnist_like_rows_are_on_mnists_scale():
    X_nd = step_compare.mnist_like(4000, 784, seed=0)
    assert X_nd.dtype == np.float32 and X_nd.min() >= 0.0 and X_nd.max() <= 1.0
    assert 0.18 < np.mean(X_nd > 0) < 0.20  # MNIST: 19% of the pixels non-zero
    assert 40 < np.mean(np.sum(X_nd.astype(np.float64) ** 2, axis=1)) < 60  # MNIST ~80; uniform [0, 1): 261


def _check_common(data):
    for key in ("device", "numpy", "commit", "date", "python"):
        assert data["meta"][key], key
    assert "torch" in data["meta"]
    assert data["setup"]["epochs"] >= 5 and data["setup"]["dtype"] == "float32"
    assert len(data["reference_losses"]) == 2 * data["setup"]["validate_steps"]
    results = data["results"]
    for name, r in results.items():
        assert "refused" not in r, (name, r)
        assert r["validation_max_rel_diff"] <= step_compare.VALIDATE_RTOL
        assert r["timed_epochs"] == 5 and r["seconds_per_epoch"] > 0
        # trained the same model on the same batches: the same epoch losses to float32 rounding, falling
        np.testing.assert_allclose(r["epoch_losses"], results["ours_trainer"]["epoch_losses"], rtol=1e-4)
        assert r["epoch_losses"][-1] < data["untrained_loss"]
    absent = data["absent"]
    if data["meta"]["torch"] is None:  # torch does not import here: recorded as absent, never timed
        assert "torch does not import" in absent["torch"] and not {"torch_eager", "torch_graph"} & set(results)
    elif data["meta"]["device"] == "cpu":  # PyTorch's eager step on the CPU (validated and timed above), no graph
        assert "torch_eager" in results and absent["torch_graph"] == step_compare.TORCH_GRAPH_ON_CPU
    elif data["meta"]["torch_cuda_available"]:  # a GPU: both of PyTorch's steps validated and timed above
        assert {"torch_eager", "torch_graph"} <= set(results)
    else:  # a GPU run (here: the CuPy stand-in) beside a torch without CUDA: PyTorch on the CPU is no comparison
        assert "sees no CUDA device" in absent["torch_eager"] and absent["torch_graph"] == absent["torch_eager"]


@pytest.mark.gpu
def test_every_variant_on_the_gpu_is_validated_then_timed(tmp_path, gpu_cupy):
    out = step_compare.compare_steps("gpu", tiny=True, out_dir=tmp_path)
    data = json.loads(open(out["path"]).read())
    assert data["meta"]["cupy"] and data["meta"]["cuda_runtime"]
    assert {"ours_step_graphs_sort", "ours_step_graphs_threshold", "ours_trainer"} <= set(data["results"])
    assert data["results"]["ours_trainer"]["path"] != "generic step"  # on a GPU the trainer replays a capture
    _check_common(data)


def test_on_the_cpu_the_trainer_is_validated_then_timed(tmp_path):
    out = step_compare.compare_steps("cpu", tiny=True, out_dir=tmp_path)
    data = json.loads(open(out["path"]).read())
    assert data["meta"]["device"] == "cpu" and "ours_trainer" in data["results"]
    assert "not a GPU" in data["absent"]["ours_step_graphs"]
    assert data["setup"]["start"].startswith("trained: 2 epochs")  # the default start: a trained model
    _check_common(data)


def test_the_trained_start_is_not_the_fresh_one_and_a_bad_start_is_refused():
    trained = step_compare.compare_steps("cpu", tiny=True, write=False, validate_only=True)
    fresh = step_compare.compare_steps("cpu", tiny=True, write=False, validate_only=True, start="fresh")
    assert fresh["setup"]["start"].startswith("fresh")
    assert trained["reference_losses"][0] < fresh["reference_losses"][0]  # two epochs in: a lower loss
    with pytest.raises(ValueError, match="start 'half' is not allowed; use one of trained, fresh"):
        step_compare.compare_steps("cpu", tiny=True, write=False, start="half")


def test_validate_only_validates_every_variant_and_times_none():
    out = step_compare.compare_steps("cpu", tiny=True, write=False, validate_only=True)
    assert out["setup"]["validate_only"] and "ours_trainer" in out["results"]
    assert ("torch_eager" in out["results"]) == (out["meta"]["torch"] is not None)  # where torch imports
    for name, r in out["results"].items():
        assert "refused" not in r and r["validation_max_rel_diff"] <= step_compare.VALIDATE_RTOL, name
        assert not {"epoch_losses", "seconds_per_epoch", "warmup_seconds"} & set(r), name


def test_fewer_than_five_timed_epochs_are_refused():
    with pytest.raises(ValueError, match="epochs 3 is not allowed; use at least 5"):
        step_compare.compare_steps("cpu", tiny=True, epochs=3, write=False)


def test_a_variant_at_another_rate_than_the_references_is_refused(tmp_path, monkeypatch):
    """What went wrong in 2026-11: two sides at different rates. Here the reference runs at twice the rate
    of the variants: every variant is refused before it is timed."""
    reference = step_compare.reference_losses
    monkeypatch.setattr(step_compare, "reference_losses", lambda setup, *args: reference(
        StepSetup(**{**setup.__dict__, "lr": 2 * setup.lr}), *args))
    out = step_compare.compare_steps("cpu", tiny=True, write=False)
    trainer = out["results"]["ours_trainer"]
    assert trainer["refused"].startswith("validation: losses differ") and "seconds_per_epoch" not in trainer


@pytest.mark.parametrize("start", ["fresh", "trained"])
@pytest.mark.parametrize("shape", [step_compare.TINY, dict(D=784, H=1000, k=25, batch=32, validate_steps=4,
                                                           trained_epochs=1)],
                         ids=["tiny", "mnist-like"])
def test_pytorchs_step_takes_the_reference_steps_on_the_cpu(shape, start):
    """PyTorch's step (the very function its CUDA graph captures) against NumPy float64, step by step, from the
    initial weights and from a trained model, where torch imports; where it does not, its absence is what the
    comparison records, and our trainer's steps are checked alone (they are in either case)."""
    from ksae_cupy.backend import resolve_device

    setup = StepSetup(**shape)
    X_nd = step_compare.mnist_like(8 * setup.batch, setup.D, seed=0)
    state = step_compare.ModelState.fresh(setup) if start == "fresh" else \
        step_compare.ModelState.trained(resolve_device("cpu"), setup, X_nd)
    assert (np.count_nonzero(state.velocities["W_dh"]) > 0) == (start == "trained")
    order = np.random.default_rng(1).permutation(len(X_nd))
    V, B = setup.validate_steps, setup.batch
    reference = step_compare.reference_losses(setup, state, X_nd, [order[b * B:(b + 1) * B] for b in range(V)] * 2)
    assert sum(reference[V:]) < sum(reference[:V])  # it learns: the same batches cost less the second time
    ours = step_compare.OursTrainer(resolve_device("cpu"), setup, X_nd, state).steps(order, V)
    np.testing.assert_allclose(ours, [np.mean(reference[:V]), np.mean(reference[V:])], rtol=1e-5)
    torch, why = step_compare.import_torch()
    if torch is None:
        assert why.startswith("torch does not import")
        return
    step = step_compare.TorchStep(torch, setup, state, X_nd, "cpu", captured=False)
    two_passes = step.device_order(np.concatenate([order[:V * B]] * 2))
    got = step.steps(two_passes, 2 * V)
    assert step_compare.worst_relative_difference(got, reference) < 1e-5  # float32 against float64: ~1e-7
    step.reset()  # back to the initial state in place: the same steps again
    assert step.steps(two_passes, 2 * V) == got
    with pytest.raises(ValueError, match="captured on device 'cpu' is not allowed; a CUDA graph needs a cuda device"):
        step_compare.TorchStep(torch, setup, state, X_nd, "cpu", captured=True)
