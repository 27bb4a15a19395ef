"""An MPI training job that holds still at an event, for the tests that signal or race a job midway.

Waiting for an epoch line and then signalling races the job: on a loaded machine the test may get
the CPU back only after the job has ended. A job started with :func:`held_mpi_train` has rank 0
append epoch ``epoch``'s line to ``metrics.jsonl`` (with ``checkpoint=True``: the first epoch from
``epoch`` on that ends with a checkpoint on disk), print ``held after epoch N`` and wait until its
stdin is closed (``mpiexec`` passes its own stdin to rank 0); the other ranks wait for it in their
next collective. A signal sent then arrives mid-run, however loaded the machine: the test waits for
an event, never for a clock. The held script shares its patch with tests/heldrun.py (``ksae-train``).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import heldrun
from heldrun import HOLD_PATCH, hold_arguments

REPO = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"
# Generous: only a real hang trips it (two busy loops beside a 2-rank job on 2 cores included).
HANG_GUARD_S = 600

# mpiexec passes its stdin to rank 0 only; the other ranks wait for it in their next collective.
_SCRIPT = "from mpi4py import MPI\n" + HOLD_PATCH + """
if MPI.COMM_WORLD.rank == 0:
    runs.RunFolder.append_metrics = append_then_hold
from ksae_cupy.cli.mpi_train import run

run(sys.argv[1:])
"""


def mpi_env() -> dict:
    """The repository on PYTHONPATH (after what the test put first), one BLAS thread a rank."""
    pythonpath = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)
    return dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                PYTHONUNBUFFERED="1")


def held_mpi_train(n: int, args: list[str], cwd, epoch: int, checkpoint: bool = False) -> subprocess.Popen:
    """Start ``mpiexec -n N`` running the MPI trainer's ``train ARGS`` that holds after ``epoch``
    (stdin, stdout and stderr piped, text)."""
    return subprocess.Popen([str(MPIEXEC), "-n", str(n), sys.executable, "-m", "mpi4py", "-c", _SCRIPT,
                             *hold_arguments(epoch, checkpoint), "train", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=mpi_env(), cwd=cwd)


def wait_until_held(proc) -> int:
    """tests/heldrun.py's wait for the ``held after epoch N`` line, under the hang guard."""
    return heldrun.wait_until_held(proc, timeout=HANG_GUARD_S)


def release(proc) -> tuple[str, str]:
    """Let a held job go on (close its stdin); its remaining stdout and stderr once it ends."""
    proc.stdin.close()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(timeout=HANG_GUARD_S)
    return out, err


def read_stderr_until(proc, text: str) -> str:
    """Read the job's stderr up to a line holding ``text`` (e.g. the stop handler's line); what was read."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if text in line:
            return "".join(seen)
    raise AssertionError(f"the job's stderr ended without {text!r}: {''.join(seen)}")


def rank_pids(proc) -> list[int]:
    """The PIDs of the job's ranks: the children of the children (hydra's proxy) of ``mpiexec``."""
    def children(pid: int) -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
        return found

    return [rank for proxy in children(proc.pid) for rank in children(proxy)]
