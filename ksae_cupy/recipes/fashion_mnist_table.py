"""The Fashion-MNIST results table: alpha*k-sparse features + logistic regression for k in
{10, 25, 40}, beside raw pixels and PCA with the same number of non-zeros per image (not in the
paper: Table err_mnist's protocol, section 5, on another dataset).

Trains each k with ``ksae-train fashion-mnist`` (1000 hidden units, --lr auto, the k
schedule, ``--epochs`` epochs), evaluates it with ``ksae-eval`` (alpha and L2 chosen on the
validation set, test set read once; raw pixels with the first run), then fits the same
classifier on PCA projections onto as many components as the chosen alpha*k features keep
non-zeros (components from the training rows only). A run folder that has finished its
epochs is reused; its evaluation too when newer than its checkpoint.

    KSAE_DATA_DIR=... bin/fashion-mnist-table --epochs 10 --threads 1 --out runs/fashion-table \\
        --md docs/fashion-mnist-10epochs-cpu.md
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from ksae_cupy.atomic import write_json_atomic, write_text_atomic
from ksae_cupy.reports.children import run_or_exit
from ksae_cupy.reports.folders import evaluation_is_current, read_json, read_metrics


def pca_row(dataset, n_components: int, l2_grid, max_iter: int) -> dict:
    """Logistic regression on the projections onto the top ``n_components`` principal components."""
    from ksae_cupy.backend import CPU
    from ksae_cupy.evaluation.selection import select_and_test

    mean_d = dataset.X_train.mean(0, dtype=np.float64)
    centred = dataset.X_train.astype(np.float64) - mean_d
    _, vectors_dd = np.linalg.eigh(centred.T @ centred)
    basis_dm = vectors_dd[:, ::-1][:, :n_components].astype(np.float32)
    project = lambda _alpha, X_nd: (X_nd - mean_d.astype(np.float32)) @ basis_dm  # noqa: E731
    return select_and_test(project, dataset, [None], l2_grid, "train+valid", max_iter, CPU, log=lambda m: None)


def main() -> None:
    from ksae_cupy.recipes.script import positive_ints, refuse_no_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", type=positive_ints, default="10,25,40", help="the k values, comma-separated")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--alphas", default="1,2,3,4")
    parser.add_argument("--l2", default="1e-3,1e-4,1e-5")
    parser.add_argument("--max-iter", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("runs/fashion-table"))
    parser.add_argument("--md", type=Path, default=None, help="Also write the table here (e.g. under docs/).")
    parser.add_argument("--all", action="store_true",
                        help="the whole table at the defaults; needed only when no other option is given")
    refuse_no_arguments(parser, "give --all for the whole table at the defaults (k in {10, 25, 40}, 10 epochs each, "
                                "into runs/fashion-table), or the options that change it (e.g. --epochs 10 --md FILE)")
    args = parser.parse_args()
    from ksae_cupy.datasets import load_dataset

    args.out.mkdir(parents=True, exist_ok=True)
    l2_grid = [float(v) for v in args.l2.split(",")]
    rows, raw = [], None
    for i, k in enumerate(args.ks):
        run_dir = args.out / f"k{k}"
        done = read_metrics(run_dir)
        if not done:
            run_or_exit("ksae-train", ["fashion-mnist", "--k", str(k), "--epochs", str(args.epochs), "--device", "cpu",
                                      "--threads", str(args.threads), "--run-dir", str(run_dir), "--quiet"])
        elif done[-1]["epoch"] < args.epochs:
            run_or_exit("ksae-train", ["--resume", str(run_dir), "--epochs", str(args.epochs), "--quiet"])
        eval_path = run_dir / "eval.json"
        if not evaluation_is_current(run_dir, args.alphas.split(","), args.l2.split(","), raw_baseline=i == 0):
            run_or_exit("ksae-eval", [str(run_dir), "--alphas", args.alphas, "--l2", args.l2, "--device", "cpu",
                                    "--max-iter", str(args.max_iter), "--quiet", *(["--raw-baseline"] if i == 0 else [])])
        result = read_json(eval_path)
        raw = result.get("raw_baseline", raw)
        config = read_json(run_dir / "config.json")["train"]
        history = read_metrics(run_dir)
        selected = result["features"]["selected"]
        rows.append({"k": k, "epochs": history[-1]["epoch"], "lr": config["lr"],
                     "train_minutes": round(sum(r["seconds"] for r in history) / 60, 1),
                     "final_loss": history[-1]["train_loss"], "dead": history[-1]["dead_fraction"],
                     "alpha": selected["alpha"], "nonzeros": int(round(selected["alpha"] * k)),
                     "l2": selected["l2"], "test_error": result["features"]["test_error"]})
    dataset = load_dataset("fashion-mnist", log=lambda m: None)
    for row in rows:
        started = time.perf_counter()
        pca = pca_row(dataset, row["nonzeros"], l2_grid, args.max_iter)
        row["pca"] = {"components": row["nonzeros"], "l2": pca["selected"]["l2"], "test_error": pca["test_error"],
                      "seconds": round(time.perf_counter() - started, 1)}
        print(f"PCA {row['nonzeros']} components: test error {100 * pca['test_error']:.2f}%", flush=True)

    lines = ["# Fashion-MNIST: logistic regression on k-sparse features, raw pixels and PCA", "",
             f"1000 hidden units, `--lr auto` ({rows[0]['lr']}), the k schedule, {args.epochs} epochs per k on the CPU "
             f"with `--threads {args.threads}` (a 2-core machine shared with other jobs). Alpha from {{{args.alphas}}} "
             f"and L2 from {{{args.l2}}} chosen on the 10,000 validation images (at most {args.max_iter} L-BFGS "
             "iterations per fit), classifier refit on train+valid, the 10,000 test images read once. PCA keeps "
             "as many components as the chosen alpha*k features keep non-zeros per image (components from the "
             "training images), through the same classifier and L2 grid.", "",
             f"    KSAE_DATA_DIR=... bin/fashion-mnist-table --epochs {args.epochs} --threads {args.threads} "
             f"--alphas {args.alphas} --l2 {args.l2} --max-iter {args.max_iter}", "",
             "| features | non-zeros per image | train time | alpha | L2 | test error | PCA, same non-zeros |",
             "|---|---|---|---|---|---|---|"]
    if raw is not None:
        lines.append(f"| raw pixels | 784 (dense) | - | - | {raw['selected']['l2']:g} | {100 * raw['test_error']:.2f}% | - |")
    for r in rows:
        lines.append(f"| k={r['k']} | {r['nonzeros']} | {r['train_minutes']} min | {r['alpha']:g} | {r['l2']:g} | "
                     f"{100 * r['test_error']:.2f}% | {100 * r['pca']['test_error']:.2f}% |")
    lines += ["", "Training: final loss and dead units after the last epoch.", "",
              "| k | epochs | lr | final training loss | dead units |", "|---|---|---|---|---|"]
    lines += [f"| {r['k']} | {r['epochs']} | {r['lr']} | {r['final_loss']:.3f} | {100 * r['dead']:.1f}% |" for r in rows]
    text = "\n".join(lines) + "\n"
    write_text_atomic(args.out / "fashion-mnist-table.md", text)
    write_json_atomic(args.out / "fashion-mnist-table.json", {"rows": rows, "raw": raw}, sort_keys=False, indent=1,
                      default=str)
    if args.md is not None:
        write_text_atomic(args.md, text)
    print(text)
