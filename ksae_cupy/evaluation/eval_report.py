"""What ``ksae-eval`` writes of an evaluation: ``eval.json`` (everything) and ``eval.md`` (its tables), and
the last line it prints."""
from __future__ import annotations

import json
from pathlib import Path

from ksae_cupy.atomic import write_text_atomic
from ksae_cupy.evaluation.selection import fmt_alpha
from ksae_cupy.paper import HIDDEN, err_mnist_error

SPLITS = ("train", "valid", "test")  # the reconstruction table's rows, in this order (eval.json sorts its keys)


def write_report(run_dir: Path, result: dict) -> None:
    """``eval.json`` (everything) and ``eval.md`` (tables), each written atomically."""
    write_text_atomic(Path(run_dir) / "eval.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_text_atomic(Path(run_dir) / "eval.md", markdown_report(result))


def markdown_report(result: dict) -> str:
    """A short Markdown summary: the chosen setting, test errors, and every trial."""
    feats = result["features"]
    sel = feats["selected"]
    lines = [f"# Evaluation of {result['run_dir']}", "",
             f"k = {result['k']}, {result['hidden']} hidden units, epoch {result['epoch']}, dataset {result['dataset']}, "
             f"device {result['device']}. Alpha and L2 chosen on the validation set; classifier refit on "
             f"{feats['refit']}; test set used once.", "",
             "| features | alpha | L2 | valid error | test error | paper |", "|---|---|---|---|---|---|"]
    paper = result.get("paper_test_error")
    lines.append(f"| supp_(alpha k)(W^T x + b) | {fmt_alpha(sel['alpha'])} | {sel['l2']:g} | "
                 f"{pct(sel['valid_error'])} | {pct(feats['test_error'])} | {pct(paper) if paper else '-'} |")
    raw = result.get("raw_baseline")
    if raw:
        raw_paper = err_mnist_error("raw", result["dataset"], HIDDEN)  # raw pixels have no hidden units
        lines.append(f"| raw pixels | - | {raw['selected']['l2']:g} | {pct(raw['selected']['valid_error'])} | "
                     f"{pct(raw['test_error'])} | {pct(raw_paper) if raw_paper else '-'} |")
    svm = result.get("linear_svm")
    if svm:
        lines.append(f"| same features, linear SVM (C {svm['selected_C']:g}), fit on {svm['n_train']:,} | "
                     f"{fmt_alpha(svm['alpha'])} | - | {pct(svm['valid_error'])} | "
                     f"{pct(svm['test_error_fit_on_train'])} | - |")
        lines.append(f"| same features, linear SVM (C {svm['selected_C']:g}), refit on {svm['n_train_valid']:,} | "
                     f"{fmt_alpha(svm['alpha'])} | - | - | {pct(svm['test_error_refit_on_train_valid'])} | - |")
    lines += reconstruction_table(result.get("reconstruction"), result["k"])
    lines += trials_table((("sparse", feats), ("raw", raw)))
    return "\n".join(lines) + "\n"


def reconstruction_table(splits: dict | None, k: int) -> list[str]:
    """The lines of the table of FVE, L0 and dead units per split (none for a report written before them)."""
    if not splits:
        return []
    alpha = next(iter(splits.values()))["alpha"]
    lines = ["", f"The autoencoder on each split: FVE, the fraction of variance explained by the reconstruction through "
                 f"the k = {k} largest units (1 is perfect, 0 is the split's mean); L0, the non-zero units per example "
                 f"of that k-code and of the alpha*k features (alpha {fmt_alpha(alpha)}); dead, the units non-zero "
                 f"in the k-code of no example of the split (the train row: the run's dead count, as the end of "
                 f"ksae-train, ksae-plot and the export give it).", "",
             "| split | examples | FVE | L0 (k) | L0 (alpha*k) | dead units |", "|---|---|---|---|---|---|"]
    for name, m in ((name, splits[name]) for name in SPLITS if name in splits):
        lines.append(f"| {name} | {m['rows']:,} | {m['fve']:.4f} | {m['l0']:.2f} | {m['l0_alpha_k']:.2f} | "
                     f"{_dead_cell(m)} |")
    return lines


def _dead_cell(m: dict) -> str:
    """``529 (52.90%)``; the percentage alone for a report written before the count."""
    return pct(m["dead_fraction"]) if m.get("n_dead") is None else f"{m['n_dead']:,} ({pct(m['dead_fraction'])})"


def trials_table(blocks, alpha: bool = True) -> list[str]:
    """The lines of the table of every setting tried: a row per trial of each ``(name, block)`` (a block
    None or without trials adds none); with ``alpha``, the features' alpha column (ksae-eval's; the
    baselines' features have none)."""
    alpha_head, alpha_rule = (" alpha |", "---|") if alpha else ("", "")
    lines = ["", "Every setting tried (classifier fit on the training set only):", "",
             f"| features |{alpha_head} L2 | valid error | train error | L-BFGS iterations | converged |",
             f"|---|{alpha_rule}---|---|---|---|---|"]
    for name, block in blocks:
        for t in (block or {}).get("trials", []):
            alpha_cell = f" {fmt_alpha(t['alpha'])} |" if alpha else ""
            lines.append(f"| {name} |{alpha_cell} {t['l2']:g} | {pct(t['valid_error'])} | {pct(t['train_error'])} | "
                         f"{t['n_iter']} | {'yes' if t['converged'] else 'no'} |")
    return lines


def pct(x) -> str:
    return f"{100 * x:.2f}%"


def final_line(result: dict) -> str:
    """``test error 2.01% (alpha=3, l2=1e-05, refit on train+valid; 124 s)``: ksae-eval's last line."""
    block = result["features"] if "features" in result else result
    selected = block["selected"]
    alpha = f"alpha={fmt_alpha(selected['alpha'])}, " if selected.get("alpha") is not None else ""
    seconds = f"; {result['seconds']:.0f} s" if "seconds" in result else ""
    return (f"test error {100 * block['test_error']:.2f}% ({alpha}l2={selected['l2']:g}, "
            f"refit on {block['refit']}{seconds})")
