"""Pieces shared by the baseline learners and the fine-tuning net: sigmoid units and dropout.

Dropout here is *inverted* dropout: each unit is kept with probability ``1 - p`` and a kept
unit is multiplied by ``1 / (1 - p)``, so the mask has expectation 1 and nothing is
rescaled at test time (the paper: features use "all the hidden units" / "the uncorrupted
input"). The same convention serves the input (denoising: each pixel set to 0 with
probability p) and the hidden units.

Masks are drawn on the host from a NumPy generator, like the batch order, so a CPU and a
GPU run with one seed drop the same units and a resumed run draws the very same masks.
"""
from __future__ import annotations

import math

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.errors import OptionError, literal


def sigmoid(Z):
    """Logistic function ``1 / (1 + exp(-Z))`` without overflow, on the array module of ``Z``.

    Accurate to machine epsilon in absolute terms (not relative, far in the lower tail).
    """
    xp = array_module(Z)
    return 0.5 * (1.0 + xp.tanh(0.5 * Z))  # the same function; tanh never overflows


def check_dropout_rate(field: str, p) -> None:
    """Raise a one-line :class:`~ksae_cupy.errors.OptionError` on the parameter ``field`` (e.g.
    ``hidden_dropout``; a command prints ``--hidden-dropout``) unless ``0 <= p < 1``."""
    if not (isinstance(p, (int, float)) and math.isfinite(p) and 0 <= p < 1):
        raise OptionError(field, f"{{name}} {literal(p)} is not allowed; use a dropout rate 0 <= rate < 1")


def dropout_mask(rng: np.random.Generator, shape, p: float, dtype=np.float32) -> np.ndarray:
    """Host mask of ``shape``: 0 with probability ``p``, else ``1/(1-p)`` (inverted dropout)."""
    keep = rng.random(shape) >= p
    return keep.astype(dtype) * np.dtype(dtype).type(1.0 / (1.0 - p))  # a dtype scalar keeps float32 float32
