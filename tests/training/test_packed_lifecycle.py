"""A packed run's folder goes through ksae-train's lifecycle (ksae_cupy/session/lifecycle.py): a guarantee
the lifecycle makes for ksae-train reaches every run of a pack, refused with ksae-train's own line."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.backend import CPU
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets import load_dataset
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.packed_runs import train_packed
from ksae_cupy.training.trainer import TrainConfig

OPTIONS = dict(hidden=16, k=3, epochs=1, batch_size=50, lr=0.01, seed=1, k_start=None)


def quiet(line):
    pass


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.npy"
    np.save(path, np.random.default_rng(0).standard_normal((400, 12)).astype(np.float32))
    return path


def packed_once(rows_file, folder, epochs: int = 1):
    data = load_dataset(str(rows_file), log=quiet)
    return train_packed([TrainConfig(**{**OPTIONS, "epochs": epochs})], data, CPU, [folder], dataset=str(rows_file),
                        settings={"threads": 1}, log=quiet)


def ksae_train_resume_error(folder) -> str:
    result = CliRunner().invoke(train_command, ["--resume", str(folder), "--epochs", "2", "--quiet"])
    assert result.exit_code != 0, result.output
    return result.output.strip().splitlines()[-1].removeprefix("error: ")


def test_a_pack_refuses_a_run_whose_data_file_changed_with_ksae_trains_line(rows_file, tmp_path):
    folder = tmp_path / "run"
    packed_once(rows_file, folder)
    changed = np.load(rows_file)
    changed[0, 0] += 1.0
    np.save(rows_file, changed)
    with pytest.raises(KsaeError) as refused:
        packed_once(rows_file, folder, epochs=2)
    assert "data file" in str(refused.value) and "changed since the run started" in str(refused.value)
    assert str(refused.value) == ksae_train_resume_error(folder)
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 1  # nothing trained on the other rows


def test_a_pack_refuses_a_folder_another_process_holds_with_ksae_trains_line(rows_file, tmp_path):
    folder = tmp_path / "run"
    packed_once(rows_file, folder)
    # The other process takes the folder's lock, says so, and holds it until its stdin closes: an event, no clock.
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from ksae_cupy.session.runlock import RunLock; "
                               f"RunLock({str(folder)!r}).acquire(); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(KsaeError) as refused:
            packed_once(rows_file, folder, epochs=2)
        assert f"is in use by another process (PID {holder.pid} holds" in str(refused.value)
        assert str(refused.value) == ksae_train_resume_error(folder)
    finally:
        holder.stdin.close()
        holder.wait()
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 1
    packed_once(rows_file, folder, epochs=2)  # the lock released: the pack continues the run
    assert len((folder / "metrics.jsonl").read_text().splitlines()) == 2
