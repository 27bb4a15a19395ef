"""bin/bench-auxk's timing (:mod:`ksae_cupy.bench.auxk`) on tiny shapes, and its options
(:mod:`ksae_cupy.recipes.bench_auxk`)."""
from __future__ import annotations

import numpy as np
import pytest

from ksae_cupy.bench import auxk
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.recipes.bench_auxk import parse_args


def tiny(aux_k=8, hidden=40, k=3):
    X_nd = make_sparse_signals(32, D=12, H=20, k=2, seed=0)[0]
    return auxk.auxk_trainer(X_nd, k, aux_k, hidden=hidden), X_nd


def test_each_dead_fraction_is_a_row_with_its_dead_units_and_the_aux_units_each_example_uses():
    trainer, X_nd = tiny(aux_k=8, hidden=40)
    lines = []
    rows = auxk.time_dead_fractions(trainer, X_nd, 3, [0.0, 0.1, 0.5], rounds=2, log=lines.append)
    assert [(r["dead_fraction"], r["dead_units"], r["aux_units_per_example"]) for r in rows] == [
        (0.0, 0, 0), (0.1, 4, 4), (0.5, 20, 8)]  # min(aux_k, dead units)
    assert all(r["plain_ms"] > 0 and r["auxk_ms"] > 0 and r["ratio_median"] > 0 for r in rows)
    assert [r["ratio_of_medians"] for r in rows] == pytest.approx([r["auxk_ms"] / r["plain_ms"] for r in rows])
    assert len(lines) == 3 and lines[2].startswith("dead  50.0% (20 units, 8 per example): paper's step ")
    assert lines[2].endswith("(median of 2 interleaved rounds)")
    # the last fraction's dead units stay marked: exactly 20 past the window
    assert int((trainer.since_kept_h >= trainer.config.dead_window).sum()) == 20


@pytest.mark.parametrize("with_auxk", [False, True])
def test_a_timed_step_works_on_scratch_copies_and_leaves_the_parameters_alone(with_auxk):
    trainer, X_nd = tiny()
    before = {name: value.copy() for name, value in trainer.params.items()}
    assert auxk.step_seconds(trainer, X_nd, 3, auxk=with_auxk, clock=auxk.CLOCKS["wall"], steps=2) > 0
    assert set(trainer.params) == set(before)
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name])


def test_the_options_default_to_the_handbooks_table_and_no_arguments_is_a_usage_error(capsys):
    args = parse_args(["--all"])
    assert (args.aux_k, args.k, args.dead, args.rounds, args.threads, args.clock, args.out) == (
        256, 25, "0,0.01,0.05,0.135,0.45", 15, 1, "process", None)
    with pytest.raises(SystemExit) as stopped:
        parse_args([])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: no arguments; give --all ")
