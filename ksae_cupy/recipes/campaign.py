"""The GPU campaign's settings, clock, state file and child-process plumbing (``bin/gpu-campaign``).

One command for a lent GPU machine: every GPU check, benchmark and paper-length run (Table err_mnist's
k-sparse rows at 5000 epochs, Table fn_mnist's k-sparse rows through bin/reproduce-finetune).

    PYTHONPATH=. python3 bin/gpu-campaign campaign-out --budget-minutes 9     # on the GPU machine
    PYTHONPATH=. python3 bin/gpu-campaign campaign-out --dry-run              # anywhere, CPU, seconds
    PYTHONPATH=. python3 bin/gpu-campaign kernel-grid --kernel-grid --budget-minutes 7   # top-k grid only

Stages, in this order (``--stage`` picks some): env, tests, step, epoch, packed, grid, mnist, finetune, collect.
``--benchmarks`` picks env, step, epoch, packed, grid and collect, every one run again: every benchmark
figure in one device call of ``--budget-minutes 8``.
Each writes ``OUT_DIR/<stage>.json`` and ``OUT_DIR/<stage>.md`` (with device, versions, commit and
date) and its log under ``OUT_DIR/logs/``, and is not started, with the reason written down, when the
budget left is smaller than it needs. ``OUT_DIR/campaign.json`` records each stage's status, so a
second call with the same OUT_DIR runs only what is not done yet: the MNIST runs checkpoint and
resume where the last call stopped (training is stopped with Ctrl-C's signal at the budget's end,
which saves a checkpoint). Everything is written under OUT_DIR; no network is needed (MNIST is
read from its four ``.gz`` files under ``$KSAE_DATA_DIR/mnist`` or ``./data/mnist``).

The stages call the project's commands in child processes, exactly as a user would: ``pytest -m
gpu``, the step comparison (:mod:`ksae_cupy.bench.step_compare`), ``ksae-bench train --device gpu`` (the
trainer's epochs on a fresh and on a trained model, :mod:`ksae_cupy.bench.train_gpu`), the packed runs
(:mod:`ksae_cupy.bench.packed`), the kernel grid (``bin/gpu-campaign --kernel-grid``),
``ksae-train`` then ``ksae-eval``, and ``bin/reproduce-finetune``. ``--dry-run`` (= ``--device cpu --tiny``) runs the same plumbing
on the CPU with tiny shapes, the synthetic dataset and a few epochs (the step comparison times the
trainer, and PyTorch eager where torch imports); the kernel grid is then called with ``--device cpu``
to check its command line and is recorded as skipped. ``--tiny --device gpu`` runs every stage down its
GPU branches (in CI: on the CuPy stand-in, tests/cupy_standin).

The stages themselves are in :mod:`ksae_cupy.recipes.campaign_stages`; the top-k kernel grid
(``--kernel-grid``) in :mod:`ksae_cupy.bench.kernel_grid`.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from ksae_cupy.atomic import write_json_atomic, write_text_atomic
from ksae_cupy.bench.metadata import git_commit, run_metadata, torch_meta
from ksae_cupy.reports.children import run_until
from ksae_cupy.reports.folders import utc_now

REPO = Path(__file__).resolve().parents[2]  # the checkout: children import it, tests and bin/ live there


STAGES = ("env", "tests", "step", "epoch", "packed", "grid", "mnist", "finetune", "collect")
BENCHMARK_STAGES = ("env", "step", "epoch", "packed", "grid", "collect")  # --benchmarks: every benchmark, one call
# Rough seconds a stage needs on an H100 before it is worth starting (tiny runs: about 1 s).
# Measured: tests 114-126 s, the top-k grid 122 s; step, epoch and packed: estimates.
NEEDS_GPU = {"env": 30, "tests": 150, "step": 60, "epoch": 90, "packed": 60, "grid": 150, "mnist": 90,
             "finetune": 300, "collect": 0}
# The most seconds a benchmark stage may take (the grid stops starting shapes before its end).
STAGE_MAX_S = {"step": 180, "epoch": 180, "packed": 180, "grid": 300}
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
EXIT_INTERRUPTED = 130  # ksae-train: stopped by SIGINT, checkpoint saved
OF_THE_CODE = ("env", "tests", "step", "epoch", "packed", "grid")  # stages rerun when the commit changed since (runs resume instead)
# The mnist stage's runs, in order: k = 25 at the paper's length, then beyond the paper (k = 25 with AuxK and
# centring), seeds 1 and 2 of k = 25, k = 40 with both options, k = 40 and 10 (rows the CPU has also run; their
# history: results/runs/README.md).
# "K[+auxkA][+center][+seedS]".
DEFAULT_RUNS = ("25", "25+auxk256+center", "25+seed1", "25+seed2", "40+auxk256+center", "40", "10")


def parse_run(spec: str):
    """``(name, k, ksae-train options)`` of a run spec such as ``25``, ``40+auxk256+center`` or ``25+seed1``;
    None if it is not one."""
    head, *options = spec.strip().split("+")
    if not head.isdigit() or int(head) <= 0:
        return None
    extra = []
    for option in options:
        if option == "center":
            extra.append("--center-input")
        elif re.fullmatch(r"auxk[1-9]\d*", option):
            extra += ["--aux-k", option[4:]]
        elif re.fullmatch(r"seed\d+", option):
            extra += ["--seed", option[4:]]
        else:
            return None
    return "-".join([f"k{int(head)}", *options]), int(head), extra


class Campaign:
    """The run's settings, clock, state file and child-process plumbing."""

    def __init__(self, args):
        self.out = args.out_dir.resolve()
        self.tiny = args.tiny
        self.stop_after_epochs = args.stop_after_epochs
        self.device = args.device
        self.deadline = time.monotonic() + 60.0 * args.budget_minutes
        self.started = time.monotonic()
        # Children run in OUT_DIR, so the data root is made absolute here (./data is the caller's).
        self.data_dir = Path(args.data_dir or os.environ.get("KSAE_DATA_DIR") or "data").resolve()
        self.data_args = ["--data-dir", str(self.data_dir)]
        self.runs = args.ks or [parse_run(spec) for spec in (["4", "2"] if self.tiny else DEFAULT_RUNS)]
        self.epochs = args.epochs or (3 if self.tiny else 5000)
        self.side_by_side = args.side_by_side
        self.reserve = 0.0 if self.tiny else 20.0  # seconds kept back for collect and the copy-out
        self.state_path = self.out / "campaign.json"
        self.state = json.loads(self.state_path.read_text()) if self.state_path.exists() else {"stages": {}}
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        # Children write their caches under OUT_DIR, nowhere else; a child without --data-dir (ksae-bench
        # train) finds MNIST through KSAE_DATA_DIR.
        cache = self.out / "cache"
        self.env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1",
                        KSAE_DATA_DIR=str(self.data_dir),
                        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                        CUPY_CACHE_DIR=str(cache / "cupy"), TRITON_CACHE_DIR=str(cache / "triton"),
                        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), MPLCONFIGDIR=str(cache / "mpl"))
        self._meta = None

    # -- clock and messages ----------------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.monotonic() - self.reserve

    def say(self, msg: str) -> None:
        elapsed = time.monotonic() - self.started
        print(f"[gpu-campaign {int(elapsed) // 60:02d}:{int(elapsed) % 60:02d}] {msg}", flush=True)

    def needs(self, stage: str) -> float:
        return 1.0 if self.tiny else float(NEEDS_GPU[stage])

    # -- records ---------------------------------------------------------------------------------
    def meta(self) -> dict:
        """Device, versions, commit, date (date refreshed on every call)."""
        if self._meta is None:
            backend = None
            if self.device != "cpu":
                from ksae_cupy.backend import resolve_device

                backend = resolve_device(self.device)
            self._meta = run_metadata(backend)
            self._meta.update(torch_meta())
            self._meta["mode"] = ("dry run (cpu, tiny)" if self.device == "cpu" else f"tiny ({self.device})") \
                if self.tiny else f"full ({self.device})"
        return dict(self._meta, date=utc_now())

    def write(self, stage: str, payload: dict, markdown: str) -> None:
        """``<stage>.json`` and ``<stage>.md``, each written to a temp file, checked, then renamed."""
        payload = {"stage": stage, "meta": self.meta(), **payload}
        meta = payload["meta"]
        header = (f"# gpu-campaign: {stage}\n\ndevice {meta['device']}, commit {meta['commit']}, "
                  f"date {meta['date']}, {meta['mode']}\n\n")
        write_json_atomic(self.out / f"{stage}.json", payload, default=str)
        write_text_atomic(self.out / f"{stage}.md", header + markdown.rstrip() + "\n")

    def record(self, stage: str, status: str, reason: str = "", seconds: float = 0.0) -> None:
        self.state["stages"][stage] = {"status": status, "reason": reason, "seconds": round(seconds, 1),
                                       "date": utc_now(), "commit": git_commit()}
        write_json_atomic(self.state_path, self.state)

    # -- children --------------------------------------------------------------------------------
    def call(self, name: str, argv: list[str], timeout: float, *, interrupt: bool = False, poll=None) -> dict:
        """Run ``argv`` in OUT_DIR, its output in ``logs/<name>.log``, until ``timeout`` or ``poll``
        (:func:`ksae_cupy.reports.children.run_until`: SIGINT when ``interrupt``, so ksae-train saves a
        checkpoint). Returns ``{"status", "seconds", "timed_out", "log"}``."""
        log_path = self.out / "logs" / f"{name}.log"
        run = run_until(argv, log_path, timeout, interrupt=interrupt, poll=poll, cwd=self.out, env=self.env,
                        tick=0.2 if self.tiny else 2.0)
        return {**run, "log": str(log_path.relative_to(self.out))}


def check_options(args) -> str | None:
    """Complete ``args`` (``--dry-run``, ``--ks``) in place; the one-line message of the first bad option,
    or None when all are good."""
    if args.dry_run:
        args.device, args.tiny = "cpu", True
    if args.benchmarks:
        if args.stage:
            return "--benchmarks and --stage are not allowed together; --benchmarks runs " + ", ".join(BENCHMARK_STAGES)
        args.stage = list(BENCHMARK_STAGES)
    if args.stop_after_epochs is not None and args.stop_after_epochs < 1:
        return f"--stop-after-epochs {args.stop_after_epochs} is not allowed; use a positive number of epochs"
    if not args.budget_minutes > 0:
        return f"--budget-minutes {args.budget_minutes:g} is not allowed; use a positive number of minutes"
    for stage in args.stage or []:
        if stage not in STAGES:
            return f"--stage {stage!r} is not allowed; use one of {', '.join(STAGES)}"
    if args.side_by_side < 1:
        return f"--side-by-side {args.side_by_side} is not allowed; use a positive number of runs"
    if args.epochs is not None and args.epochs <= 0:
        return f"--epochs {args.epochs} is not allowed; use a positive number"
    if args.ks is not None:
        runs = [parse_run(spec) for spec in args.ks.split(",")]
        bad = [spec for spec, run in zip(args.ks.split(","), runs) if run is None]
        if bad:
            return (f"--ks {bad[0]!r} is not allowed; use comma-separated runs K[+auxkA][+center][+seedS] of "
                    f"positive integers, such as 25,40,10,25+auxk256+center")
        args.ks = runs
    if args.device != "cpu" and not re.fullmatch(r"gpu(:\d+)?", args.device):
        return f"--device {args.device!r} is not allowed; use gpu, gpu:N or cpu"
    if args.device == "cpu" and not args.tiny:
        return "--device cpu needs --tiny (paper-length runs on a CPU take weeks); or use --dry-run"
    if args.out_dir.exists() and not args.out_dir.is_dir():
        return f"OUT_DIR {args.out_dir} is a file; give a folder"
    return None
