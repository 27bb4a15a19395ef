"""``KSparseAutoencoder``: the Python API, in the style of scikit-learn's decomposition estimators.

    ae = KSparseAutoencoder(n_hidden=1000, k=25, epochs=50, device="auto")
    ae.fit(X_train_nd, X_valid_nd)            # NumPy or CuPy arrays, N x D
    H_nh = ae.transform(X_test_nd, alpha=3)   # alpha*k-sparse features (section 2.2)
    Xhat_nd = ae.inverse_transform(H_nh)
    ae.save("model.h5"); ae = KSparseAutoencoder.load("model.h5")

The ``ksae-train`` command is a thin layer over :meth:`KSparseAutoencoder.fit` with a
:class:`~ksae_cupy.training.runs.RunFolder` for checkpoints and logs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import array_module, resolve_device, to_host
from ksae_cupy.training.checkpoint import load_checkpoint, save_checkpoint
from ksae_cupy.datasets import check_finite
from ksae_cupy.errors import KsaeError
from ksae_cupy.schedules import resolve_k_start
from ksae_cupy.training.trainer import TrainConfig, Trainer


class KSparseAutoencoder:
    """A k-sparse autoencoder with tied weights, trained by momentum SGD.

    Parameters mirror :class:`~ksae_cupy.training.trainer.TrainConfig` (``n_hidden`` is its
    ``hidden``); ``k_start="auto"`` starts the schedule at 100 (section 4.3.1), or at k
    when k > 100, never above ``n_hidden``; ``None`` turns the schedule off; ``device`` is ``auto``, ``cpu`` or ``gpu[:N]``. After fitting,
    ``components_`` is the dictionary ``W_dh`` transposed (H x D, like scikit-learn).
    """

    def __init__(self, n_hidden=1000, k=25, k_start="auto", epochs=5000, batch_size=128, lr=0.01,
                 momentum=0.9, sigma=0.01, topk="sort", seed=0, dtype="float32", device="auto", activation="linear",
                 step="auto"):
        self.n_hidden, self.k, self.k_start, self.epochs = n_hidden, k, k_start, epochs
        self.batch_size, self.lr, self.momentum, self.sigma = batch_size, lr, momentum, sigma
        self.topk, self.seed, self.dtype, self.device = topk, seed, dtype, device
        self.activation, self.step = activation, step
        self.trainer_: Trainer | None = None
        self.preprocess_: dict = {}

    # -- configuration -------------------------------------------------------------------
    def config(self) -> TrainConfig:
        k_start = resolve_k_start(self.k_start, self.k, self.n_hidden)
        return TrainConfig(hidden=self.n_hidden, k=self.k, k_start=k_start, epochs=self.epochs,
                           batch_size=self.batch_size, lr=self.lr, momentum=self.momentum, sigma=self.sigma,
                           topk=self.topk, seed=self.seed, dtype=self.dtype, activation=self.activation,
                           step=self.step)

    @property
    def backend(self):
        if self.trainer_ is not None:
            return self.trainer_.backend
        return resolve_device(self.device)

    # -- training ------------------------------------------------------------------------
    def fit(self, X_nd, X_valid_nd=None, on_epoch=None, should_checkpoint=None, checkpoint_path=None,
            on_batch=None):
        """Train for the configured epochs (continuing a resumed or partial fit).

        ``on_epoch(report)`` is called after every epoch, ``on_batch(done, total)`` after
        every batch; when ``checkpoint_path`` is
        given, a checkpoint is written there whenever ``should_checkpoint(epoch)`` is true
        and at the end. Returns ``self``.
        """
        trainer = self._ensure_trainer(X_nd)
        X_dev, X_valid_dev = self._to_device(X_nd), self._to_device(X_valid_nd)
        step_before = trainer.step
        with trainer.backend.use():
            while not trainer.finished:
                report = trainer.run_epoch(X_dev, X_valid_dev, on_batch)
                if report is None:  # stop requested mid-epoch
                    break
                if on_epoch is not None:
                    on_epoch(report)
                if checkpoint_path is not None and should_checkpoint is not None and should_checkpoint(report.epoch):
                    self.save(checkpoint_path)
                if trainer.stop_requested:
                    break
        # A finished run resumed again trains nothing: leave its checkpoint file untouched.
        if checkpoint_path is not None and (trainer.step != step_before or not Path(checkpoint_path).exists()):
            self.save(checkpoint_path)
        return self

    def partial_fit(self, X_nd):
        """One pass over ``X_nd`` (one epoch of the schedule); returns ``self``."""
        trainer = self._ensure_trainer(X_nd)
        if trainer.finished:
            trainer.config.epochs += 1  # partial_fit may go on past the configured epochs
        with trainer.backend.use():
            trainer.run_epoch(self._to_device(X_nd))
        return self

    def _ensure_trainer(self, X_nd) -> Trainer:
        if self.trainer_ is None:
            config = self.config()
            config.validate(n_train=X_nd.shape[0])
            self.trainer_ = Trainer(config, resolve_device(self.device), D=X_nd.shape[1])
        D = self.trainer_.params["W_dh"].shape[0]
        if X_nd.ndim != 2 or X_nd.shape[1] != D:
            raise KsaeError(f"data of shape {tuple(X_nd.shape)} does not fit this model; expected N x {D}")
        return self.trainer_

    def _to_device(self, X_nd):
        if X_nd is None:
            return None
        if array_module(X_nd) is np:
            check_finite(np.asarray(X_nd), "the data")
        return self.trainer_.backend.asarray(X_nd, dtype=self.trainer_.dtype)

    # -- using the model -----------------------------------------------------------------
    @property
    def params_(self) -> dict:
        if self.trainer_ is None:
            raise KsaeError("this KSparseAutoencoder is not fitted yet; call fit() or load() first")
        return self.trainer_.params

    @property
    def components_(self) -> np.ndarray:
        return to_host(self.params_["W_dh"]).T

    def transform(self, X_nd, alpha: float = 1.0, chunk: int = 8192):
        """The ``alpha*k``-sparse features ``supp_{alpha k}(W^T x + b)``, an N x H array.

        Returns the array type of the input (NumPy in, NumPy out).
        """
        params, backend = self.params_, self.trainer_.backend
        is_host = array_module(X_nd) is np
        out = []
        with backend.use():
            for start in range(0, X_nd.shape[0], chunk):
                X_chunk = backend.asarray(X_nd[start:start + chunk], dtype=self.trainer_.dtype)
                H_nh = model.encode(params, X_chunk, self.k, alpha, self.trainer_.config.topk,
                                    self.trainer_.config.activation)
                out.append(to_host(H_nh) if is_host else H_nh)
        xp = np if is_host else backend.xp
        return xp.concatenate(out) if out else xp.zeros((0, self.n_hidden), dtype=self.trainer_.dtype)

    def inverse_transform(self, H_nh):
        """Reconstructions ``W h + c`` of codes ``H_nh``."""
        backend = self.trainer_.backend if self.trainer_ else None
        params = self.params_
        with backend.use():
            Xhat = model.decode(params, backend.asarray(H_nh, dtype=self.trainer_.dtype))
        return to_host(Xhat) if array_module(H_nh) is np else Xhat

    def score(self, X_nd) -> float:
        """Minus the mean reconstruction loss 0.5 ||x - xhat||^2 with k units (higher is better)."""
        with self.trainer_.backend.use():
            return -self.trainer_.evaluate_loss(self._to_device(X_nd))

    # -- persistence ---------------------------------------------------------------------
    def save(self, path) -> None:
        """Write a checkpoint (the whole training state) to ``path`` atomically."""
        save_checkpoint(Path(path), self.trainer_.checkpoint(self.preprocess_))

    @classmethod
    def load(cls, path, device: str = "auto") -> "KSparseAutoencoder":
        """An estimator restored from a checkpoint, ready to transform or to go on training."""
        ckpt = load_checkpoint(Path(path))
        config = TrainConfig.from_dict(ckpt.config)
        est = cls(n_hidden=config.hidden, k=config.k, k_start=config.k_start, epochs=config.epochs,
                  batch_size=config.batch_size, lr=config.lr, momentum=config.momentum, sigma=config.sigma,
                  topk=config.topk, seed=config.seed, dtype=config.dtype, device=device,
                  activation=config.activation, step=config.step)
        est.trainer_ = Trainer(config, resolve_device(device), D=ckpt.params["W_dh"].shape[0], checkpoint=ckpt)
        est.preprocess_ = dict(ckpt.preprocess)
        return est
