"""Training the paper's baselines to completion in one call (the Python API; ``ksae-finetune --baseline``
takes only :func:`stack_configs`, and trains each layer as a run folder: :mod:`.baseline_pretrain`):
each through :class:`~ksae_cupy.supervised.baseline_trainer.BaselineTrainer`, the
resumable loop ``ksae-baseline`` runs; and greedy layer-wise stacks of them (section 4.6).

The models and their gradients are in :mod:`ksae_cupy.supervised.baselines`; this module sits
above both it and the trainer, so that neither imports the other's caller.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.backend import CPU, Backend
from ksae_cupy.errors import KsaeError
from ksae_cupy.supervised.baseline_trainer import BaselineTrainer
from ksae_cupy.supervised.baselines import (BASELINES, AutoencoderConfig, RBMConfig, _checked_input,
                                            check_rbm_input, encode, learner_of)


def fit_autoencoder(X_nd, config: AutoencoderConfig, backend: Backend = CPU, on_epoch=None) -> dict:
    """Train one dropout / denoising autoencoder on the rows of ``X_nd``; host parameters.

    ``on_epoch`` gets each epoch's :class:`~ksae_cupy.supervised.baseline_trainer.BaselineReport`.
    """
    return _fit(_checked_input(X_nd, config, "the autoencoder's input"), config, backend, on_epoch)


def fit_rbm(X_nd, config: RBMConfig, backend: Backend = CPU, on_epoch=None) -> dict:
    """Train one Bernoulli RBM by CD-1 on ``X_nd`` (values in [0, 1]); host parameters."""
    return _fit(check_rbm_input(_checked_input(X_nd, config, "the RBM's input")), config, backend, on_epoch)


def fit_baseline(X_nd, config, backend: Backend = CPU, on_epoch=None) -> dict:
    """Train the baseline ``config`` is one of (its registry entry refuses input it cannot learn from); host
    parameters."""
    baseline = learner_of(config)
    return _fit(baseline.check_input(_checked_input(X_nd, config, "the baseline's input")), config,
                backend, on_epoch)


def _fit(X_nd, config, backend: Backend, on_epoch) -> dict:
    """Every epoch of ``config`` through the one training loop (the resumable one ksae-baseline runs)."""
    return BaselineTrainer(config, backend, X_nd.shape[1]).fit(X_nd, on_epoch=on_epoch)


def fit_stack(X_nd, configs: list, backend: Backend = CPU, on_epoch=None) -> list:
    """Greedy layer-wise pretraining (section 4.6): layer l+1 learns on layer l's features.

    ``configs`` holds one :class:`AutoencoderConfig` or :class:`RBMConfig` per layer. The
    features are :func:`encode` -- every hidden unit of the uncorrupted input, as the paper
    uses them. ``on_epoch(layer, report)`` with ``layer`` 1-based. Host parameters per layer.
    """
    stack, inputs = [], X_nd
    for layer, config in enumerate(configs, start=1):
        report = None if on_epoch is None else (lambda r, layer=layer: on_epoch(layer, r))
        params = fit_baseline(inputs, config, backend, report)
        stack.append(params)
        with backend.use():
            inputs = encode({n: backend.asarray(v) for n, v in params.items()},
                            backend.asarray(inputs, dtype=np.dtype(config.dtype)))
    return stack


def stack_configs(kind: str, sizes: list[int], epochs: int, seed: int = 0) -> list:
    """The configuration of each layer of a ``kind`` stack (:data:`BASELINES`' names): its config
    class's defaults, the baseline's dropout, layer l seeded ``seed + l - 1``, and above the first layer its
    ``upper_layers`` (autoencoders: :data:`~ksae_cupy.supervised.baselines.UPPER_AUTOENCODER`)."""
    if kind not in BASELINES:
        raise KsaeError(f"baseline {kind!r} is not allowed; use one of {', '.join(BASELINES)}")
    baseline = BASELINES[kind]
    upper = baseline.upper_layers
    return [baseline.config(hidden=H, epochs=epochs, seed=seed + i, **baseline.regularisation, **(upper if i else {}))
            for i, H in enumerate(sizes)]
