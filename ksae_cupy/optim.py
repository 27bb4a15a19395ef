"""Momentum SGD exactly as the paper's update equations (section 4.3.2).

    v <- m v - lr * grad
    theta <- theta + v

The paper prints ``x_{k+1} = x_k + v_k``; we read it as the standard form above (the new
velocity is applied at once), which is what momentum SGD means in every implementation
the paper cites, the authors' gnumpy code included. The update is in place, on the
parameters' own array module (NumPy or CuPy).
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.cpu import kernels as cpu_kernels


class MomentumSGD:
    """In-place momentum SGD over a dict of named parameter arrays.

    ``velocities`` holds one array per parameter, zero at the start; it is saved in
    checkpoints so a resumed run takes the very same next step.
    """

    def __init__(self, params, momentum: float, xp):
        self.momentum = float(momentum)
        self.velocities = {name: xp.zeros_like(value) for name, value in params.items()}

    def step(self, params, grads, lr: float) -> None:
        """One update of every parameter with learning rate ``lr``.

        NumPy arrays of one memory layout take the one-pass Numba kernel
        (:func:`ksae_cupy.cpu.kernels.momentum_update`), bit for bit the same update; a
        gradient with a ``momentum_update`` method (the sparse step's ``W`` gradient, kept
        in parts) applies itself, or is made an array when it declines.
        """
        fused = cpu_kernels.momentum_update if cpu_kernels.enabled() else None
        for name, value in params.items():
            v, grad = self.velocities[name], grads[name]
            # A gradient kept in parts (the sparse step's RowScatterGradient) applies itself.
            if hasattr(grad, "momentum_update"):
                if grad.momentum_update(value, v, self.momentum, lr):
                    continue
                grad = np.asarray(grad)
            if fused is not None and isinstance(value, np.ndarray) and fused(value, v, grad, self.momentum, lr):
                continue
            v *= value.dtype.type(self.momentum)
            v -= value.dtype.type(lr) * grad
            value += v

