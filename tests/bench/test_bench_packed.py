"""The packed-runs benchmark (ksae_cupy.bench.packed: ksae-bench packed and the campaign's packed stage):
R runs packed in one launch timed against one run alone, after the packed run of seed 0 gives the loss of
the run alone and no run's loss went non-finite or grew; a run refused is reported, with no time."""
from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np
import pytest

from ksae_cupy.backend import resolve_device
from ksae_cupy.bench import packed as bench
from ksae_cupy.datasets.synthetic import make_sparse_signals
from ksae_cupy.errors import KsaeError
from ksae_cupy.training.packed import Pack

CPU = resolve_device("cpu")


@pytest.fixture(scope="module")
def X_nd():
    return make_sparse_signals(300, D=32, H=64, k=4, seed=5)[0]


def measure(X_nd, out_dir, runs=(1, 3)):
    return bench.bench_packed(X_nd, CPU, runs=runs, k=4, hidden=24, batch_size=100, epochs=2, out_dir=out_dir,
                              log=lambda line: None)


def reported_by_the_pack(change):
    """A Pack.fit whose epoch reports pass through ``change(member, report)``: a pack that trained otherwise."""
    fit = Pack.fit

    def changed_fit(self, X_train, X_valid=None, on_epoch=None, **kwargs):
        return fit(self, X_train, X_valid, lambda i, report: on_epoch(i, change(i, report)), **kwargs)

    return changed_fit


def test_packs_are_timed_against_one_run_alone_and_written_with_their_metadata(X_nd, tmp_path):
    result = measure(X_nd, tmp_path)
    assert result["status"] == "done" and result["timed_epochs"] == 2 and result["rows_per_epoch"] == 300
    assert [(row["runs"], row["stacked"]) for row in result["packs"]] == [(1, False), (3, False)]  # the CPU
    for row in result["packs"]:
        assert row["epoch_s"] > 0 and row["over_one_run"] == row["epoch_s"] / result["alone_epoch_s"]
    written = json.loads(open(result["path"]).read())
    assert written["packs"] == result["packs"] and written["meta"]["device"] == "cpu" and written["meta"]["commit"]


def test_a_packed_run_of_seed_0_that_differs_from_it_alone_is_refused(X_nd, tmp_path, monkeypatch):
    monkeypatch.setattr(Pack, "fit", reported_by_the_pack(
        lambda i, report: dataclasses.replace(report, train_loss=report.train_loss * 1.001)))
    with pytest.raises(KsaeError, match="^pack of 1: the run of seed 0 lost .* on its first epoch, alone "):
        measure(X_nd, tmp_path / "wrong")
    assert not (tmp_path / "wrong").exists()  # nothing is reported


@pytest.mark.parametrize("losses, fragment", [([3.0, math.nan, 1.0], "[3.0, nan, 1.0]"),
                                              ([3.0, 2.0, 9.0], "[3.0, 2.0, 9.0]")])
def test_a_run_whose_loss_is_not_finite_or_grew_gets_no_time(X_nd, tmp_path, monkeypatch, losses, fragment):
    def run_2_diverges(i, report):
        return dataclasses.replace(report, train_loss=losses[report.epoch - 1]) if i == 2 else report

    monkeypatch.setattr(Pack, "fit", reported_by_the_pack(run_2_diverges))
    with pytest.raises(KsaeError, match=f"^pack of 3: the run of seed 2 lost {re.escape(fragment)}"
                                        f" epoch by epoch .* it diverged; nothing is reported$"):
        measure(X_nd, tmp_path / "diverged")
    assert not (tmp_path / "diverged").exists()


def test_the_campaign_s_tiny_measure_is_done_or_failed_with_its_reason(tmp_path, monkeypatch):
    done = bench.campaign_packed("cpu", tiny=True, out_dir=tmp_path / "done")
    assert done["status"] == "done" and [row["runs"] for row in done["packs"]] == list(bench.TINY_RUNS)
    assert (done["hidden"], done["k"], done["rows_per_epoch"]) == (bench.TINY_HIDDEN, bench.TINY_K, bench.TINY_ROWS)
    monkeypatch.setattr(Pack, "fit", reported_by_the_pack(
        lambda i, report: dataclasses.replace(report, train_loss=np.float32(math.inf))))
    failed = bench.campaign_packed("cpu", tiny=True, out_dir=tmp_path / "failed")
    assert failed["status"] == "failed" and failed["reason"].startswith("pack of 1: the run of seed 0 lost inf")
    written = json.loads(open(failed["path"]).read())
    assert written["reason"] == failed["reason"] and "packs" not in written and written["meta"]["commit"]
