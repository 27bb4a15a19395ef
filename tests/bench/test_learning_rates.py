"""bin/measure-lr's measurement (:mod:`ksae_cupy.bench.learning_rates`) on a tiny model, and its options
(:mod:`ksae_cupy.recipes.measure_lr`)."""
from __future__ import annotations

import math

import pytest

from ksae_cupy.bench import learning_rates as lr
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.recipes.measure_lr import parse_args

X_ND = make_sparse_signals(256, D=16, H=24, k=3, seed=0)[0]
MODEL = dict(batch=32, hidden=24, seed=0)


def test_a_small_rate_is_stable_and_a_huge_one_is_not():
    assert lr.stable_at(X_ND, 0.01, 4, 60, **MODEL)
    assert not lr.stable_at(X_ND, 1e4, 4, 60, **MODEL)


@pytest.mark.parametrize("start", [1e-3, 100.0])  # from below the edge and from above it
def test_the_largest_stable_rate_is_stable_and_the_next_rate_of_the_grid_is_not(start):
    stable, unstable = lr.largest_stable(X_ND, 4, 60, start, **MODEL)
    assert unstable == pytest.approx(stable * math.sqrt(2))
    assert lr.stable_at(X_ND, stable, 4, 60, **MODEL) and not lr.stable_at(X_ND, unstable, 4, 60, **MODEL)
    assert math.log2(stable / start) * 2 == pytest.approx(round(math.log2(stable / start) * 2))  # on the grid


def test_a_cases_row_holds_the_datas_statistics_and_the_margin_over_lr_auto():
    row = lr.measure(4, "tiny", X_ND, 60, **MODEL)
    assert (row["data"], row["k"]) == ("tiny", 4)
    assert row["first_unstable_lr"] == pytest.approx(row["largest_stable_lr"] * math.sqrt(2), rel=1e-3)
    assert row["margin"] == pytest.approx(row["largest_stable_lr"] / row["auto_lr"], abs=0.01)
    assert row["mean_sq_norm"] == pytest.approx(float((X_ND.astype("float64") ** 2).sum(1).mean()), abs=1e-3)


def test_the_options_default_to_the_measurements_file_and_no_arguments_is_a_usage_error(capsys):
    args = parse_args(["--all"])
    assert (args.steps, args.rows, args.out) == (300, 20_000, "results/measurements/lr-auto-measurements.json")
    with pytest.raises(SystemExit) as stopped:
        parse_args([])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: no arguments; give --all ")
