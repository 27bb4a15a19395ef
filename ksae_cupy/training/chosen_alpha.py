"""The one rule for the encoding's alpha (features keep the ``alpha*k`` largest units, section 2.2) when none is given.

    1. the alpha the run's evaluation chose on validation data (``ksae-eval``'s ``eval.json``, of the same epoch);
    2. else 3, the paper's choice on MNIST (section 5), cut to ``n_hidden / k`` on a layer too small for it.

``load``, ``transform``, ``ksae-data codes``, ``ksae-data export`` and ``ksae-sweep`` all default by it.
Beside it, the other thing a run folder says about encoding its inputs: the scale its dataset applies
(:func:`dataset_input_scale`), which ``load(raw_inputs=True)`` applies and the export records.
"""
from __future__ import annotations

import json
from pathlib import Path

PAPER_ALPHA = 3.0  # the paper's alpha for k = 25 on MNIST (section 5)
EVAL_FILE = "eval.json"


def fallback_alpha(k: int, hidden: int) -> float:
    """3, or ``hidden / k`` when 3k units exceed the layer."""
    return min(PAPER_ALPHA, hidden / k)


def evaluated_alpha(run_dir, epoch: int | None = None) -> float | None:
    """The alpha ``ksae-eval`` chose for the run in ``run_dir`` (None: no evaluation there, or one of another
    epoch than ``epoch``, the checkpoint's, when it is given)."""
    path = Path(run_dir) / EVAL_FILE
    try:
        result = json.loads(path.read_text())
        alpha = result["features"]["selected"]["alpha"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if alpha is None or (epoch is not None and result.get("epoch") not in (None, epoch)):
        return None
    return float(alpha)


def default_alpha(k: int, hidden: int, run_dir=None, epoch: int | None = None) -> tuple[float, str]:
    """``(alpha, where it comes from)`` by the rule above."""
    if run_dir is not None:
        chosen = evaluated_alpha(run_dir, epoch)
        if chosen is not None:
            return chosen, f"chosen by ksae-eval ({Path(run_dir) / EVAL_FILE})"
    alpha = fallback_alpha(k, hidden)
    return alpha, ("the paper's 3" if alpha == PAPER_ALPHA else f"n_hidden / k = {alpha:g} (3k exceeds the layer)")


def run_folder_of(path) -> Path | None:
    """The run folder of ``path`` (a folder holding ``checkpoint.h5``, or that checkpoint), else None."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.name == "checkpoint.h5" and (path.parent / "config.json").is_file():
        return path.parent
    return None


def dataset_input_scale(run_dir) -> float | None:
    """What the run's dataset multiplied its raw values by (1/255: the built-in pixel datasets); None for a
    user's file (taken as given) or a run folder without its config."""
    try:
        dataset = json.loads((Path(run_dir) / "config.json").read_text()).get("dataset")
    except (OSError, ValueError):
        return None
    from ksae_cupy.datasets.registry import DATASETS

    entry = DATASETS.get(dataset) if isinstance(dataset, str) else None
    return None if entry is None else getattr(entry, "input_scale", None)
