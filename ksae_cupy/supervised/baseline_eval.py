"""``ksae-eval`` of a baseline run folder (``ksae-baseline``): the protocol of k-sparse features.

Section 5 of the paper: the features of a dropout autoencoder are *all* its hidden units, those
of a denoising autoencoder the code of the *uncorrupted* input; the RBM's are its hidden
probabilities. All are :func:`ksae_cupy.supervised.baselines.encode`, ``sigmoid(x W + b)`` with
no noise and no dropout. They go through the very steps k-sparse features go through
(:func:`ksae_cupy.evaluation.selection.select_and_test`): L2 chosen on the validation set with the
classifier fit on the training set, a refit, the test set read once. There is no alpha (every
unit is kept). Results go to ``eval.json`` and ``eval.md`` in the run folder, with the paper's
figure of Table err_mnist for an MNIST run of 1000 hidden units.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ksae_cupy.backend import CPU, Backend
from ksae_cupy.errors import KsaeError, OptionError
from ksae_cupy.supervised.baseline_trainer import KIND, is_baseline_run, load_baseline_checkpoint  # noqa: F401 (re-export)
from ksae_cupy.evaluation.selection import DEFAULT_L2_EXTEND
from ksae_cupy.supervised.baselines import BASELINES, PAPER_ERR_MNIST, encode

NAMES = {name: baseline.label for name, baseline in BASELINES.items()}  # as the report names each model


def open_baseline_run(run_dir):
    """``(Run, model)``: the checkpoint and data record of a baseline run folder, as
    :func:`ksae_cupy.evaluation.trained_run.open_run` gives them for a k-sparse one."""
    from ksae_cupy.evaluation.trained_run import Run
    from ksae_cupy.session.runs import RunFolder

    path = Path(run_dir)
    if not path.is_dir():
        raise KsaeError(f"run folder {path} does not exist")
    folder = RunFolder(path, kind=KIND)
    folder.check_kind("run folder", "this command reads ksae-baseline and ksae-train run folders")
    ckpt = load_baseline_checkpoint(path / "checkpoint.h5")
    folder.check_checkpoint(ckpt.run_id)  # this folder's run, not a copy
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise KsaeError(f"{path / 'config.json'} is missing or unreadable ({exc})") from None
    run = Run(path=path, ckpt=ckpt, k=None, H=ckpt.params["W_dh"].shape[1], dataset=config.get("dataset"),
              data_record=config.get("data"))
    return run, ckpt.config.get("model", "autoencoder")


def evaluate_baseline_run(run_dir, l2_grid, refit: str = "train+valid", raw_baseline: bool = False,
                          backend: Backend = CPU, dataset=None, data_root=None, max_iter: int = 500,
                          linear_svm: bool = False, log=print, data_overrides: dict | None = None,
                          l2_extend: int = DEFAULT_L2_EXTEND) -> dict:
    """Evaluate a baseline run's features; write ``eval.json`` and ``eval.md`` there."""
    from ksae_cupy.atomic import write_text_atomic
    from ksae_cupy.evaluation.selection import evaluation_code, select_and_test
    from ksae_cupy.evaluation.trained_run import load_run_dataset

    if linear_svm:
        raise OptionError("linear_svm", "{name} is not offered for baseline runs; leave it out")
    run, model = open_baseline_run(run_dir)
    if dataset is None:
        dataset = load_run_dataset(run, data_root, log, data_overrides)
    params = run.ckpt.params
    start = time.perf_counter()
    log(f"evaluating {run.path} ({model}, H={run.H}, epoch {run.ckpt.epoch}) on {dataset.summary()}: every hidden "
        f"unit of the uncorrupted input; {backend.description}")

    def features(alpha, X_nd):  # alpha is None: every unit is kept
        with backend.use():
            return encode({name: backend.asarray(value) for name, value in params.items()},
                          backend.asarray(X_nd, dtype=params["W_dh"].dtype))

    result = {"run_dir": str(run.path), "dataset": dataset.name, "model": model, "hidden": run.H,
              "epoch": run.ckpt.epoch, "device": backend.name, "l2_grid": sorted(l2_grid, reverse=True),
              "l2_extend": l2_extend, "max_iter": max_iter, **evaluation_code(), "features": select_and_test(features, dataset, [None], l2_grid, refit, max_iter, backend, log,
                                          extend=l2_extend)}
    if raw_baseline:
        log("raw-pixel baseline through the same classifier")
        result["raw_baseline"] = select_and_test(lambda alpha, X_nd: backend.asarray(X_nd), dataset, [None],
                                                 l2_grid, refit, max_iter, backend, log, extend=l2_extend)
    result["seconds"] = round(time.perf_counter() - start, 1)
    if dataset.name == "mnist" and run.H == 1000:
        result["paper_test_error"] = PAPER_ERR_MNIST.get(model)
    write_text_atomic(run.path / "eval.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_text_atomic(run.path / "eval.md", markdown_report(result))
    return result


def markdown_report(result: dict) -> str:
    """The chosen L2, valid and test error against the paper's figure, and every setting tried."""
    from ksae_cupy.evaluation.eval_report import pct, trials_table

    feats, paper = result["features"], result.get("paper_test_error")
    sel = feats["selected"]
    name = NAMES.get(result["model"], result["model"])
    lines = [f"# Evaluation of {result['run_dir']}", "",
             f"{name}, {result['hidden']} hidden units, epoch {result['epoch']}, dataset {result['dataset']}, device "
             f"{result['device']}. Features: every hidden unit of the uncorrupted input (section 5). L2 chosen on "
             f"the validation set; classifier refit on {feats['refit']}; test set used once.", "",
             "| features | L2 | valid error | test error | paper |", "|---|---|---|---|---|",
             f"| sigmoid(W^T x + b), all units | {sel['l2']:g} | {pct(sel['valid_error'])} | "
             f"{pct(feats['test_error'])} | {pct(paper) if paper else '-'} |"]
    raw = result.get("raw_baseline")
    if raw:
        lines.append(f"| raw pixels | {raw['selected']['l2']:g} | {pct(raw['selected']['valid_error'])} | "
                     f"{pct(raw['test_error'])} | - |")
    lines += trials_table((("hidden units", feats), ("raw", raw)), alpha=False)
    return "\n".join(lines) + "\n"
