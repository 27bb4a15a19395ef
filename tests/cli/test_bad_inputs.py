"""The bad inputs of issue 17, walked through the real commands: each is one ``error:`` line,
exit status 2, no traceback, and nothing is written.

These are the mistakes that once ended in a Python traceback, where the program meets the
file system or a number nobody checked. docs/guide/reliability.md counts the cases here (BAD_INPUTS).
"""
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import ksae_cupy.paths as paths
from ksae_cupy.cli.bench import bench_command
from ksae_cupy.cli.data import data_command
from ksae_cupy.cli.plot import plot_command
from ksae_cupy.cli.train import train_command
from ksae_cupy.datasets.synthetic import make_sparse_signals
from clicheck import assert_one_line_error
from runfolder import make_run

QUICK = ["--hidden", "16", "--k", "2", "--epochs", "1", "--batch-size", "10", "--device", "cpu"]


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder with a data file, a plain file, a finished run and a read-only folder.

    Permission bits do not bind root, so when the tests run as root the read-only folders
    are also reported unwritable by the one probe the checks use (:func:`paths.writable`).
    """
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "x.npy", make_sparse_signals(60, D=8, H=16, k=2, seed=0)[0])
    (tmp_path / "a-file").write_text("not a folder")
    make_run(tmp_path / "run", np.random.default_rng(0).normal(size=(16, 9)), k=2)
    read_only = []

    def make_read_only(path):
        path = Path(path)
        path.mkdir(exist_ok=True)
        path.chmod(0o555)
        read_only.append(path.resolve())

    if os.geteuid() == 0:
        real = paths.writable
        monkeypatch.setattr(paths, "writable", lambda folder: Path(folder).resolve() not in read_only and real(folder))
    yield tmp_path, make_read_only
    for path in read_only:
        path.chmod(0o755)


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size if p.is_file() else None) for p in sorted(root.rglob("*"))}


# (command, arguments, fragments the one error line must name); "{ro}" is a read-only folder.
BAD_INPUTS = [
    ("train", ["x.npy", *QUICK, "--run-dir", "a-file"], ["run folder a-file", "is a file, not a folder"]),
    ("train", ["x.npy", *QUICK, "--run-dir", "{ro}/new-run"], ["run folder {ro}/new-run", "not writable"]),
    ("train", ["--resume", "{ro_run}", "--device", "cpu"], ["--resume", "not writable"]),
    ("train", ["x.npy", *QUICK, "@cwd={ro}"], ["run folder runs/x-h16-k2-", "not writable"]),
    ("train", ["mnist", *QUICK, "--data-dir", "a-file"], ["mnist data folder a-file/mnist", "is a file, not a folder"]),
    ("train", ["mnist", *QUICK, "@env=a-file"], ["mnist data folder a-file/mnist", "is a file, not a folder"]),
    ("data", ["fetch", "mnist", "--data-dir", "a-file"], ["mnist data folder a-file/mnist", "is a file"]),
    ("data", ["fetch", "mnist", "@env=a-file"], ["mnist data folder a-file/mnist", "is a file"]),
    ("data", ["fetch", "mnist", "--data-dir", "{ro}/data"], ["mnist data folder {ro}/data/mnist", "not writable"]),
    ("plot", ["filters", "run", "-o", "/nonexistent/dir/f.png"], ["-o /nonexistent/dir/f.png", "does not exist"]),
    ("plot", ["filters", "run", "-o", "f.jpgx"], ["-o f.jpgx", "unknown image format 'jpgx'", "png", "pdf"]),
    ("plot", ["filters", "run", "-o", "{ro}/f.png"], ["-o {ro}/f.png", "not writable"]),
    ("plot", ["hist", "run", "-o", "hist.jpgx"], ["-o hist.jpgx", "unknown image format"]),
    ("bench", ["train", "--repeats", "0"], ["--repeats 0", "positive"]),
    ("bench", ["train", "--steps", "0"], ["--steps 0", "positive"]),
    ("bench", ["train", "--batch-size", "0"], ["--batch-size 0", "positive"]),
    ("bench", ["train", "--out", "a-file"], ["--out a-file", "is a file"]),
    ("train", ["x.npy", *QUICK, "--seed", "-1"], ["--seed -1", "from 0 to 4294967295"]),
    ("train", ["x.npy", *QUICK, "--hidden", "10000000000"], ["--hidden 10000000000", "GiB", "free"]),
    ("train", ["huge.npy", *QUICK], ["huge.npy", "too large for float32", "row 3, column 5", "standardise"]),
]
COMMANDS = {"train": train_command, "data": data_command, "plot": plot_command, "bench": bench_command}


@pytest.mark.parametrize("command, args, fragments", BAD_INPUTS,
                         ids=[f"{c}-{'-'.join(a)[:40]}" for c, a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_writes_nothing(place, monkeypatch, command, args, fragments):
    root, make_read_only = place
    huge = np.ones((60, 8), np.float32)
    huge[3, 5] = 3e30  # finite in float32, but its square overflows
    np.save(root / "huge.npy", huge)
    make_read_only(root / "ro")
    ro_run = make_run(root / "ro-run", np.ones((8, 16)), k=2)
    make_read_only(ro_run)
    subst = lambda text: text.replace("{ro_run}", str(ro_run)).replace("{ro}", str(root / "ro"))
    given = []
    for arg in args:
        if arg.startswith("@cwd="):
            monkeypatch.chdir(subst(arg[5:]))
        elif arg.startswith("@env="):
            monkeypatch.setenv("KSAE_DATA_DIR", subst(arg[5:]))
        else:
            given.append(subst(arg))
    if Path.cwd() != root:  # the data file, from inside another folder
        given = [str(root / a) if a in ("x.npy", "huge.npy") else a for a in given]
    before = _tree(root)
    result = CliRunner().invoke(COMMANDS[command], given)
    assert_one_line_error(result, *map(subst, fragments), status=2)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert _tree(root) == before, "a refused command wrote something"
