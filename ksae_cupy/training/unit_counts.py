"""A run's per-unit firing counts, measured once at the end of ``ksae-train`` and kept in ``RUN_DIR/units.json``:
the one dead count (:data:`~ksae_cupy.metrics.DEAD_DEFINITION`) the done line, ``ksae-eval``, ``ksae-plot`` and
the export all give.

    {"definition": ..., "k": 25, "rows": 50000, "step": 1250000, "n_dead": 534, "firing_counts": [...]}
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

UNITS_FILE = "units.json"


def measure(trainer, preprocess: dict, X_nd, centred: bool = False) -> dict:
    """The counts of ``trainer``'s final weights on the training rows ``X_nd`` (as the dataset gives them; with
    ``centred``, already less a --center-input run's mean, as the trainer saw them)."""
    from ksae_cupy.backend import to_host
    from ksae_cupy.datasets.preprocess import raw_input_params
    from ksae_cupy.metrics import DEAD_DEFINITION, firing_counts

    config = trainer.config
    params = {name: to_host(value) for name, value in trainer.params.items()}
    if not centred:
        params = raw_input_params(params, {name: to_host(v) for name, v in (preprocess or {}).items()})
    with trainer.backend.use():
        counts_h = firing_counts(params, np.asarray(X_nd, dtype=params["W_dh"].dtype), config.k, config.activation,
                                 trainer.backend)
    return {"definition": DEAD_DEFINITION, "k": int(config.k), "rows": int(X_nd.shape[0]), "step": int(trainer.step),
            "n_dead": int((counts_h == 0).sum()), "firing_counts": counts_h.tolist()}


def write_unit_counts(run_dir, counts: dict) -> Path:
    """``units.json`` in ``run_dir``, written whole (a temporary name, then a rename)."""
    import os

    path = Path(run_dir) / UNITS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(counts) + "\n")
    os.replace(tmp, path)
    return path


def read_unit_counts(run_dir, step: int | None = None) -> dict | None:
    """The counts ``run_dir`` keeps (None: none, or measured at another step than ``step``, the checkpoint's)."""
    try:
        counts = json.loads((Path(run_dir) / UNITS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if step is not None and counts.get("step") != step:
        return None
    return counts
