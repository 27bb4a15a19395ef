"""Supervised fine-tuning of pretrained autoencoders and RBMs (sections 4.3.2, 4.5 and 4.6).

The discriminative network, for a minibatch ``X_nd`` with labels ``y_n``:

    A0_nd = X_nd * M0_nd                          (input dropout mask, or none)
    Z_l   = A_{l-1} W_l + b_l
    H_l   = Z_l on its alpha*k largest entries per row, 0 elsewhere    ("ksparse" layer)
          | sigmoid(Z_l)                                               ("sigmoid" layer)
          | max(Z_l, 0)                                                ("relu" layer: a plain net)
    A_l   = H_l * M_l                             (hidden dropout mask, or none; l = 1..L)
    S_nc  = A_L W_hc + b_c ;  P_nc = softmax(S_nc)
    E     = -1/N sum_n log P[n, y_n]              (cross-entropy averaged over the batch)

A "ksparse" layer starts from the encoder ``W_dh, b_h`` of a pretrained k-sparse
autoencoder (or, "no pretraining", from Gaussian weights) and keeps its ``alpha*k`` largest
linear units (section 4.5: "we used the alpha k largest hidden units"); the error flows back
through those kept units only, exactly as in :func:`ksae_cupy.model.backward`. A "sigmoid"
layer starts from a baseline of :mod:`ksae_cupy.supervised.baselines` (dropout or denoising
autoencoder, RBM), whose features are sigmoid units. A "relu" layer (Gaussian weights) makes the
plain 784-1000-10 network that Table fn_mnist's "without pre-training" row may mean: no k-sparsity
at all. The softmax layer starts from Gaussian weights.

Dropout during fine-tuning (section 4.5: "we fine-tuned the weights obtained from dropout
autoencoder with dropout regularization or in denoising autoencoder, we fine-tuned the
discriminative neural net by adding noise to the input"): ``input_dropout`` masks the input,
``hidden_dropout`` every hidden layer's output; inverted masks (:mod:`ksae_cupy.supervised.units`),
fresh for every batch, and none at prediction.

Gradients, with G_nc = (P_nc - onehot(y)_nc) / N:
    dW_hc = A_L^T G ;  db_c = sum_n G ;  dA_L = G W_hc^T
    dH_l  = dA_l * M_l
    dZ_l  = dH_l on the kept units of layer l, 0 elsewhere     ("ksparse")
          | dH_l * H_l (1 - H_l)                                ("sigmoid")
          | dH_l * [Z_l > 0]                                    ("relu")
    dW_l  = A_{l-1}^T dZ_l ;  db_l = sum_n dZ_l ;  dA_{l-1} = dZ_l W_l^T

Layer-wise fine-tuning of the deep net (section 4.6) runs phases in order:
``softmax`` (only ``W_hc, b_c`` learn), ``top`` (the last hidden layer and the softmax),
``all``. Frozen parameters are not touched at all -- not even by a zero update, which
could turn -0.0 into +0.0 -- so they stay bit-identical. Each phase is its own run of
momentum SGD with the learning rate decaying linearly from ``lr_start`` to ``lr_end``
(section 4.3.2) and fresh zero velocities: a phase starts a new optimisation problem.

Parameter names: ``W1_dh, b1_h`` (layer 1), ``W2_hh, b2_h`` (layer 2, and so on),
``W_hc, b_c`` (softmax). Everything is written against the array module of its inputs.

The functions here are the dense reference. When every hidden layer is ksparse and no dropout
is used, the trainer takes by default (``FinetuneConfig.step``) the sparse step of
:mod:`ksae_cupy.supervised.sparse_finetune` on the CPU: the same gradients, through the kept
units only.

Over 400 lines: the network's forward pass, its hand-written backward pass (checked in float64) and the
trainer that runs them phase by phase, read together.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ksae_cupy.backend import Backend, array_module, to_host
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.errors import KsaeError
from ksae_cupy.training import epochs
from ksae_cupy.optimizers import OPTIMIZERS, PAPER as MOMENTUM
from ksae_cupy.schedules import linear_decay
from ksae_cupy.topk import scatter_rows, topk
from ksae_cupy.supervised.units import dropout_mask, sigmoid
# The network's names and loss, shared with the sparse step (and still reached as finetune.layer_names, ...).
from ksae_cupy.supervised.network import layer_names, logits_gradient, param_names, softmax_cross_entropy
from ksae_cupy.supervised.sparse_finetune import loss_and_grads_sparse
from ksae_cupy.sparse_step import sparse_layout

# The configuration and its choice sets live in finetune_config.py; still imported from here.
from ksae_cupy.supervised.finetune_config import (ACTIVATIONS, PHASES, TRAIN_ON,  # noqa: F401,E402 (re-export)
                                                  FinetuneConfig)
from ksae_cupy.sparse_step import STEPS  # noqa: F401,E402 (re-exported: the fine-tuning's steps are the autoencoder's)


# -- the network ---------------------------------------------------------------------------

def trainable_names(phase: str, L: int) -> list[str]:
    """The parameters that learn in ``phase`` of a net with ``L`` hidden layers."""
    if phase == "softmax":
        return ["W_hc", "b_c"]
    if phase == "top":
        return list(layer_names(L)) + ["W_hc", "b_c"]
    if phase == "all":
        return param_names(L)
    raise KsaeError(f"fine-tuning phase {phase!r} is not allowed; use one of {', '.join(PHASES)}")


def init_from_encoders(encoders, n_classes: int, sigma: float, rng: np.random.Generator, dtype=np.float32):
    """Parameters of the net from a list of ``(W_dh, b_h)`` host arrays, one per hidden layer.

    Consecutive layers must chain (layer l+1 takes as many inputs as layer l has units).
    The softmax weights are Gaussian of std ``sigma``, drawn from ``rng``; biases zero.
    """
    params = {}
    for l, (W, b) in enumerate(encoders, start=1):
        W, b = np.asarray(W), np.asarray(b)
        if l > 1 and W.shape[0] != encoders[l - 2][0].shape[1]:
            raise KsaeError(f"layer {l} takes {W.shape[0]} inputs but layer {l - 1} has "
                            f"{encoders[l - 2][0].shape[1]} hidden units; the pretrained runs do not stack")
        w_name, b_name = layer_names(l)
        params[w_name], params[b_name] = W.astype(dtype, copy=True), b.astype(dtype, copy=True)
    H = encoders[-1][0].shape[1]
    params["W_hc"] = (rng.standard_normal((H, n_classes)) * sigma).astype(dtype)
    params["b_c"] = np.zeros(n_classes, dtype=dtype)
    return params


def init_random(D: int, hidden: list[int], n_classes: int, sigma: float, rng: np.random.Generator,
                dtype=np.float32):
    """"No pretraining": the same net with Gaussian weights (std ``sigma``) in every layer."""
    encoders, fan_in = [], D
    for H in hidden:
        encoders.append(((rng.standard_normal((fan_in, H)) * sigma).astype(dtype), np.zeros(H, dtype=dtype)))
        fan_in = H
    return init_from_encoders(encoders, n_classes, sigma, rng, dtype)


@dataclass
class NetCache:
    """What the backward pass needs, per hidden layer: its input, its kept columns (ksparse)
    or sigmoid outputs (sigmoid), its dropout mask; and the top layer's output."""

    inputs: list = field(default_factory=list)  # A_{l-1} for l = 1..L (the masked input for l = 1)
    idx: list = field(default_factory=list)  # idx_nk of a ksparse layer, None for a sigmoid one
    S: list = field(default_factory=list)  # H_l of a sigmoid or relu layer, None for a ksparse one
    kinds: list = field(default_factory=list)  # the activation of each layer
    masks: list = field(default_factory=list)  # M_l, or None without hidden dropout
    A_top: object = None  # A_L
    P_nc: object = None


def forward(params, X_nd, kept: list, topk_method: str = "sort", activations=None, masks=None):
    """Logits ``S_nc`` and the cache.

    Hidden layer l is ``activations[l-1]`` (None: every layer "ksparse"); a ksparse layer
    keeps ``kept[l-1]`` units, a sigmoid layer ignores its ``kept`` entry. ``masks`` is None
    (no dropout, as at prediction) or L+1 arrays or Nones: ``masks[0]`` multiplies the
    input, ``masks[l]`` the output of hidden layer l.
    """
    activations = activations or ["ksparse"] * len(kept)
    masks = masks or [None] * (len(kept) + 1)
    xp = array_module(X_nd)
    A, cache = (X_nd if masks[0] is None else X_nd * masks[0]), NetCache()
    for l, (k, activation) in enumerate(zip(kept, activations), start=1):
        w_name, b_name = layer_names(l)
        Z_nh = A @ params[w_name] + params[b_name]
        cache.inputs.append(A)
        if activation == "ksparse":
            idx_nk, val_nk = topk(Z_nh, k, topk_method)
            H_nh = scatter_rows(idx_nk, val_nk, Z_nh.shape[1])
            cache.idx.append(idx_nk)
            cache.S.append(None)
        else:
            H_nh = sigmoid(Z_nh) if activation == "sigmoid" else xp.maximum(Z_nh, 0)
            cache.idx.append(None)
            cache.S.append(H_nh)
        cache.kinds.append(activation)
        cache.masks.append(masks[l])
        A = H_nh if masks[l] is None else H_nh * masks[l]
    cache.A_top = A
    return A @ params["W_hc"] + params["b_c"], cache


def backward(params, P_nc, y_n, cache: NetCache, trainable) -> dict:
    """Gradients of the mean cross-entropy for the ``trainable`` names only.

    Products that only feed frozen parameters are skipped.
    """
    xp = array_module(P_nc)
    G_nc = logits_gradient(P_nc, y_n)
    grads = {}
    if "W_hc" in trainable:
        grads["W_hc"] = cache.A_top.T @ G_nc
    if "b_c" in trainable:
        grads["b_c"] = G_nc.sum(axis=0)
    L = len(cache.idx)
    lowest = min([l for l in range(1, L + 1) if set(layer_names(l)) & set(trainable)], default=L + 1)
    if lowest > L:
        return grads
    dA = G_nc @ params["W_hc"].T
    for l in range(L, lowest - 1, -1):
        w_name, b_name = layer_names(l)
        idx_nk, S_nh, M_nh = cache.idx[l - 1], cache.S[l - 1], cache.masks[l - 1]
        dH = dA if M_nh is None else dA * M_nh  # dropped units pass no gradient
        if idx_nk is not None:
            # Gradient reaches Z only at the kept units of this layer.
            dZ = scatter_rows(idx_nk, xp.take_along_axis(dH, idx_nk, axis=1), dH.shape[1])
        elif cache.kinds[l - 1] == "relu":
            dZ = dH * (S_nh > 0)  # H = max(Z, 0): gradient where Z > 0 (0 at Z = 0, as autograd takes it)
        else:
            dZ = dH * S_nh * (1 - S_nh)
        if w_name in trainable:
            grads[w_name] = cache.inputs[l - 1].T @ dZ
        if b_name in trainable:
            grads[b_name] = dZ.sum(axis=0)
        if l > lowest:
            dA = dZ @ params[w_name].T
    return grads


def loss_and_grads(params, X_nd, y_n, kept, trainable=None, topk_method: str = "sort", activations=None,
                   masks=None):
    """One forward and backward pass: ``(loss, grads)``; ``trainable=None`` means all."""
    S_nc, cache = forward(params, X_nd, kept, topk_method, activations, masks)
    loss, P_nc = softmax_cross_entropy(S_nc, y_n)
    names = param_names(len(kept)) if trainable is None else trainable
    return loss, backward(params, P_nc, y_n, cache, names)


def draw_masks(rng: np.random.Generator, n: int, sizes: list[int], input_dropout: float, hidden_dropout: float,
               backend: Backend, dtype=np.float32):
    """Fresh dropout masks for a batch of ``n`` (``sizes`` = [D, H_1, ..., H_L]), or None without dropout.

    Drawn on the host from ``rng`` (the trainer's generator, saved in checkpoints), so a
    resumed run drops the very same units; nothing is drawn for a rate of 0.
    """
    if input_dropout == 0 and hidden_dropout == 0:
        return None
    rates = [input_dropout] + [hidden_dropout] * (len(sizes) - 1)
    return [None if p == 0 else backend.asarray(dropout_mask(rng, (n, size), p, dtype))
            for p, size in zip(rates, sizes)]


def predict(params, X_nd, kept, topk_method: str = "sort", chunk: int = 8192, activations=None):
    """Class of each row (argmax of the logits, no dropout), on the array module of ``X_nd``."""
    xp = array_module(X_nd)
    out = [xp.argmax(forward(params, X_nd[s:s + chunk], kept, topk_method, activations)[0], axis=1)
           for s in range(0, X_nd.shape[0], chunk)]
    return xp.concatenate(out) if out else xp.zeros(0, dtype=np.int64)


def error_rate(params, X_nd, y_n, kept, topk_method: str = "sort", activations=None) -> float:
    """Fraction of misclassified rows."""
    pred = predict(params, X_nd, kept, topk_method, activations=activations)
    return float(to_host((pred != y_n).mean()))


# -- training ------------------------------------------------------------------------------

@dataclass
class FinetuneReport:
    """What one epoch did (written to ``metrics.jsonl``)."""

    phase: str
    epoch: int  # 1-based within the phase
    step: int
    lr: float
    train_loss: float  # mean over the epoch's batches of the cross-entropy
    valid_error: float | None
    seconds: float
    momentum: float | None = None  # the epoch's momentum (it varies only with a --momentum-end ramp)
    device: str | None = None  # where the epoch ran ("cpu", "gpu:0"): a resume may move a run to another device


class FinetuneTrainer:
    """Parameters, velocities and random state of one fine-tuning run, on ``backend``.

    Resumable to the bit on the CPU: the batch order and the dropout masks come from one
    NumPy generator whose state (and, mid-epoch, the epoch's order) is saved by
    :meth:`state` and restored by :meth:`from_state`.

    Each batch takes the step :attr:`step_kind` ("dense" or "sparse", ``config.step`` resolved
    for this net and backend); for the sparse one ``W1_dh`` is kept in Fortran order.
    """

    def __init__(self, config: FinetuneConfig, backend: Backend, host_params: dict, rng: np.random.Generator):
        config.validate(hidden=[host_params[layer_names(l)[0]].shape[1] for l in range(1, len(config.kept) + 1)])
        self.config, self.backend, self.rng = config, backend, rng
        self.dtype = np.dtype(config.dtype)
        self.step_kind = config.resolved_step(backend)  # "dense" or "sparse"
        self.params = {name: backend.asarray(value, dtype=self.dtype) for name, value in host_params.items()}
        if self.step_kind == "sparse":  # W1_dh.T then holds one contiguous row per unit (sparse_layout)
            self.params["W1_dh"] = sparse_layout(self.params["W1_dh"])
        self.phase_index, self.epoch, self.step, self.batch_in_epoch, self.epoch_perm = 0, 0, 0, 0, None
        momentum = OPTIMIZERS[MOMENTUM]  # the paper's fine-tuning optimizer (section 4.3.2), its momentum ramped per epoch
        self.optimizer = momentum.make(self.params, config, backend.xp)
        # The update, chosen once: on the CPU kernels fused, the sparse step's weight gradients applied in parts.
        self._update = momentum.cpu_parts_step if backend.xp is np and cpu_kernels.enabled() else momentum.step
        self.stop_requested = False
        self.tally = epochs.EpochTally()  # the running epoch's loss sum (ksae_cupy.training.epochs)

    @property
    def L(self) -> int:
        return len(self.config.kept)

    @property
    def sizes(self) -> list[int]:
        """``[D, H_1, ..., H_L]``: the widths the dropout masks cover."""
        return [self.params["W1_dh"].shape[0]] + [self.params[layer_names(l)[0]].shape[1]
                                                  for l in range(1, self.L + 1)]

    @property
    def finished(self) -> bool:
        return self.phase_index >= len(self.config.phases)

    @property
    def phase(self) -> str:
        return self.config.phases[self.phase_index]

    def current_lr(self) -> float:
        return linear_decay(self.epoch, self.config.epochs, self.phase_lr_start(), self.config.lr_end)

    def current_momentum(self) -> float:
        """The momentum of the current epoch: ``momentum``, or on its ramp to ``momentum_end`` (restarted with each
        phase, as the learning rate's schedule is)."""
        cfg = self.config
        if cfg.momentum_end is None:
            return cfg.momentum
        ramp = cfg.epochs if cfg.momentum_epochs is None else cfg.momentum_epochs
        return linear_decay(min(self.epoch, ramp - 1), ramp, cfg.momentum, cfg.momentum_end)

    def phase_lr_start(self) -> float:
        """The current phase's first rate: ``lr_start``, or ``softmax_lr_start`` in the softmax phase when set
        (the softmax on 1000 dense sigmoid features takes steps far larger than on alpha*k sparse ones)."""
        cfg = self.config
        return cfg.softmax_lr_start if self.phase == "softmax" and cfg.softmax_lr_start is not None else cfg.lr_start

    def run_epoch(self, X_nd, y_n, X_valid_nd=None, y_valid_n=None, on_batch=None) -> FinetuneReport | None:
        """One epoch (or the rest of an interrupted one) of the current phase, on device arrays.

        Returns None when :attr:`stop_requested` stopped it between batches.
        """
        return epochs.run_epochs(self, (X_nd, y_n, X_valid_nd, y_valid_n), on_batch=on_batch, limit=1)

    # -- the engine's three calls (ksae_cupy.training.epochs) -----------------------------------------
    def open_epoch(self, epoch: epochs.Epoch) -> None:
        """The phase's trainable arrays, the epoch's rate and momentum, and its order."""
        trainable = trainable_names(self.phase, self.L)
        epoch.own.update(trainable=trainable, lr=self.current_lr(), momentum=self.current_momentum(),
                         live={name: self.params[name] for name in trainable})  # frozen arrays are never written
        self.optimizer.momentum = epoch.own["momentum"]
        epoch.order = epochs.draw_order(self, epoch.data[0].shape[0])
        epoch.start = time.perf_counter()

    def take_step(self, epoch: epochs.Epoch, b: int) -> None:
        cfg, (X_nd, y_n) = self.config, epoch.data[:2]
        trainable = epoch.own["trainable"]
        rows = epoch.order[b * cfg.batch_size:(b + 1) * cfg.batch_size]
        masks = draw_masks(self.rng, rows.shape[0], self.sizes, cfg.input_dropout, cfg.hidden_dropout,
                           self.backend, self.dtype)
        if self.step_kind == "sparse":  # weight gradients in parts, applied row by row by the optimizer
            loss, grads = loss_and_grads_sparse(self.params, X_nd[rows], y_n[rows], cfg.kept, trainable, cfg.topk,
                                                defer_weight_gradient=True)
        else:
            loss, grads = loss_and_grads(self.params, X_nd[rows], y_n[rows], cfg.kept, trainable, cfg.topk,
                                         cfg.activations, masks)
        if not math.isfinite(loss):
            from ksae_cupy.training.trainer import TrainingDiverged

            rate = "softmax_lr_start" if self.phase_lr_start() != cfg.lr_start else "lr_start"
            raise TrainingDiverged(f"the cross-entropy became {loss} in phase {self.phase}, epoch "
                                   f"{self.epoch + 1}; try a smaller {{{rate}}} (now {self.phase_lr_start()})", fields=True)
        self._update(self.optimizer, epoch.own["live"], grads, epoch.own["lr"])
        self.tally.add("loss", loss)
        self.tally.add("batches", 1)

    def close_epoch(self, epoch: epochs.Epoch) -> FinetuneReport:
        X_valid_nd, y_valid_n = epoch.data[2:]
        self.backend.synchronize()
        phase = self.phase
        tally = epochs.end_epoch(self)
        report = FinetuneReport(
            phase=phase, epoch=self.epoch, step=self.step, lr=epoch.own["lr"],
            train_loss=tally.mean("loss", "batches") or 0.0,
            valid_error=self.error(X_valid_nd, y_valid_n) if X_valid_nd is not None else None,
            seconds=time.perf_counter() - epoch.start, momentum=epoch.own["momentum"],
            device=self.backend.name)
        if self.epoch >= self.config.epochs:
            self._next_phase()
        return report

    def _next_phase(self) -> None:
        # A new phase is a new optimisation problem: fresh velocities, fresh lr schedule.
        self.phase_index += 1
        self.epoch = 0
        for v in self.optimizer.velocities.values():
            v[...] = 0

    def fit(self, X_nd, y_n, X_valid_nd=None, y_valid_n=None, on_epoch=None, on_batch=None) -> None:
        """Run every remaining phase, or until :attr:`stop_requested`."""
        epochs.run_epochs(self, (X_nd, y_n, X_valid_nd, y_valid_n), on_epoch, on_batch=on_batch)

    def error(self, X_nd, y_n) -> float:
        return error_rate(self.params, X_nd, y_n, self.config.kept, self.config.topk, self.config.activations)

    # -- state for checkpoints -------------------------------------------------------------
    def state(self) -> dict:
        """Host copy of the whole state (see :mod:`ksae_cupy.supervised.checkpoint`)."""
        return {
            "params": {n: to_host(v) for n, v in self.params.items()},
            "velocities": {n: to_host(v) for n, v in self.optimizer.velocities.items()},
            "config": self.config.to_dict(), "phase_index": self.phase_index, "epoch": self.epoch,
            "step": self.step, "batch_in_epoch": self.batch_in_epoch, "rng_state": self.rng.bit_generator.state,
            "epoch_perm": self.epoch_perm if self.batch_in_epoch else None,
            "epoch_tally": epochs.tally_state(self),
        }

    @classmethod
    def from_state(cls, state: dict, backend: Backend) -> "FinetuneTrainer":
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng_state"]
        trainer = cls(FinetuneConfig.from_dict(state["config"]), backend, state["params"], rng)
        for name, value in state["velocities"].items():
            trainer.optimizer.velocities[name][...] = backend.asarray(value)
        trainer.phase_index, trainer.epoch, trainer.step = state["phase_index"], state["epoch"], state["step"]
        trainer.batch_in_epoch, trainer.epoch_perm = state["batch_in_epoch"], state["epoch_perm"]
        trainer.tally = epochs.restored_tally(trainer.batch_in_epoch, state.get("epoch_tally"))
        return trainer
