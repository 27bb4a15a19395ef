"""The MPI trainer starts its runs through the run lifecycle ksae-train uses (session/lifecycle.py), so
that a guarantee of the lifecycle, or one added to it later, reaches an MPI run: its lines are
ksae-train's, word for word, and a check added to ``RunLifecycle.open`` refuses an MPI job too.
"""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from ksae_cupy.cli.train import train_command

from test_distributed import _missing, dist_train, mpirun
from test_mpi_mistakes import SMALL, folder, one_error_line  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(_missing is not None, reason=str(_missing))


def test_a_resume_whose_data_file_changed_is_refused_with_ksae_trains_line(folder):
    single = CliRunner().invoke(train_command, [str(folder / "x.npy"), *SMALL, "--epochs", "1", "--device", "cpu",
                                                "--run-dir", str(folder / "single"), "--quiet"])
    assert single.exit_code == 0, single.output
    dist_train(2, ["x.npy", *SMALL, "--epochs", "1", "--run-dir", "dist", "--quiet"], cwd=folder)
    np.save(folder / "x.npy", np.load(folder / "x.npy")[::-1].copy())
    refused = CliRunner().invoke(train_command, ["--resume", str(folder / "single"), "--epochs", "2"])
    assert refused.exit_code == 2, refused.output
    line = one_error_line(dist_train(2, ["--resume", "dist", "--epochs", "2"], cwd=folder, check=False))
    assert line == refused.output.strip() and "changed since the run started" in line
    assert json.loads((folder / "dist" / "config.json").read_text())["train"]["epochs"] == 1  # before any work


# RunLifecycle.open with one more check, as a guarantee added to the lifecycle would be; then the MPI trainer.
_WITH_A_NEW_GUARANTEE = """
from mpi4py import MPI
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.lifecycle import RunLifecycle

opened = RunLifecycle.open


def open_with_a_new_guarantee(self, *args, **kwargs):
    previous = opened(self, *args, **kwargs)
    if self.folder.path.name.startswith("forbidden"):
        raise KsaeError(f"run folder {self.folder.path} is forbidden by a guarantee of the lifecycle")
    return previous


RunLifecycle.open = open_with_a_new_guarantee
from ksae_cupy.cli.mpi_train import run

run(sys.argv[1:])
"""


def test_a_check_added_to_the_lifecycle_refuses_an_mpi_run_new_or_resumed(folder):
    def job(*args):
        return mpirun(2, ["-m", "mpi4py", "-c", "import sys\n" + _WITH_A_NEW_GUARANTEE, "train", *args], cwd=folder,
                      check=False)

    line = one_error_line(job("x.npy", *SMALL, "--epochs", "1", "--run-dir", "forbidden-new"))
    assert line == "error: run folder forbidden-new is forbidden by a guarantee of the lifecycle"
    assert not (folder / "forbidden-new").exists()  # refused before any work
    dist_train(2, ["x.npy", *SMALL, "--epochs", "1", "--run-dir", "forbidden-old", "--quiet"], cwd=folder)
    before = (folder / "forbidden-old" / "config.json").read_bytes()
    line = one_error_line(job("--resume", "forbidden-old", "--epochs", "2"))
    assert line == "error: run folder forbidden-old is forbidden by a guarantee of the lifecycle"
    assert (folder / "forbidden-old" / "config.json").read_bytes() == before
    assert job("x.npy", *SMALL, "--epochs", "1", "--run-dir", "allowed", "--quiet").returncode == 0


def test_a_resume_given_the_options_that_made_a_run_whose_k_schedule_was_dropped_is_that_run(folder):
    """ksae-train's rule (tests/cli/test_resume_policy.py), on two ranks: one epoch with --k-start 16 never
    reaches k 2, so the run is made without its schedule; --resume with the same options is that run (nothing
    left to train; with --epochs 2, trained on, and that again); another --k is refused in one line, naming it."""
    options = [*SMALL, "--k-start", "16"]
    made = dist_train(2, ["x.npy", *options, "--epochs", "1", "--run-dir", "run"], cwd=folder)
    assert "never reach k 2; training with k 2 from the start" in made.stdout
    train = json.loads((folder / "run" / "config.json").read_text())["train"]
    assert (train["k_start"], train["k_schedule_epochs"]) == (None, 1)  # the epochs it was asked over, kept
    again = dist_train(2, ["--resume", "run", *options, "--epochs", "1"], cwd=folder)
    assert "nothing to train: the run had already trained all its 1 epochs" in again.stdout
    refused = dist_train(2, ["--resume", "run", "--k", "3", "--k-start", "16"], cwd=folder, check=False)
    assert one_error_line(refused) == ("error: --resume: options contradict the checkpoint (they shape the model or "
                                       "the batches): --k 3 (the run has 2)")
    longer = dist_train(2, ["--resume", "run", *options, "--epochs", "2"], cwd=folder)
    assert "epochs 1 -> 2" in longer.stdout
    assert [json.loads(line)["epoch"] for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    again = dist_train(2, ["--resume", "run", *options, "--epochs", "2"], cwd=folder)
    assert "nothing to train: the run had already trained all its 2 epochs" in again.stdout
