"""Schedules over epochs: the sparsity level k (section 4.3.1) and the learning rate.

Epochs are counted from 0. With E epochs in all:

* k goes linearly from ``k_start`` at epoch 0 down to ``k`` at epoch E/2 (rounded to the
  nearest integer), then stays at ``k`` for the second half of the epochs;
* the supervised learning rate of section 4.3.2 decays linearly from ``lr_start`` at
  epoch 0 to ``lr_end`` at the last epoch.
"""
from __future__ import annotations

from ksae_cupy import paper


def sparsity_at_epoch(epoch: int, epochs: int, k: int, k_start: int | None) -> int:
    """The k used during ``epoch`` (0-based) of ``epochs``; ``k_start=None`` means no schedule."""
    if k_start is None or k_start == k:
        return k
    half = epochs / 2.0
    if epoch >= half:
        return k
    return int(round(k_start + (k - k_start) * (epoch / half)))


def schedule_reaches_k(epochs: int, k: int, k_start: int | None) -> bool:
    """Whether some epoch of ``epochs`` trains with ``k`` (one epoch alone stays at ``k_start``)."""
    return sparsity_at_epoch(epochs - 1, epochs, k, k_start) == k


def linear_decay(epoch: int, epochs: int, start: float, end: float) -> float:
    """Linear interpolation from ``start`` at epoch 0 to ``end`` at epoch ``epochs - 1``."""
    if epochs <= 1:
        return start
    return start + (end - start) * (epoch / (epochs - 1))


DEFAULT_K_START = paper.K_START  # section 4.3.1: "we start off with a large sparsity level (e.g. k=100)"


def resolve_k_start(k_start, k: int, hidden: int) -> int | None:
    """``"auto"`` -> 100 clipped into [k, hidden]; None -> None (no schedule); an int as given."""
    if k_start == "auto":
        return max(k, min(DEFAULT_K_START, hidden))
    return None if k_start is None else int(k_start)
