"""A ksae-train process that holds still at an event, for the tests that stop or kill a run midway.

Waiting for a run's epoch line and then signalling it races the run: on a loaded machine the
test process may get the CPU back only after the run has ended ("the run ended before the kill").
A run started with :func:`held_train` appends epoch ``epoch``'s line to ``metrics.jsonl`` (with
``checkpoint=True``: the first epoch from ``epoch`` on that ends with a checkpoint on disk), prints
``held after epoch N`` and waits until its stdin is closed. A signal sent then arrives mid-run,
however loaded the machine: the test waits for an event, never for a clock.

Start it with ``stdin=subprocess.PIPE`` and ``stdout=subprocess.PIPE``; :func:`wait_until_held`
reads up to the line. A stop signal (Ctrl-C, SIGTERM, SIGHUP) is noted by the run's handler while it
holds; closing stdin then lets it go on to stop after its next step. A SIGKILL needs no release.
"""
from __future__ import annotations

import sys

# The patch both held scripts share (this file's and tests/parallel/heldmpi.py's): it takes the epoch
# and "checkpoint"/"any" from the front of argv and defines append_then_hold, which each script installs.
HOLD_PATCH = """\
import sys
from ksae_cupy.session import runs

epoch, checkpoint = int(sys.argv.pop(1)), sys.argv.pop(1) == "checkpoint"
append, held = runs.RunFolder.append_metrics, []


def append_then_hold(self, report):
    append(self, report)
    if not held and report.epoch >= epoch and (not checkpoint or self.checkpoint.exists()):
        held.append(report.epoch)
        print(f"held after epoch {report.epoch}", flush=True)
        sys.stdin.read()  # until the test closes this process's stdin (or kills it)
"""

_SCRIPT = HOLD_PATCH + """
runs.RunFolder.append_metrics = append_then_hold
from ksae_cupy.cli.COMMAND import COMMAND_command

COMMAND_command()
"""


def hold_arguments(epoch: int, checkpoint: bool) -> list[str]:
    """The two arguments HOLD_PATCH reads, first after the script."""
    return [str(epoch), "checkpoint" if checkpoint else "any"]


def held_train(epoch: int, checkpoint: bool = False, command: str = "train") -> list[str]:
    """The command line (before the command's own arguments) of a ``ksae-train`` run (or, with
    ``command="finetune"``, a ``ksae-finetune`` run: ``epoch`` then counts within a phase) that holds
    after ``epoch``."""
    return [sys.executable, "-c", _SCRIPT.replace("COMMAND", command), *hold_arguments(epoch, checkpoint)]


def wait_until_held(proc, timeout: float | None = None) -> int:
    """Read the run's stdout up to its ``held after epoch N`` line; N, or an AssertionError saying how the run
    ended instead (with its stderr, where that is piped)."""
    return _wait_for_number(proc, "held after epoch ", "the epoch it was to hold at", timeout)


def _wait_for_number(proc, prefix: str, where: str, timeout: float | None) -> int:
    """The number that ends the first line of the run's stdout that begins with ``prefix``; or, when the
    run ends first, an AssertionError saying it ended without reaching ``where`` (with its stderr, where
    that is piped)."""
    for line in proc.stdout:
        if line.startswith(prefix):
            return int(line.split()[-1])
    proc.wait(timeout=timeout)
    why = f": {proc.stderr.read()}" if proc.stderr else ""
    raise AssertionError(f"the run ended (status {proc.returncode}) without reaching {where}{why}")


# A run held INSIDE a checkpoint write: the nth write of a ``*.h5.tmp`` file (the temporary name every
# checkpoint is written under, see ksae_cupy.training.checkpoint.write_hdf5_atomically) writes the first
# half of its bytes, flushes them to the disk, prints ``held in checkpoint write N`` and waits until its
# stdin is closed (then writes the rest), so that a kill sent then lands in the write, not near it.
_HOLD_WRITE = """\
import os
import sys
import builtins
from ksae_cupy.training import checkpoint

nth, real_open, writes = int(sys.argv.pop(1)), builtins.open, []


class HalfThenHold:
    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, data):
        data = memoryview(data).cast("B")
        self.f.write(data[:len(data) // 2])
        self.f.flush()
        os.fsync(self.f.fileno())
        print(f"held in checkpoint write {len(writes)}", flush=True)
        sys.stdin.read()  # until the test closes this process's stdin (or kills it)
        return self.f.write(data[len(data) // 2:]) + len(data) // 2


def opening(path, mode="r", *args, **kwargs):
    f = real_open(path, mode, *args, **kwargs)
    if str(path).endswith(".h5.tmp") and "w" in mode:
        writes.append(path)
        if len(writes) == nth:
            return HalfThenHold(f)
    return f


checkpoint.open = opening  # the module's name for the builtin: only checkpoint writes see it
from ksae_cupy.cli.COMMAND import COMMAND_command

COMMAND_command()
"""


def held_in_checkpoint_write(nth: int, command: str = "train") -> list[str]:
    """The command line (before the command's own arguments) of a ``ksae-train`` (or ``ksae-finetune``) run
    that holds halfway through writing its ``nth`` checkpoint; :func:`wait_until_held_in_write` waits for it."""
    return [sys.executable, "-c", _HOLD_WRITE.replace("COMMAND", command), str(nth)]


def wait_until_held_in_write(proc, timeout: float | None = None) -> int:
    """Read the run's stdout up to its ``held in checkpoint write N`` line; N, or an AssertionError."""
    return _wait_for_number(proc, "held in checkpoint write ", "the write it was to hold in", timeout)
