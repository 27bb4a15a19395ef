"""Reproduce the k-sparse rows of the paper's Table err_mnist (section 5: logistic regression on features).

Trains k-sparse autoencoders with 1000 hidden units for k in {40, 25, 10} (paper
settings: sigma 0.01, momentum 0.9, lr 0.01, k scheduled down from 100 over the first
half of the epochs), evaluates each with ``ksae-eval`` (alpha and L2 chosen on the
validation set, test error measured once; the raw-pixel baseline with the first run),
and writes ``<out>/reproduce-mnist.md`` and ``.json``: our test errors beside the paper's
(raw 7.20%, k=40 1.54%, k=25 1.35%, k=10 2.10%) with epochs, device and wall time.

The paper trains for 5000 epochs; pass ``--epochs`` to fit your budget (the table says
how many were run). A run folder that already holds a checkpoint is resumed, not
restarted; ``--eval-only`` skips training.

    bin/reproduce-mnist --epochs 200 --device gpu --out runs/reproduce-mnist
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ksae_cupy.atomic import write_json_atomic, write_text_atomic
from ksae_cupy.backend import DEVICES
from ksae_cupy.paper import err_mnist_error, ksparse_key
from ksae_cupy.reports.children import run_or_exit
from ksae_cupy.reports.folders import evaluation_is_current, progress
from ksae_cupy.reports.markdown import percent, table
from ksae_cupy.recipes.script import refuse_no_arguments
from ksae_cupy import paper


def main(argv=None) -> None:
    """The script: train (or resume) and evaluate each k, then write the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", default="40,25,10", help="sparsity levels k (default: 40,25,10)")
    parser.add_argument("--hidden", type=int, default=paper.HIDDEN, help=f"hidden units (paper: {paper.HIDDEN})")
    parser.add_argument("--epochs", type=int, default=paper.EPOCHS, help=f"training epochs (paper: {paper.EPOCHS})")
    parser.add_argument("--dataset", default="mnist", help="dataset (default: mnist; others for a smoke test)")
    parser.add_argument("--device", default="auto", help=DEVICES)
    parser.add_argument("--out", type=Path, default=Path("runs/reproduce-mnist"), help="folder of the run folders")
    parser.add_argument("--alphas", default="1,2,3,4", help="alpha grid for ksae-eval")
    parser.add_argument("--l2", default="1e-3,1e-4,1e-5", help="L2 grid for ksae-eval")
    parser.add_argument("--data-dir", default=None, help="data root (default: $KSAE_DATA_DIR or ./data)")
    parser.add_argument("--eval-only", action="store_true", help="evaluate existing run folders, train nothing")
    parser.add_argument("--force-eval", action="store_true",
                        help="fit the classifiers again even where eval.json is newer than the checkpoint")
    parser.add_argument("--all", action="store_true",
                        help="the whole run at the defaults (hours); needed only when no other option is given")
    refuse_no_arguments(parser, "give --all for the whole run (k in {40, 25, 10}, 5000 epochs each: hours), "
                                "or the options that narrow it (e.g. --epochs 10 --device cpu)", argv)
    args = parser.parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error(f"--ks {args.ks!r} is not allowed; use a comma-separated list of integers such as 40,25,10")
    data = ["--data-dir", args.data_dir] if args.data_dir else []
    args.out.mkdir(parents=True, exist_ok=True)

    alphas, l2_grid = args.alphas.split(","), args.l2.split(",")
    rows = []
    for i, k in enumerate(ks):
        run_dir = args.out / f"k{k}"
        if not args.eval_only:
            if (run_dir / "checkpoint.h5").exists() and progress(run_dir)[0] >= args.epochs:
                print(f"{run_dir} has finished its {args.epochs} epochs", flush=True)
            elif (run_dir / "checkpoint.h5").exists():
                run_or_exit("ksae-train", ["--resume", str(run_dir), "--device", args.device, *data])
            else:
                # No checkpoint: whatever a run that died before its first one left is discarded.
                run_or_exit("ksae-train", [args.dataset, "--hidden", str(args.hidden), "--k", str(k), "--epochs",
                                   str(args.epochs), "--device", args.device, "--run-dir", str(run_dir), "--overwrite",
                                   *data])
        if not args.force_eval and evaluation_is_current(run_dir, alphas, l2_grid, raw_baseline=i == 0):
            print(f"reusing {run_dir / 'eval.json'} (newer than the checkpoint, same grids)", flush=True)
            eval_seconds = json.loads((run_dir / "eval.json").read_text()).get("seconds")
        else:
            eval_seconds = run_or_exit("ksae-eval", [str(run_dir), "--alphas", args.alphas, "--l2", args.l2, "--device",
                                             args.device, *(["--raw-baseline"] if i == 0 else []), *data])
        result = json.loads((run_dir / "eval.json").read_text())
        epochs, train_s = progress(run_dir)
        config = json.loads((run_dir / "config.json").read_text())
        rows.append({"k": k, "epochs": epochs, "device": config.get("device"), "train_seconds": round(train_s, 1),
                     "eval_seconds": round(eval_seconds, 1), "alpha": result["features"]["selected"]["alpha"],
                     "l2": result["features"]["selected"]["l2"], "test_error": result["features"]["test_error"],
                     "paper_error": paper_percent(ksparse_key(k), args)})
        if "raw_baseline" in result:
            raw = result["raw_baseline"]
            rows.insert(0, {"k": "raw", "epochs": "-", "device": result["device"], "train_seconds": 0,
                            "eval_seconds": None, "alpha": None, "l2": raw["selected"]["l2"],
                            "test_error": raw["test_error"], "paper_error": paper_percent("raw", args)})

    lines = [f"# {args.dataset}, logistic regression on features (paper, Table 1)", "",
             f"{args.hidden} hidden units; alpha and L2 chosen on the validation set; classifier refit on "
             "train+valid; test set used once.", ""]
    cells = [["raw pixels" if r["k"] == "raw" else f"k={r['k']}", r["epochs"], r["device"],
              "-" if r["k"] == "raw" else f"{r['train_seconds'] / 60:.1f} min",
              "-" if r["alpha"] is None else f"{r['alpha']:g}", f"{r['l2']:g}", percent(r["test_error"]),
              f"{r['paper_error']:.2f}%" if r["paper_error"] is not None else "-"] for r in rows]
    lines += table(["features", "epochs", "device", "train time", "alpha", "L2", "test error", "paper"],
                   cells).splitlines()
    write_text_atomic(args.out / "reproduce-mnist.md", "\n".join(lines) + "\n")
    write_json_atomic(args.out / "reproduce-mnist.json", rows, sort_keys=False)
    print("\n".join(lines))


def paper_percent(key: str, args) -> float | None:
    """Table err_mnist's figure in % (the paper's setting only: MNIST, 1000 hidden units)."""
    error = err_mnist_error(key, args.dataset, args.hidden)
    return None if error is None else round(100 * error, 2)

