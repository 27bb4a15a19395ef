"""An estimator's fit stopped mid-epoch, and its parameters read back, for the tests that resume one."""
from __future__ import annotations

import numpy as np


def stop_at(model, epoch: int, batch: int):
    """An ``on_batch`` callback that asks ``model`` (a KSparseAutoencoder being fitted) to stop once
    ``batch`` batches of epoch ``epoch`` ran (the trainer's count: epoch 0 is the first)."""

    def on_batch(done, total):
        if model.trainer_.epoch == epoch and done == batch:
            model.trainer_.stop_requested = True

    return on_batch


def params_of(model):
    """The fitted ``model``'s parameters as NumPy arrays."""
    return {name: np.array(value) for name, value in model.trainer_.params.items()}
