"""Test-only: hold one run, started by a script the test starts, still after a given epoch until it is
signalled (tests/heldrun.py does this for a run the test starts itself).

A test that signals ``bin/reproduce-finetune`` once it shows an epoch line races the step's child:
on a loaded machine the child may run its remaining epochs before the test gets the CPU back, and
the stop then lands in another step. Put this folder first on PYTHONPATH and set

    KSAE_TEST_HOLD="RUN EPOCH"          e.g. "ksparse1 1": the run folder's name, an epoch
    KSAE_TEST_HOLD="RUN PHASE EPOCH"    e.g. "deep_ksparse top 1" (ksae-finetune: epoch within a phase)

and the process whose ``RunFolder.append_metrics`` first appends that run's line for that epoch (or a
later one) prints ``held after epoch N (RUN)`` and waits until it gets a stop signal (SIGINT,
SIGTERM, SIGHUP: sent on by the script, or SIGTERM from the kernel when the script is killed). The
run's own handler notes the signal as usual; the run then goes on and stops after its step. It
holds once per process; without KSAE_TEST_HOLD this file does nothing. ``ksae_cupy`` is not imported
here: the patch is applied when the command imports ``ksae_cupy.session.runs``.
"""
from __future__ import annotations

import os

if os.environ.get("KSAE_TEST_HOLD"):
    import importlib.abc
    import signal
    import sys
    import time

    _RUNS = "ksae_cupy.session.runs"
    _STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    *_target, _epoch = os.environ["KSAE_TEST_HOLD"].split()
    _run, _phase = _target[0], (_target[1] if len(_target) > 1 else None)
    _held: list[int] = []

    def _hold_until_signalled(epoch: int) -> None:
        noted, originals = [], {number: signal.getsignal(number) for number in _STOP_SIGNALS}

        def noting(original):
            def handler(signum, frame):
                noted.append(signum)
                if callable(original):
                    original(signum, frame)
                else:  # no Python handler: what the signal would have done
                    signal.signal(signum, original)
                    os.kill(os.getpid(), signum)
            return handler

        for number, original in originals.items():
            signal.signal(number, noting(original))
        try:
            print(f"held after epoch {epoch} ({_run})", flush=True)
            while not noted:  # the signal interrupts the sleep; its handler runs at once
                time.sleep(0.02)
        finally:
            for number, original in originals.items():
                if signal.getsignal(number) is not original:
                    signal.signal(number, original)

    def _patch(run_folder) -> None:
        append = run_folder.append_metrics

        def append_then_hold(self, report):
            append(self, report)
            get = report.get if isinstance(report, dict) else lambda name: getattr(report, name, None)
            if (not _held and self.path.name == _run and (_phase is None or get("phase") == _phase)
                    and get("epoch") >= int(_epoch)):
                _held.append(get("epoch"))
                _hold_until_signalled(get("epoch"))

        run_folder.append_metrics = append_then_hold

    class _PatchRunsOnImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != _RUNS:
                return None
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
                    if spec is not None:
                        break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_then_patch(module):
                exec_module(module)
                _patch(module.RunFolder)

            spec.loader.exec_module = exec_then_patch
            return spec

    sys.meta_path.insert(0, _PatchRunsOnImport())
