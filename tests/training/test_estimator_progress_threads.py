"""The estimator on a shared machine, as scikit-learn's estimators behave: ``verbose`` prints a line
per epoch with the time left, ``n_threads`` caps the CPU threads of ``fit`` (by default as
``ksae-train`` chooses: the environment's count, else one per free core) and only while it runs."""
from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from ksae_cupy import KSparseAutoencoder, KsaeError
from ksae_cupy import threads as threads_module
from ksae_cupy.cpu import numba_kernels as cpu_kernels

import threadpoolctl  # comes with the base install


def data(n=200, D=16, seed=0):
    return np.random.default_rng(seed).random((n, D)).astype(np.float32)


def small(**overrides):
    return KSparseAutoencoder(**{**dict(n_hidden=24, k=3, k_start=None, epochs=3, batch_size=40, device="cpu"),
                                 **overrides})


@pytest.fixture(autouse=True)
def no_command_choice(monkeypatch):
    # A command run earlier in this process (ksae-eval through CliRunner) may have chosen a count.
    monkeypatch.setattr(threads_module, "_process_threads", None)
    for name in threads_module.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def blas_threads() -> set:
    return {info["num_threads"] for info in threadpoolctl.threadpool_info() if info.get("user_api") == "blas"}


def test_verbose_prints_an_epoch_line_with_the_time_left(capsys):
    small(verbose=1, n_threads=1).fit(data(), X_valid=data(50, seed=1))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("KSparseAutoencoder: 1 CPU thread(s) (n_threads)")
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/3", "2/3", "3/3"]
    assert all(re.search(r"loss \d\.\d{4}  valid \d\.\d{4}", line) for line in epochs), epochs
    assert all("ETA " in line for line in epochs[:-1]) and "ETA" not in epochs[-1]


def test_verbose_0_is_silent(capsys):
    small().fit(data())
    assert capsys.readouterr().out == ""


def test_n_threads_holds_during_fit_only():
    before_blas, before_kernels = blas_threads(), cpu_kernels.threads()
    seen = []
    small(n_threads=1).fit(data(), on_epoch=lambda report: seen.append((blas_threads(), cpu_kernels.threads())))
    assert seen == [({1}, 1)] * 3
    assert (blas_threads(), cpu_kernels.threads()) == (before_blas, before_kernels)


def test_default_is_one_per_free_core_as_ksae_train_chooses(monkeypatch, capsys):
    monkeypatch.setattr(threads_module, "usable_cores", lambda: 4)
    monkeypatch.setattr(threads_module.os, "getloadavg", lambda: (2.2, 0.0, 0.0))  # two cores busy elsewhere
    seen = []
    small(verbose=1).fit(data(), on_epoch=lambda report: seen.append(cpu_kernels.threads()))
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("KSparseAutoencoder: 2 CPU thread(s) (default: one per free core, load average 2.2")
    numba = sys.modules.get("numba")  # the kernels' count is capped at the threads Numba started with
    assert seen == [min(2, numba.config.NUMBA_NUM_THREADS) if numba is not None else 2] * 3


def test_the_environment_count_is_kept_by_default(monkeypatch, capsys):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    small(verbose=1).fit(data())
    assert "(set by OPENBLAS_NUM_THREADS=1; n_threads N to change)" in capsys.readouterr().out.splitlines()[0]


def test_a_count_ksae_train_chose_is_kept(monkeypatch, capsys):
    monkeypatch.setattr(threads_module, "_process_threads", 1)
    small(verbose=1).fit(data())
    assert capsys.readouterr().out.splitlines()[0] == "KSparseAutoencoder: 1 CPU thread(s) (as the command set it)"


@pytest.mark.parametrize("params, fragment", [
    # scikit-learn's words (the estimator's parameter constraints, checked when fit starts)
    ({"n_threads": 0}, "The 'n_threads' parameter of KSparseAutoencoder must be an int in the range [1, inf) or None. "
                       "Got 0 instead."),
    ({"n_threads": 1.5}, "The 'n_threads' parameter of KSparseAutoencoder must be an int in the range [1, inf) or "
                         "None. Got 1.5 instead."),
    ({"verbose": -1}, "The 'verbose' parameter of KSparseAutoencoder must be an int in the range [0, inf)"),
    ({"verbose": "yes"}, "Got 'yes' instead."),
])
def test_bad_values_are_one_line_errors_naming_the_parameter(params, fragment):
    with pytest.raises(KsaeError, match=re.escape(fragment)):
        small(**params).fit(data())


@pytest.mark.parametrize("count", [0, -2, True, "{1}"])
def test_a_bad_thread_count_names_the_parameter_n_threads(count):
    # The library's name; every command prints its --threads (tests/evaluation/test_eval_grid.py, tests/parallel/...).
    from ksae_cupy.errors import OptionError

    with pytest.raises(OptionError) as refused:
        threads_module.choose_threads(count)
    assert refused.value.field == "n_threads"
    assert str(refused.value).startswith(f"n_threads {count!r} is not allowed; use a positive number of threads")


def test_the_new_parameters_are_parameters():
    est = small(verbose=1, n_threads=2)
    assert est.get_params()["verbose"] == 1 and est.get_params()["n_threads"] == 2
    sklearn_base = pytest.importorskip("sklearn.base", reason="clone needs scikit-learn")
    assert sklearn_base.clone(est).get_params() == est.get_params()
