"""The small training problems of the GPU step tests, shared with their CPU checks.

``TRAJECTORY_*``: the ten-step trajectory of tests/gpu/test_cuda_topk.py. On standardised data
(zero mean, unit variance per feature) with lr 0.003 and momentum 0.9 the NumPy loss falls at
every step (381.7 -> 328.6); on raw [0, 1) data with lr 0.01 it oscillated (127.7, 100.5, 715.1,
...), so no assertion on its direction could hold. tests/gpu/test_cuda_cpu.py checks the NumPy
side on every machine.
"""
from __future__ import annotations

import numpy as np

TRAJECTORY_SEED, TRAJECTORY_LR, TRAJECTORY_MOMENTUM, TRAJECTORY_K, TRAJECTORY_STEPS = 1, 0.003, 0.9, 25, 10


def setup(seed=0, N=128, D=784, H=1000, standardise=False):
    """``(params, X)``: Gaussian weights (sigma 0.01) and MNIST-like intensities in [0, 1), or those
    standardised per feature."""
    from ksae_cupy.model import init_params

    rng = np.random.default_rng(seed)
    params = init_params(D, H, 0.01, rng)
    X = rng.random((N, D)).astype(np.float32)
    if standardise:
        X = ((X - X.mean(axis=0)) / X.std(axis=0)).astype(np.float32)
    return params, X


def trajectory_setup():
    return setup(seed=TRAJECTORY_SEED, standardise=True)
