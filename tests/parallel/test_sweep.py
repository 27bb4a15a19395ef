"""ksae-sweep on a LocalCluster: one result per configuration, equal to running it alone."""
import json

import numpy as np
import pytest

pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed (pip install 'ksae-cupy[sweep]')")

from ksae_cupy.parallel.sweep import grid, run_one, run_sweep, write_results  # noqa: E402


def test_sweep_rows_equal_single_runs(tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((200, 8)).astype(np.float32))
    data = str(tmp_path / "x.npy")
    specs = grid([2, 3], [1, 2], [16], [0], [2], base={"batch_size": 50, "k_start": None})
    assert len(specs) == 2
    rows = run_sweep(specs, data, workers=2, log=lambda *a: None)
    assert len(rows) == 4  # 2 trained models x 2 alphas
    assert [(r["k"], r["alpha"]) for r in rows] == [(2, 1.0), (2, 2.0), (3, 1.0), (3, 2.0)]
    alone = [row for spec in specs for row in run_one(spec, data)]
    for got, want in zip(rows, alone):
        for key in ("final_train_loss", "final_valid_loss", "valid_loss_alpha_k", "kept"):
            # Same seed, data and batches; only BLAS threading may differ between a worker
            # (OMP_NUM_THREADS=1) and this process, which can reorder a dot product's sum.
            assert got[key] == pytest.approx(want[key], rel=1e-6), key
    json_path, md_path = write_results(rows, tmp_path / "out")
    assert len(json.loads(json_path.read_text())) == 4
    assert md_path.read_text().count("\n") == 2 + 4


def test_lr_auto_is_resolved_from_the_data_on_the_worker_and_recorded(tmp_path):
    from ksae_cupy.training.learning_rate import auto_learning_rate

    X = np.random.default_rng(1).standard_normal((200, 8)).astype(np.float32) * 3
    np.save(tmp_path / "x.npy", X)
    (spec,) = grid([2], [1], [16], [0], [2], base={"batch_size": 50, "k_start": None, "lr": "auto", "threads": 2})
    (row,) = run_one(spec, str(tmp_path / "x.npy"))
    from ksae_cupy.datasets import load_dataset

    train = load_dataset(str(tmp_path / "x.npy"), log=lambda *a: None).X_train
    assert row["lr"] == auto_learning_rate(train) and row["threads"] == 2
    assert np.isfinite(row["final_valid_loss"])


@pytest.mark.parametrize("args, fragment", [(["--lr", "fast"], "--lr 'fast' is not allowed"),
                                            (["--threads", "0"], "--threads 0 is not allowed")])
def test_bad_lr_or_threads_is_one_line_before_any_cluster(tmp_path, args, fragment):
    from click.testing import CliRunner

    from clicheck import assert_one_line_error
    from ksae_cupy.cli.sweep import sweep_command

    np.save(tmp_path / "x.npy", np.zeros((50, 4), dtype=np.float32))
    result = CliRunner().invoke(sweep_command, [str(tmp_path / "x.npy"), "--out", str(tmp_path / "o"), *args])
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "o").exists()
