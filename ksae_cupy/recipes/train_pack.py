"""``bin/train-pack``: several ``ksae-train`` runs in one launch, each in its own run folder.

    bin/train-pack mnist --run dir=runs/k10,k=10,epochs=5000 --run dir=runs/k25,k=25,seed=1,epochs=5000
    bin/train-pack mnist --run dir=runs/k10 --run dir=runs/k25        # resume both as they were asked

Each ``--run`` is one run: ``dir`` its folder, and ``k``, ``seed``, ``epochs`` (and ``lr``) its options; the
options given once (``--hidden``, ``--threads``, ``--device``) are every run's, the rest ``ksae-train``'s
defaults, so a run here is the run ``ksae-train DATASET --k K --seed S --epochs E --run-dir DIR`` makes
(bit for bit on the CPU). A folder that holds a checkpoint is resumed; given with ``dir`` alone, with the
configuration it has. The runs train together (:func:`ksae_cupy.session.packed_runs.train_packed`): on a
GPU as stacked models. ``bin/paper-tables --run`` runs its missing k-sparse rows through it.

A run that diverges is recorded in its folder (``diverged.json``, as the other scripts record one) and the
others go on. Exit status: 0 when every run ended or was recorded; 128 + the signal after a stop signal
(every run saved); 2 for a refused option or input (one ``error:`` line); 1 only for a crash (a traceback).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy import paper

RUN_KEYS = ("dir", "k", "seed", "epochs", "lr")  # dir: the folder; the others: ksae-train's options of that name


def parse_run(text: str) -> dict:
    """``dir=FOLDER,k=25,seed=0,epochs=5000`` as a dict; a one-line error naming what is wrong. Each value is
    parsed and checked by ksae-train's declaration of its option (:func:`~ksae_cupy.session.fields.parse_text`:
    the same types, ``lr=auto``, ranges and messages); a key given twice is refused."""
    from ksae_cupy.session.fields import TRAIN, parse_text

    declared = {option.name: option for option in TRAIN}
    run = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in RUN_KEYS or not value.strip():
            raise KsaeError(f"--run {text!r}: {part!r} is not allowed; use key=value pairs, keys from "
                            f"{', '.join(RUN_KEYS)} (e.g. dir=runs/k25,k=25,seed=0,epochs=5000)")
        if key in run:
            raise KsaeError(f"--run {text!r}: {key} is given twice; give each key once")
        run[key] = value.strip() if key == "dir" else parse_text(declared[key], value, f"--run {text!r}: {key}")
    if "dir" not in run:
        raise KsaeError(f"--run {text!r} names no folder; add dir=FOLDER")
    return run


DEFAULT_HIDDEN = paper.HIDDEN  # a new run's; a resumed run keeps its own


def run_config(dataset: str, run: dict, hidden: int | None):
    """The run's :class:`TrainConfig`: a folder with a checkpoint given ``dir`` alone keeps its own (its
    config.json's ``train``, ``epochs`` applied when given; a ``--hidden`` given that is not its own is
    refused, not ignored); else ksae-train's for these options (``hidden`` None: the default)."""
    from ksae_cupy.errors import OptionError
    from ksae_cupy.session.fields import TrainOptions, default_lr
    from ksae_cupy.session.runs import RunFolder
    from ksae_cupy.session.train_run import new_config
    from ksae_cupy.training.config import TrainConfig

    folder = RunFolder(Path(run["dir"]))
    if folder.checkpoint.is_file() and set(run) <= {"dir", "epochs"}:
        config = TrainConfig.from_dict(folder.read_config()["train"])
        if hidden is not None and hidden != config.hidden:
            raise KsaeError(f"--hidden {hidden} has no effect on {run['dir']}, which holds a run of {config.hidden} "
                            f"hidden units that is resumed as it was; leave --hidden out or give the run another "
                            f"folder")
        if "epochs" in run:
            config.epochs = run["epochs"]
        return config
    missing = [key for key in ("k", "epochs") if key not in run]
    if missing:
        raise KsaeError(f"--run dir={run['dir']}: a new run needs {' and '.join(missing)} (e.g. k=25,epochs=5000)")
    options = TrainOptions(hidden=DEFAULT_HIDDEN if hidden is None else hidden, k=run["k"], epochs=run["epochs"],
                           seed=run.get("seed", 0))  # ksae-train's options, its defaults where not given
    try:
        return new_config(options, run.get("lr", default_lr(dataset)))
    except OptionError as exc:  # a value checked against the others (k <= hidden): named as the --run key
        flag = "--hidden" if exc.field == "hidden" else f"--run dir={run['dir']}: {exc.field}"
        raise KsaeError(exc.spelled(flag)) from None


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="train-pack", description=__doc__.splitlines()[0])
    ap.add_argument("dataset", help="a built-in dataset (mnist, ...) or your file, as ksae-train takes it")
    ap.add_argument("--run", action="append", required=True, help="one run: dir=FOLDER,k=K,seed=S,epochs=E[,lr=LR]")
    ap.add_argument("--hidden", type=int, default=None,
                    help=f"hidden units of every new run [default: {DEFAULT_HIDDEN}; a resumed run keeps its own]")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads [default: as ksae-train chooses]")
    ap.add_argument("--device", default="auto", help="auto, cpu, gpu or gpu:N [default: auto]")
    ap.add_argument("--data-dir", default=None, help="data root [default: $KSAE_DATA_DIR or ./data]")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.reports.folders import record_diverged
    from ksae_cupy.session.packed_runs import PackStopped, train_packed

    args = parse(argv)
    try:
        runs = [parse_run(text) for text in args.run]
        configs = [run_config(args.dataset, run, args.hidden) for run in runs]
        backend = resolve_device(args.device)
        print(backend.description, flush=True)
        data = load_dataset(args.dataset, root=args.data_dir, log=lambda line: print(line, flush=True))
        outcomes = train_packed(configs, data, backend, [run["dir"] for run in runs], dataset=args.dataset,
                                settings={"threads": args.threads, "device": args.device, "data_dir": args.data_dir},
                                log=lambda line: print(line, flush=True))
    except PackStopped as stop:
        print("stopped: every run saved its checkpoint; the same command again continues them", file=sys.stderr)
        return stop.status
    except KsaeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for outcome in outcomes:
        if outcome.diverged:
            record_diverged(outcome.folder, outcome.diverged)
            print(f"{outcome.folder}: diverged (recorded in its diverged.json): {outcome.diverged}", flush=True)
    return 0
