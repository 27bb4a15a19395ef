"""Momentum SGD exactly as the paper's update equations (section 4.3.2).

    v <- m v - lr * grad
    theta <- theta + v

The paper prints ``x_{k+1} = x_k + v_k``; we read it as the standard form above (the new
velocity is applied at once), which is what momentum SGD means in every implementation
the paper cites, the authors' gnumpy code included. The update is in place, on the
parameters' own array module (NumPy or CuPy).

This is the update on plain arrays. On the CPU with the Numba kernels the trainers choose
the same update fused into one pass, and for the sparse step's weight gradient row by row
(:mod:`ksae_cupy.cpu.momentum`).
"""
from __future__ import annotations

import numpy as np


class MomentumSGD:
    """In-place momentum SGD over a dict of named parameter arrays.

    ``velocities`` holds one array per parameter, zero at the start (in the parameter's memory
    order); it is saved in checkpoints so a resumed run takes the very same next step.
    """

    def __init__(self, params, momentum: float, xp):
        self.momentum = float(momentum)
        self.velocities = {name: xp.zeros_like(value) for name, value in params.items()}

    def step(self, params, grads, lr: float) -> None:
        """One update of every parameter with learning rate ``lr``."""
        for name, value in params.items():
            momentum_update(value, self.velocities[name], grads[name], self.momentum, lr)


def momentum_update(theta, v, grad, momentum: float, lr: float) -> None:
    """``v <- m v - lr grad; theta <- theta + v`` in place, in ``theta``'s float type, with the denormals of
    ``v`` and ``theta`` flushed to zero (:func:`flush_denormals`)."""
    v *= theta.dtype.type(momentum)
    v -= theta.dtype.type(lr) * grad
    flush_denormals(v)
    theta += v
    flush_denormals(theta)


def flush_denormals(a) -> None:
    """Set to +0, in place, every entry of ``a`` whose magnitude is below the smallest normal number of its
    float type: the denormals (and -0). NaN and infinities stay.

    A unit that no example keeps gets a zero gradient, so its velocity decays by the momentum each step; 0.9
    times the smallest denormals rounds back to themselves, so without the flush the velocity would never
    reach 0, and arithmetic on denormals is many times slower on x86 CPUs. The CPU kernels flush each value
    as they write it (:mod:`ksae_cupy.cpu.numba_kernels`), the same rule, so both updates stay bit for bit
    equal."""
    tiny = a.dtype.type(np.finfo(a.dtype).tiny)
    a[abs(a) < tiny] = 0
