"""Table fn_mnist of ``bin/reproduce-finetune`` (:mod:`ksae_cupy.recipes.reproduce_finetune`): its rows, where
each row's steps keep their folders under --out, and the table written from those folders alone
(``table_fn_mnist.md`` and ``.json``), beside the paper's figures of :mod:`ksae_cupy.paper`."""
from __future__ import annotations

import json
from pathlib import Path

from ksae_cupy.atomic import write_text_atomic as atomic_write
from ksae_cupy.errors import KsaeError
from ksae_cupy import paper
from ksae_cupy.paper import FN_MNIST
from ksae_cupy.reports import folders
from ksae_cupy.reports.folders import read_json, read_metrics, utc_now as now
from ksae_cupy.reports.markdown import duration, percent


# The script's row keys (--rows) and the rows of Table fn_mnist they are (ksae_cupy.paper).
PAPER_KEY = {"no_pretraining": "no-pretraining", "rbm": "rbm", "dropout": "dropout-ae", "denoising": "denoising-ae",
             "deep_dropout": "deep-dropout-ae", "ksparse": "ksparse", "deep_ksparse": "deep-ksparse"}
PAPER_ROW = {row.key: row for row in FN_MNIST}
# (key, the paper's row, the paper's test error in %)
ROWS = [(key, PAPER_ROW[paper].label, round(100 * PAPER_ROW[paper].error, 2)) for key, paper in PAPER_KEY.items()]
# Baseline rows: the baseline ksae-finetune pretrains, and how many layers.
BASELINE_OF_ROW = {"rbm": ("rbm", 1), "dropout": ("dropout-ae", 1), "denoising": ("denoising-ae", 1),
                   "deep_dropout": ("dropout-ae", 2)}
# The k-sparse models each k-sparse row stacks.
KSPARSE_OF_ROW = {"ksparse": ["ksparse1"], "deep_ksparse": ["ksparse1", "ksparse2"]}
DIVERGED = folders.DIVERGED  # written into the folder of a step that diverged


class Plan:
    """Where each step's folder is."""

    def __init__(self, args):
        self.out = args.out
        self.ksparse = {"ksparse1": args.ksparse1 or args.out / "pretrain" / "ksparse1",
                        "ksparse2": args.ksparse2 or args.out / "pretrain" / "ksparse2"}
        self.reused = {name for name in self.ksparse if getattr(args, name) is not None}
        self.codes = args.out / "pretrain" / "ksparse1-codes.npy"

    def finetune(self, key: str) -> Path:
        return self.out / "finetune" / key


class Diverged(Exception):
    """A step diverged: its row is recorded as such."""


class Failed(Exception):
    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status



def checkpoint_epochs(folder: Path) -> tuple[int, int]:
    """(epochs trained, epochs configured) of a ksae-train run folder's checkpoint."""
    try:
        return folders.checkpoint_epochs(folder)
    except KsaeError as exc:
        raise Failed(str(exc)) from None


# -- the table, from the run folders alone -------------------------------------------------------------

def collect(args, plan: Plan) -> list[dict]:
    return [row_record(key, name, paper, args, plan) for key, name, paper in ROWS if key in args.rows]


def row_record(key: str, name: str, paper: float, args, plan: Plan) -> dict:
    folder = plan.finetune(key)
    config = read_json(folder / "config.json")
    results = read_json(folder / "finetune.json")
    metrics = read_metrics(folder)
    ft = (config or {}).get("finetune", {})
    pretraining = pretrained_models(key, config, args, plan)
    diverged = [d for d in [read_json(folder / DIVERGED)] + [read_json(Path(p["run_dir"]) / DIVERGED)
                                                             for p in pretraining if p["run_dir"]] if d]
    phases = ft.get("phases") or (["all"] if key not in ("deep_dropout", "deep_ksparse") else
                                  ["softmax", "top", "all"])
    epochs = ft.get("epochs", args.epochs)
    if results is not None:
        status = "done"
    elif diverged:
        status = "diverged"
    elif metrics or (folder / "checkpoint.h5").is_file():
        status = f"in progress ({len(metrics)} of {epochs * len(phases)} epochs)"
    else:
        started = [f"{p['model']} {epochs_text(p)}" for p in pretraining if p["run_dir"] and p["epochs_trained"]]
        status = "not started" + (f" (pretraining: {', '.join(started)})" if started else "")
    return {"key": key, "method": name, "paper_test_error_percent": paper, "status": status,
            "test_error": (results or {}).get("test_error"), "valid_error": (results or {}).get("valid_error"),
            "diverged": diverged[0]["message"] if diverged and results is None else None,
            "finetune": {"run_dir": str(folder), "epochs_per_phase": epochs, "phases": phases,
                         "epochs_done": len(metrics), "seconds": sum(r.get("seconds", 0.0) for r in metrics),
                         "step_kind": (config or {}).get("step_kind") or ft.get("step"),
                         "threads": (config or {}).get("threads"), "device": (config or {}).get("device"),
                         "lr_start": ft.get("lr_start"), "lr_end": ft.get("lr_end"), "momentum": ft.get("momentum"),
                         "kept": ft.get("kept")},
            "pretraining": pretraining,
            "pretrain_seconds": sum(p["seconds"] or 0.0 for p in pretraining)}


def pretrained_models(key: str, config: dict | None, args, plan: Plan) -> list[dict]:
    """The models a row's network starts from, their epochs and seconds, from their folders."""
    if key in BASELINE_OF_ROW:  # pretrained inside the fine-tuning step; config.json says how long
        baseline, layers = BASELINE_OF_ROW[key]
        seconds = (config or {}).get("pretrain_seconds") or [None] * layers
        epochs = (config or {}).get("pretrain_epochs")
        return [{"model": f"{baseline} layer {l + 1}", "run_dir": None, "epochs_trained": epochs,
                 "epochs_configured": epochs or args.pretrain_epochs, "seconds": seconds[l]} for l in range(layers)]
    if key not in KSPARSE_OF_ROW:
        return []
    recorded = (config or {}).get("pretrained") or [{"run_dir": str(plan.ksparse[n])} for n in KSPARSE_OF_ROW[key]]
    return [train_run_record(name, Path(source["run_dir"]), source.get("epochs_trained"), plan)
            for name, source in zip(KSPARSE_OF_ROW[key], recorded)]


def train_run_record(name: str, folder: Path, epochs_trained: int | None, plan: Plan) -> dict:
    """A ksae-train run folder: epochs (those the fine-tuning read, else the checkpoint's now), the
    sum of the seconds of those epochs in metrics.jsonl, its rate and threads."""
    config = read_json(folder / "config.json") or {}
    train = config.get("train", {})
    metrics = read_metrics(folder)
    configured = train.get("epochs")
    if epochs_trained is None and (folder / "checkpoint.h5").is_file():
        try:
            epochs_trained, configured = checkpoint_epochs(folder)
        except Failed:
            pass
    if epochs_trained is None and metrics:
        epochs_trained = metrics[-1].get("epoch")
    record = {"model": name, "run_dir": str(folder), "epochs_trained": epochs_trained,
              "epochs_configured": configured, "dataset": config.get("dataset"), "hidden": train.get("hidden"),
              "k": train.get("k"), "lr": train.get("lr"),
              "lr_auto": train.get("lr_auto"), "threads": config.get("threads"), "device": config.get("device"),
              "seconds": sum(r.get("seconds", 0.0) for r in metrics if r.get("epoch", 0) <= (epochs_trained or 0))}
    if name == "ksparse2" and plan.codes.with_suffix(".json").is_file() and config.get("dataset") == \
            str(plan.codes.resolve()):
        record["codes"] = read_json(plan.codes.with_suffix(".json"))
    return record


def write_tables(args, plan: Plan) -> str:
    """``table_fn_mnist.json`` and ``.md`` under --out, from the run folders; returns the markdown."""
    rows = collect(args, plan)
    meta = {"dataset": args.dataset, "hidden": args.hidden, "k": args.k, "alpha": args.alpha,
            "pretrain_epochs_per_model": args.pretrain_epochs, "finetune_epochs_per_phase": args.epochs,
            "lr_start": args.lr_start, "lr_end": args.lr_end, "momentum": args.momentum, "seed": args.seed,
            "command": args.command, "time": now(), "rows": rows}
    lines = [f"# Table fn_mnist: {args.dataset} test error, ours beside the paper's", "",
             f"Written {meta['time']} by `{args.command}` from the run folders under `{args.out}`. "
             f"{args.hidden} hidden units per layer, k = {args.k}, alpha = {args.alpha:g} (alpha*k units kept in "
             f"fine-tuning). Asked: {args.pretrain_epochs} pretraining epochs per model, {args.epochs} fine-tuning "
             f"epochs per phase (paper: {paper.EPOCHS} and {paper.FINETUNE_EPOCHS}), learning rate {args.lr_start:g} -> {args.lr_end:g}, "
             f"momentum {args.momentum:g}; each row says what it had. Times are sums of the per-epoch seconds in "
             f"the runs' metrics.jsonl (a baseline's pretraining: its fine-tuning run's config.json), training "
             f"only, over every session; a model two rows share counts in both.", "",
             "| Method | Paper | Ours (test) | Ours (valid) | Pretraining epochs | F.T. epochs (per phase x phases) "
             "| Pretraining time | F.T. time | F.T. step, threads, device |",
             "|---|---:|---:|---:|---|---|---:|---:|---|"]
    notes = []
    for r in rows:
        ft = r["finetune"]
        if r["status"] == "done":
            errors = f"{percent(r['test_error'])} | {percent(r['valid_error'])}"
        else:
            errors = f"{r['status']} | "
        pre = ", ".join(f"{p['model']}: {epochs_text(p)}" for p in r["pretraining"]) or "none"
        step = ", ".join(str(x) for x in (ft["step_kind"], ft["threads"], ft["device"]) if x is not None)
        lines.append(f"| {r['method']} | {r['paper_test_error_percent']:.2f}% | {errors} | {pre} | "
                     f"{ft['epochs_per_phase']} x {len(ft['phases'])} | {duration(r['pretrain_seconds'])} | "
                     f"{duration(ft['seconds'])} | {step} |")
        sources = "; ".join(f"{p['model']} `{p['run_dir']}`" + (f" (lr {p['lr']:.4g}{', auto' if p['lr_auto'] else ''})"
                                                                 if p.get("lr") is not None else "")
                            for p in r["pretraining"] if p["run_dir"])
        pretrained = ("; pretrained in that run" if r["key"] in BASELINE_OF_ROW
                      else f"; pretrained {sources}" if sources else "")
        notes.append(f"* {r['key']}: fine-tuning `{ft['run_dir']}`{pretrained}"
                     + (f"; diverged: {r['diverged']}" if r["diverged"] else ""))
    lines += ["", "Run folders (each step's output is in `logs/` beside this table):", "", *notes]
    markdown = "\n".join(lines) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out / "table_fn_mnist.json", json.dumps(meta, indent=2) + "\n")
    atomic_write(args.out / "table_fn_mnist.md", markdown)
    return markdown


def epochs_text(p: dict) -> str:
    done, asked = p["epochs_trained"], p["epochs_configured"]
    if done is None:
        return f"not yet ({asked} asked)"
    return f"{done}" if asked is None or done == asked else f"{done} of {asked}"


