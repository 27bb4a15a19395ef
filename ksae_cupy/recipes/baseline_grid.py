"""``bin/baseline-grid``: a short validation grid of each baseline's learning rate and weight decay for Table
err_mnist's baseline rows (section 5: the paper gives no settings for them; bin/paper-tables uses the choice).

Every point is a ``ksae-baseline`` run folder, ``OUT/<model>/lr<lr>-wd<wd>``, trained ``--epochs``
epochs with ``--threads 1`` (``--jobs`` points side by side), then scored: logistic regression
(:mod:`ksae_cupy.evaluation.classifier`, L2 ``--l2``, at most ``--max-iter`` L-BFGS iterations) fit
on the training set's features (every hidden unit of the uncorrupted input, as ``ksae-eval`` uses
them) and judged on the validation set. The test set is never read. Each score goes to
``score.json`` in the point's folder; ``OUT/grid.md`` and ``OUT/grid.json`` gather them, with each
model's choice (the lowest validation error). A point whose training diverged (exit status 1) is
recorded as such. A folder with a score is skipped; one with a checkpoint is resumed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ksae_cupy.atomic import write_json_atomic, write_text_atomic
from ksae_cupy.reports.children import python_argv
from ksae_cupy.reports.folders import read_json, read_metrics
from ksae_cupy.reports.markdown import percent
from ksae_cupy.supervised.baselines import BASELINES

DEFAULT_LRS = {name: baseline.grid_lrs for name, baseline in BASELINES.items()}  # the registry's grid
DEFAULT_WDS = {name: baseline.grid_weight_decays for name, baseline in BASELINES.items()}
BASELINE = python_argv("ksae-baseline")
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
# Each point is scored in a child process of the script (``--score FOLDER``), one thread, as it trained.
SCRIPT = Path(__file__).resolve().parents[2] / "bin" / "baseline-grid"


def run_grid(args) -> int:
    """Train and score every point of ``args`` not scored yet, ``args.jobs`` at once; then the grid's files."""
    points = [(model, lr, wd) for model in args.models.split(",")
              for lr in (args.lrs or DEFAULT_LRS[model]).split(",")
              for wd in (args.weight_decays or DEFAULT_WDS[model]).split(",")]
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        list(pool.map(lambda p: run_point(args, *p), points))
    collect(args.out, points, args)
    return 0


def run_point(args, model: str, lr: str, wd: str) -> None:
    folder = args.out / model / f"lr{lr}-wd{wd}"
    if (folder / "score.json").is_file():
        return
    log = args.out / "logs" / f"{model}-lr{lr}-wd{wd}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **ONE_THREAD)
    if (folder / "checkpoint.h5").is_file():
        command = BASELINE + ["--resume", str(folder)]
    else:
        command = BASELINE + [args.dataset, "--model", model, "--lr", lr, "--weight-decay", wd, "--epochs",
                   str(args.epochs), "--hidden", str(args.hidden), "--threads", "1", "--run-dir", str(folder)]
    started = time.time()
    with open(log, "a") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if status == 1:  # diverged: its one error line is in the log
            write_json(folder / "score.json", {"model": model, "lr": float(lr), "weight_decay": float(wd),
                                               "diverged": True, "train_seconds": round(time.time() - started, 1)})
            return
        if status != 0:
            raise SystemExit(f"{' '.join(command)} exited with status {status}; see {log}")
        status = subprocess.run([sys.executable, str(SCRIPT), "--out", str(args.out), "--score", str(folder), "--l2",
                                 str(args.l2), "--max-iter", str(args.max_iter)], stdout=out,
                                stderr=subprocess.STDOUT, env=env).returncode
    if status != 0:
        raise SystemExit(f"scoring {folder} exited with status {status}; see {log}")


def score(folder: Path, l2: float, max_iter: int) -> int:
    """Validation error of logistic regression on the run's features (the test set is not read)."""
    from ksae_cupy.evaluation import classifier
    from ksae_cupy.supervised.baseline_eval import open_baseline_run
    from ksae_cupy.evaluation.trained_run import load_run_dataset
    from ksae_cupy.supervised.baselines import encode

    run, model = open_baseline_run(folder)
    data = load_run_dataset(run)
    params = run.ckpt.params
    F_train, F_valid = encode(params, data.X_train.astype(params["W_dh"].dtype)), encode(params, data.X_valid)
    fit = classifier.fit(F_train, data.y_train, data.n_classes, l2, max_iter=max_iter)
    config = run.ckpt.config
    result = {"model": model, "lr": config["lr"], "weight_decay": config["weight_decay"], "epochs": run.ckpt.epoch,
              "l2": l2, "max_iter": max_iter, "n_iter": fit.n_iter, "converged": fit.converged,
              "valid_error": classifier.error_rate(fit, F_valid, data.y_valid),
              "train_error": classifier.error_rate(fit, F_train, data.y_train),
              "valid_reconstruction": last_valid_loss(folder)}
    write_json(folder / "score.json", result)
    print(json.dumps(result))
    return 0


def last_valid_loss(folder: Path):
    records = read_metrics(folder)
    return records[-1].get("valid_loss") if records else None


def collect(out: Path, points, args) -> None:
    rows, best = [], {}
    for model, lr, wd in points:
        path = out / model / f"lr{lr}-wd{wd}" / "score.json"
        if not path.is_file():
            continue
        s = read_json(path)
        rows.append(s)
        if not s.get("diverged") and (model not in best or s["valid_error"] < best[model]["valid_error"]):
            best[model] = s
    write_json(out / "grid.json", {"points": rows, "chosen": best, "epochs": args.epochs, "l2": args.l2,
                                   "max_iter": args.max_iter, "dataset": args.dataset})
    lines = [f"Grid: {args.epochs} epochs per point on {args.dataset}; logistic regression (L2 {args.l2:g}, at most "
             f"{args.max_iter} L-BFGS iterations) fit on the training features, judged on the validation set.", "",
             "| model | lr | weight decay | valid error | train error | L-BFGS iterations | valid reconstruction | chosen |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in rows:
        if s.get("diverged"):
            lines.append(f"| {s['model']} | {s['lr']:g} | {s['weight_decay']:g} | diverged | - | - | - | |")
            continue
        chosen = "yes" if best.get(s["model"]) is s else ""
        conv = f"{s['n_iter']}" + ("" if s["converged"] else " (not converged)")
        lines.append(f"| {s['model']} | {s['lr']:g} | {s['weight_decay']:g} | {percent(s['valid_error'])} | "
                     f"{percent(s['train_error'])} | {conv} | {s['valid_reconstruction']:.3f} | {chosen} |")
    write_text_atomic(out / "grid.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, payload)
