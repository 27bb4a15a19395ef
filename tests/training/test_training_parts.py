"""Schedules, the optimiser step, and the run configuration's validation."""
import numpy as np
import pytest

from ksae_cupy.errors import KsaeError, OptionError, cli_name
from ksae_cupy.momentum_sgd import MomentumSGD
from ksae_cupy.schedules import linear_decay, resolve_k_start, sparsity_at_epoch
from ksae_cupy.training.trainer import TrainConfig


def test_sparsity_schedule_is_linear_over_the_first_half():
    ks = [sparsity_at_epoch(e, 10, k=15, k_start=100) for e in range(10)]
    assert ks == [100, 83, 66, 49, 32, 15, 15, 15, 15, 15]
    assert sparsity_at_epoch(0, 5000, 25, 100) == 100
    assert sparsity_at_epoch(1250, 5000, 25, 100) == 62  # halfway down: 100 - 75/2 = 62.5 -> 62 (round half to even)
    assert sparsity_at_epoch(2500, 5000, 25, 100) == 25
    assert [sparsity_at_epoch(e, 3, 25, None) for e in range(3)] == [25, 25, 25]


def test_k_start_default_fits_k_and_hidden():
    assert resolve_k_start("auto", 25, 1000) == 100
    assert resolve_k_start("auto", 150, 4000) == 150  # k above 100: schedule starts at k
    assert resolve_k_start("auto", 5, 64) == 64  # never above the hidden units
    assert resolve_k_start(None, 5, 64) is None


def test_linear_learning_rate_decay():
    assert linear_decay(0, 200, 1.0, 0.001) == 1.0
    assert linear_decay(199, 200, 1.0, 0.001) == pytest.approx(0.001)
    assert linear_decay(99, 199, 1.0, 0.0) == pytest.approx(0.5)


def test_momentum_step_matches_hand_computation():
    params = {"w": np.array([1.0, -2.0])}
    opt = MomentumSGD(params, momentum=0.9, xp=np)
    opt.step(params, {"w": np.array([0.5, 1.0])}, lr=0.1)
    # v1 = 0.9*0 - 0.1*g = [-0.05, -0.1];  w1 = w0 + v1
    np.testing.assert_allclose(params["w"], [0.95, -2.1])
    opt.step(params, {"w": np.array([1.0, 0.0])}, lr=0.1)
    # v2 = 0.9*v1 - 0.1*g = [-0.145, -0.09];  w2 = w1 + v2
    np.testing.assert_allclose(opt.velocities["w"], [-0.145, -0.09])
    np.testing.assert_allclose(params["w"], [0.805, -2.19])


@pytest.mark.parametrize("change,message", [
    ({"k": 0}, "k 0"), ({"k": 11}, "k 11"), ({"hidden": 0}, "hidden 0"),
    ({"k_start": 3}, "k_start 3"), ({"epochs": 0}, "epochs 0"), ({"batch_size": 0}, "batch_size 0"),
    ({"lr": 0.0}, "lr 0.0"), ({"momentum": 1.0}, "momentum 1.0"), ({"momentum": -0.1}, "momentum -0.1"),
    ({"sigma": -1.0}, "sigma -1.0"), ({"topk": "heap"}, "topk 'heap'"), ({"step": "fast"}, "step 'fast'"),
    ({"activation": "tanh"}, "activation 'tanh'"), ({"aux_k": 11}, "aux_k 11"), ({"dead_window": 0}, "dead_window 0"),
    ({"dtype": "float16"}, "dtype 'float16'"),
])
def test_config_rejects_bad_values_naming_the_field(change, message):
    """The library speaks Python: the message names the field; a command line prints its flag instead."""
    values = dict(hidden=10, k=5, k_start=8, epochs=2, batch_size=4)
    values.update(change)
    with pytest.raises(OptionError) as refused:
        TrainConfig(**values).validate(n_train=100)
    field = next(iter(change))
    assert refused.value.field == field
    assert str(refused.value).startswith(message + " is not allowed"), str(refused.value)
    flag = "--" + field.replace("_", "-")
    assert refused.value.spelled(flag, lambda other: "--" + other.replace("_", "-")).startswith(
        flag + message[len(field):] + " is not allowed")
    assert "--" not in str(refused.value)


def test_config_messages_name_the_other_fields_as_the_caller_spells_them():
    with pytest.raises(OptionError, match=r"^k 11 is not allowed; use 1 <= k <= hidden \(10\)$"):
        TrainConfig(hidden=10, k=11, k_start=None).validate()
    with pytest.raises(OptionError, match=r"^k 11 is not allowed; use 1 <= k <= n_hidden \(10\)$") as refused:
        TrainConfig(hidden=10, k=11, k_start=None).validate(name=lambda field: {"hidden": "n_hidden"}.get(field, field))
    assert refused.value.field == "k"
    with pytest.raises(OptionError) as refused:
        TrainConfig(hidden=10, k=5, k_start=3).validate()
    assert refused.value.spelled("--k-start") == "--k-start 3 is not allowed; use --k-start >= k (5)"
    # A caller that still spells fields as flags (name=cli_name) gets its spelling, and the other field in words.
    with pytest.raises(KsaeError, match=r"^--k 11 is not allowed; use 1 <= k <= hidden \(10\)$"):
        TrainConfig(hidden=10, k=11, k_start=None).validate(name=cli_name)


def test_config_rejects_batch_larger_than_training_set():
    with pytest.raises(KsaeError, match="^batch_size 200.*100 training"):
        TrainConfig(hidden=10, k=5, k_start=None, batch_size=200).validate(n_train=100)
