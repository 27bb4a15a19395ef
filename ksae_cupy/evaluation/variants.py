"""Variants of the feature evaluation, for the investigation of the gap to the paper's 1.35%.

:mod:`ksae_cupy.evaluation.selection` fixes one protocol (section 4.5: ``supp_{alpha k}(W^T x + b)``,
a converged L2-regularised softmax, alpha and L2 chosen on validation). The paper does
not say more than that, so each choice it leaves open is a variant here, evaluated on the
same checkpoint with the same selection rule (validation only; test read once per variant):

* ``sparse``        -- the protocol itself (the reference row);
* ``relu``          -- negative survivors of the alpha*k selection set to zero (what the
                       authors' ReLU notebook computes at encoding time);
* ``standardized``  -- every feature divided by its standard deviation on the training
                       set, so the L2 penalty weighs all units alike (sparsity is kept);
* ``early-stop-N``  -- the softmax stopped after N L-BFGS iterations with a negligible L2
                       (1e-6): early stopping instead of weight decay.

Every variant is reported, not only the best: ``variants.json`` and ``variants.md`` in the
run folder.
"""
from __future__ import annotations

import json
import time

import numpy as np

from ksae_cupy.backend import CPU, Backend
from ksae_cupy.errors import KsaeError, OptionError
from ksae_cupy.model import alpha_k
from ksae_cupy.atomic import write_text_atomic
from ksae_cupy.evaluation.eval_report import pct
from ksae_cupy.evaluation.features import sparse_features
from ksae_cupy.evaluation.selection import fmt_alpha, select_and_test
from ksae_cupy.evaluation.trained_run import load_run_dataset, open_run

BASE_VARIANTS = ("sparse", "relu", "standardized")
EARLY_STOP_L2 = 1e-6  # small enough that the iteration cap, not the penalty, regularises


def parse_variants(text: str) -> list[str]:
    """``"sparse,relu,early-stop-50"`` -> names, checked."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    for name in names:
        if name in BASE_VARIANTS:
            continue
        if name.startswith("early-stop-") and name[len("early-stop-"):].isdigit() and int(name[len("early-stop-"):]) > 0:
            continue
        raise KsaeError(f"variant {name!r} is not allowed; use {', '.join(BASE_VARIANTS)} or early-stop-N (N > 0)")
    if not names:
        raise OptionError("variants", "{name} is empty; name at least one variant")
    return names


def column_scale(F_nh) -> np.ndarray:
    """``1 / std`` of every column of host features (dense or CSR); 1 where a column is constant."""
    if hasattr(F_nh, "tocsr"):
        mean_h = np.asarray(F_nh.mean(axis=0)).ravel()
        sq_mean_h = np.asarray(F_nh.multiply(F_nh).mean(axis=0)).ravel()
        std_h = np.sqrt(np.maximum(sq_mean_h - mean_h ** 2, 0.0))
    else:
        std_h = np.asarray(F_nh).std(axis=0)
    return np.where(std_h > 0, 1.0 / np.where(std_h > 0, std_h, 1.0), 1.0).astype(np.float32)


def _scaled(F_nh, scale_h):
    if hasattr(F_nh, "tocsr"):
        import scipy.sparse as sp

        return (F_nh @ sp.diags(scale_h)).tocsr()
    return F_nh * scale_h


def make_encoder(variant: str, params: dict, k: int, topk_method: str, backend: Backend, X_train_nd,
                 activation: str = "linear"):
    """``encode(alpha, X_nd)`` for one variant; the scaling of ``standardized`` comes from ``X_train_nd``."""
    use_relu = variant == "relu" or activation == "relu"

    def base(alpha, X_nd):
        return sparse_features(params, X_nd, k, alpha, topk_method, backend,
                               activation="relu" if use_relu else "linear")

    if variant != "standardized":
        return base
    scales = {}

    def standardized(alpha, X_nd):
        if alpha not in scales:  # training-set statistics only
            scales[alpha] = column_scale(base(alpha, X_train_nd))
        return _scaled(base(alpha, X_nd), scales[alpha])

    return standardized


def run_variants(run_dir, variants, alphas, l2_grid, max_iter: int = 500, backend: Backend = CPU,
                 data_root=None, dataset=None, log=print) -> dict:
    """Evaluate every variant on ``run_dir``'s checkpoint; write ``variants.json`` and ``.md`` there."""
    run = open_run(run_dir)
    for alpha in alphas:
        alpha_k(run.k, alpha, run.H)  # fail before any work on an alpha that cannot be used
    dataset = dataset if dataset is not None else load_run_dataset(run, data_root, log)
    topk_method = run.ckpt.config.get("topk", "sort")
    activation = run.ckpt.config.get("activation", "linear")
    rows = []
    for variant in variants:
        log(f"variant {variant}")
        start = time.perf_counter()
        encode = make_encoder(variant, run.params, run.k, topk_method, backend, dataset.X_train, activation)
        if variant.startswith("early-stop-"):
            outcome = select_and_test(encode, dataset, alphas, [EARLY_STOP_L2], max_iter=int(variant.split("-")[-1]),
                                      backend=backend, log=log, early_stop=True)
        else:
            outcome = select_and_test(encode, dataset, alphas, l2_grid, max_iter=max_iter, backend=backend, log=log)
        rows.append({"variant": variant, "alpha": outcome["selected"]["alpha"], "l2": outcome["selected"]["l2"],
                     "valid_error": outcome["selected"]["valid_error"], "test_error": outcome["test_error"],
                     "seconds": round(time.perf_counter() - start, 1), "trials": outcome["trials"]})
    result = {"run_dir": str(run.path), "k": run.k, "hidden": run.H, "epoch": run.ckpt.epoch,
              "activation": activation, "device": backend.name, "dataset": dataset.name, "variants": rows}
    write_text_atomic(run.path / "variants.json", json.dumps(result, indent=2, sort_keys=True) + "\n")
    write_text_atomic(run.path / "variants.md", markdown(result))
    return result


def markdown(result: dict) -> str:
    lines = [f"# Feature-evaluation variants of {result['run_dir']}", "",
             f"k = {result['k']}, {result['hidden']} hidden units ({result['activation']} units in training), "
             f"epoch {result['epoch']}, dataset {result['dataset']}, device {result['device']}. Each row chooses alpha "
             "and L2 (or the iteration cap) on the validation set and reads the test set once.", "",
             "| variant | alpha | L2 | valid error | test error |", "|---|---|---|---|---|"]
    for r in result["variants"]:
        lines.append(f"| {r['variant']} | {fmt_alpha(r['alpha'])} | {r['l2']:g} | {pct(r['valid_error'])} | "
                     f"{pct(r['test_error'])} |")
    return "\n".join(lines) + "\n"
