"""The project's commands as child processes, run as a user would type them, one at a time.

A script that chains commands (``bin/reproduce-finetune``, ``bin/paper-tables --run``) runs each in
a child so that its exit status, its one ``error:`` line and its signal handling are the
command's own. :class:`Children` passes this process's SIGINT, SIGTERM and SIGHUP on to the
running child (which saves a checkpoint and stops), and sends it SIGTERM if this process dies.
"""
from __future__ import annotations

import codecs
import functools
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from ksae_cupy.reports.folders import utc_now

# The console scripts (setup.cfg's entry points), as ``module:function``.
ENTRY_POINTS = {"ksae-train": "ksae_cupy.cli.train:train_command",
                "ksae-eval": "ksae_cupy.cli.evaluate:eval_command",
                "ksae-baseline": "ksae_cupy.cli.baseline:baseline_command",
                "ksae-finetune": "ksae_cupy.cli.finetune:finetune_command",
                "ksae-bench": "ksae_cupy.cli.bench:bench_command",
                "ksae-data": "ksae_cupy.cli.data:data_command"}
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def python_argv(command: str, *args) -> list[str]:
    """``[python, -c, CODE, *args]`` running ``command`` (``ksae-train``, ...) with this Python,
    whether or not the console scripts are on PATH; any other ``command`` is a Python script's path."""
    if command not in ENTRY_POINTS:
        return [sys.executable, str(command), *[str(a) for a in args]]
    module, function = ENTRY_POINTS[command].split(":")
    return [sys.executable, "-c", f"from {module} import {function}; {function}()", *[str(a) for a in args]]


def shown(command: str, *args) -> str:
    """The command line as a user types it."""
    return " ".join(shlex.quote(str(a)) for a in (command, *args))


def run_or_exit(command: str, args: list, who: str | None = None) -> float:
    """Run ``command`` in a child (its output shown as it comes, after a ``+ COMMAND`` line); end
    this script (``who``: its name, by default) with a one-line message if it fails. Returns its
    wall seconds."""
    who = who or Path(sys.argv[0]).name
    print("+ " + shown(command, *args), flush=True)
    start = time.perf_counter()
    status = subprocess.call(python_argv(command, *args))
    if status != 0:
        sys.exit(f"{who}: {shown(command, *args)} failed with exit status {status}")
    return time.perf_counter() - start


def run_until(argv: list[str], log_path: Path, timeout: float, *, interrupt: bool = False, poll=None, cwd=None,
              env=None, tick: float = 2.0) -> dict:
    """Run ``argv`` with its output appended to ``log_path``; stop it after ``timeout`` seconds or
    when ``poll()`` returns True (checked every ``tick`` seconds): with SIGINT when ``interrupt``
    (ksae-train then saves a checkpoint; killed if it takes over 120 s), else killed.
    Returns ``{"status", "seconds", "timed_out"}``."""
    start = time.monotonic()
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(str(a) for a in argv)}\n")
        log.flush()
        # Same process group: a Ctrl-C at the terminal reaches the child too, which then saves.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        timed_out = False
        while proc.poll() is None:
            asked = poll is not None and poll() is True  # the caller asks for the stop (an event, not the clock)
            if asked or time.monotonic() - start > timeout:
                timed_out = True
                if interrupt:
                    proc.send_signal(signal.SIGINT)
                    try:  # the current step finishes and the checkpoint is written
                        proc.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                else:
                    proc.kill()
                break
            time.sleep(tick)
        status = proc.wait()
    return {"status": status, "seconds": time.monotonic() - start, "timed_out": timed_out}


def exit_meaning(status: int, tail: list[str], received: int | None) -> tuple[str, object]:
    """What a child's exit means: ``("ok", None)``; ``("stopped", exit status to end with)`` after a
    signal (this process's ``received``, or the child's own); ``("diverged", message)``; else
    ``("failed", message)``. The commands exit 1 with one ``error:`` line only when training
    diverged ("the loss became nan ..."); 1 after a traceback is a crash, 2 a refused input."""
    if status == 0 and received is None:
        return "ok", None
    if received is not None or status < 0 or status in (129, 130, 143):
        return "stopped", 128 - status if status < 0 else status if status >= 128 else 128 + received
    errors = [line for line in tail if line.startswith("error:")]
    message = errors[-1][len("error:"):].strip() if errors else (tail[-1] if tail else f"exit status {status}")
    if status == 1 and errors and not any(line.startswith("Traceback") for line in tail):
        return "diverged", message
    return "failed", message


class Stopped(Exception):
    """This process was asked to stop (a signal); ``status`` is the exit status to end with."""

    def __init__(self, status: int):
        super().__init__(f"stopped (exit status {status})")
        self.status = status


class Children:
    """Runs one command at a time in a child process; passes this process's SIGINT, SIGTERM and
    SIGHUP on to it. The child writes to ``logs/<step>.log`` itself (appended), which this process
    follows and shows: a child whose parent was killed still has somewhere to write as it saves.
    ``pythonpath`` is put first on the children's PYTHONPATH (a checkout run without installing)."""

    def __init__(self, logs: Path, pythonpath: Path | None = None):
        self.logs = Path(logs)
        self.child: subprocess.Popen | None = None
        self.received: int | None = None  # the first stop signal this process got
        self.env = dict(os.environ, PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join(filter(None, [str(pythonpath or ""), os.environ.get("PYTHONPATH")])))
        for number in STOP_SIGNALS:
            signal.signal(number, self._on_signal)

    def _on_signal(self, number, frame):
        self.received = self.received or number
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(number)  # every one: a second stops the child at once, as at a terminal
        else:
            print(f"{signal.Signals(number).name}: stopping before the next step", flush=True)

    def check_stop(self) -> None:
        if self.received is not None:
            raise Stopped(128 + self.received)

    def run(self, step: str, command: str, options: list) -> tuple[int, list[str]]:
        """Run ``command`` (``ksae-train``, ...) with ``options``; returns its exit status and last lines."""
        self.check_stop()
        options = [str(o) for o in options]
        line = shown(command, *options)
        print(f"  $ {line}", flush=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.logs / f"{step}.log"
        with open(path, "a") as log:
            log.write(f"\n[{utc_now()}] $ {line}\n")
            log.flush()
            start = path.stat().st_size
            # Signals held while the child starts and is recorded, so that each reaches it exactly once.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                self.child = subprocess.Popen(python_argv(command, *options), stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, env=self.env,
                                              preexec_fn=functools.partial(_child_setup, os.getpid()))
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        text, decoder = "", codecs.getincrementaldecoder("utf-8")(errors="replace")
        with open(path, "rb") as log:
            log.seek(start)
            while True:
                exited = self.child.poll() is not None  # before the read: nothing is written after it
                chunk = decoder.decode(log.read())
                if chunk:
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
                    text = (text + chunk)[-20000:]
                elif exited:
                    break
                else:
                    time.sleep(0.05)
        status = self.child.wait()
        self.child = None
        with open(path, "a") as log:
            log.write(f"[{utc_now()}] exit status {status}\n")
        return status, text.splitlines()[-20:]


def _child_setup(parent: int) -> None:
    """In the child before it starts: its own process group (a terminal's Ctrl-C reaches the
    parent, which passes it on once), signals unblocked, and SIGTERM when the parent dies
    (kill -9 included; Linux), so that the child saves a checkpoint and stops."""
    os.setpgid(0, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above
        os.kill(os.getpid(), signal.SIGTERM)
