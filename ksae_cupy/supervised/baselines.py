"""The baseline unsupervised learners of Table fn_mnist: dropout / denoising autoencoders and an RBM.

The paper (sections 4.5, 4.6, 5) compares k-sparse pretraining with a dropout autoencoder (50%
hidden dropout), a denoising autoencoder (20% input dropout: pixels set to 0), a dropout +
denoising autoencoder (both at once; Table err_mnist only) and an RBM, and gives no other
detail of them. Our choices, all written down here:

**Regularised autoencoder** (one class for the three): tied weights ``W_dh`` like the k-sparse
autoencoder of :mod:`ksae_cupy.model`, *sigmoid* hidden units (the usual unit of the dropout
and denoising papers, and what the RBM's encoder is, so all three baselines hand the same
kind of layer to fine-tuning), a *linear* decoder and the loss of :mod:`ksae_cupy.model`,
``E = 0.5/N sum_n ||Xhat_n - X_n||^2`` against the *clean* input, plus an optional L2 weight
decay ``wd/2 ||W_dh||^2`` (the paper names none; ours is chosen on validation). For a minibatch:

    Xc_nd   = X_nd * Min_nd                     (input dropout mask, or none)
    S_nh    = sigmoid(Xc_nd W_dh + b_h)
    Hd_nh   = S_nh * Mhid_nh                    (hidden dropout mask, or none)
    Xhat_nd = Hd_nh W_dh^T + c_d

Gradients, with R_nd = (Xhat_nd - X_nd) / N:
    dc_d  = sum_n R_nd
    dZ_nh = (R_nd W_dh) * Mhid_nh * S_nh (1 - S_nh)
    db_h  = sum_n dZ_nh
    dW_dh = Xc_nd^T dZ_nh + R_nd^T Hd_nh + wd W_dh  (W is used twice: encoder and decoder)

Masks use inverted dropout (:mod:`ksae_cupy.supervised.units`), so the features of a trained
autoencoder are ``sigmoid(X W_dh + b_h)`` on the uncorrupted input with every hidden unit.

**RBM**: Bernoulli visible and hidden units, energy ``-v c - h b - v W h``, the MNIST
intensities in [0, 1] used as the visible probabilities (the data is not binarised).
Trained by CD-1 (Hinton's practical guide): with uniform numbers ``U_nh``,

    Ph0 = sigmoid(V0 W + b) ;  H0 = 1[U < Ph0]      (sampled hidden states)
    V1  = sigmoid(H0 W^T + c)                      (visible probabilities, not sampled)
    Ph1 = sigmoid(V1 W + b)
    dW = -(V0^T Ph0 - V1^T Ph1)/N + weight_decay W ;  db = -mean(Ph0 - Ph1) ;  dc = -mean(V0 - V1)

``d*`` are the directions handed to :class:`~ksae_cupy.momentum_sgd.MomentumSGD` (which subtracts
``lr * d``), i.e. minus the CD-1 estimate of the log-likelihood gradient, plus L2 weight
decay on ``W``. The encoder given to fine-tuning is ``sigmoid(x W + b)``.

Both learners train through :class:`ksae_cupy.supervised.baseline_trainer.BaselineTrainer` (one
resumable loop), which shuffles with one host NumPy generator per run and draws the masks and
hidden samples from it, like :mod:`ksae_cupy.training.trainer`. Everything runs on the array module
of its inputs (NumPy or CuPy). Hyperparameters the paper does not give are ours and named
as such in the config classes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ksae_cupy import paper
from ksae_cupy.backend import array_module, to_host
from ksae_cupy.errors import KsaeError, OptionError
from ksae_cupy.training.config import RATE, check_by_rule, check_in_dtype_by_field, check_with
from ksae_cupy.training.options import DictConfig, ValidatedOnce, check_batch_size
from ksae_cupy.model import reconstruction_loss
from ksae_cupy.paper import ERR_MNIST, errors
from ksae_cupy.supervised import baseline_registry as registry
from ksae_cupy.supervised.baseline_registry import (  # noqa: F401 (the registry's names, read from here too)
    BASELINES, DROPOUTS, learner_of, per_family_default, register)
from ksae_cupy.supervised.units import check_dropout_rate, sigmoid

PARAM_NAMES = ("W_dh", "b_h", "c_d")  # the same names for the autoencoder and the RBM



def init_params(D: int, H: int, sigma: float, rng: np.random.Generator, dtype=np.float32) -> dict:
    """Gaussian ``W_dh`` of std ``sigma`` drawn on the host, zero biases (as :func:`model.init_params`)."""
    return {"W_dh": (rng.standard_normal((D, H)) * sigma).astype(dtype),
            "b_h": np.zeros(H, dtype=dtype), "c_d": np.zeros(D, dtype=dtype)}


# -- the regularised autoencoder ------------------------------------------------------------

@dataclass
class AutoencoderCache:
    """What the backward pass needs from the forward pass."""

    Xc_nd: object  # the (possibly corrupted) input the encoder saw
    S_nh: object  # sigmoid outputs before hidden dropout
    Hd_nh: object  # the code the decoder saw
    M_hid_nh: object  # hidden dropout mask, or None


def ae_forward(params, X_nd, M_in_nd=None, M_hid_nh=None):
    """``(Xhat_nd, cache)``: reconstruction through the masks given (None: no dropout there)."""
    Xc_nd = X_nd if M_in_nd is None else X_nd * M_in_nd
    S_nh = sigmoid(Xc_nd @ params["W_dh"] + params["b_h"])
    Hd_nh = S_nh if M_hid_nh is None else S_nh * M_hid_nh
    Xhat_nd = Hd_nh @ params["W_dh"].T + params["c_d"]
    return Xhat_nd, AutoencoderCache(Xc_nd=Xc_nd, S_nh=S_nh, Hd_nh=Hd_nh, M_hid_nh=M_hid_nh)


def ae_backward(params, R_nd, cache: AutoencoderCache) -> dict:
    """Gradients of the loss for every parameter; ``R_nd`` is dE/dXhat."""
    xp = array_module(R_nd)
    dS_nh = R_nd @ params["W_dh"]
    if cache.M_hid_nh is not None:
        dS_nh *= cache.M_hid_nh  # dropped units pass no gradient; kept ones the 1/(1-p) scale
    dZ_nh = dS_nh * cache.S_nh * (1 - cache.S_nh)
    # Both uses of W in one product: [Xc; R]^T [dZ; Hd] = Xc^T dZ + R^T Hd.
    dW_dh = xp.concatenate([cache.Xc_nd, R_nd]).T @ xp.concatenate([dZ_nh, cache.Hd_nh])
    return {"W_dh": dW_dh, "b_h": dZ_nh.sum(axis=0), "c_d": R_nd.sum(axis=0)}


def ae_loss_and_grads(params, X_nd, M_in_nd=None, M_hid_nh=None, weight_decay: float = 0.0):
    """``(loss, grads)``: E = 0.5/N sum ||Xhat - X||^2 against the *clean* ``X_nd``, plus
    ``weight_decay/2 ||W_dh||^2`` when it is not 0."""
    Xhat_nd, cache = ae_forward(params, X_nd, M_in_nd, M_hid_nh)
    loss, R_nd = reconstruction_loss(Xhat_nd, X_nd)
    grads = ae_backward(params, R_nd, cache)
    if weight_decay:
        W = params["W_dh"]
        xp = array_module(W)
        loss += 0.5 * weight_decay * float(xp.vdot(W, W))
        grads["W_dh"] += W.dtype.type(weight_decay) * W
    return loss, grads


def ae_reconstruction_error(params, X_nd, chunk: int = 4096) -> float:
    """Mean of 0.5 ||x - xhat||^2 per example with no dropout (the clean reconstruction error)."""
    total = 0.0
    for s in range(0, X_nd.shape[0], chunk):
        X_chunk = X_nd[s:s + chunk]
        total += reconstruction_loss(ae_forward(params, X_chunk)[0], X_chunk)[0] * X_chunk.shape[0]
    return total / X_nd.shape[0]


# -- the RBM -----------------------------------------------------------------------------------

def rbm_cd1(params, V0_nd, U_nh, weight_decay: float = 0.0):
    """``(recon_error, grads)`` of one CD-1 step on ``V0_nd`` with uniform numbers ``U_nh``.

    ``recon_error`` is 0.5/N sum ||V1 - V0||^2 (a host float, for monitoring only: CD-1
    does not minimise it); ``grads`` are the descent directions of the module docstring.
    """
    W = params["W_dh"]
    N = V0_nd.shape[0]
    Ph0_nh = sigmoid(V0_nd @ W + params["b_h"])
    H0_nh = (U_nh < Ph0_nh).astype(Ph0_nh.dtype)
    V1_nd = sigmoid(H0_nh @ W.T + params["c_d"])
    Ph1_nh = sigmoid(V1_nd @ W + params["b_h"])
    xp = array_module(V0_nd)
    # Positive minus negative statistics in one product: [V0; V1]^T [Ph0; -Ph1].
    stats_dh = xp.concatenate([V0_nd, V1_nd]).T @ xp.concatenate([Ph0_nh, -Ph1_nh])
    grads = {"W_dh": -stats_dh / N + W.dtype.type(weight_decay) * W,
             "b_h": -(Ph0_nh - Ph1_nh).sum(axis=0) / N,
             "c_d": -(V0_nd - V1_nd).sum(axis=0) / N}
    R_nd = V1_nd - V0_nd
    return 0.5 * float(xp.vdot(R_nd, R_nd)) / N, grads


# -- features for fine-tuning ------------------------------------------------------------------

def encoder(params) -> tuple[np.ndarray, np.ndarray]:
    """``(W_dh, b_h)`` host copies: the sigmoid layer ``sigmoid(x W_dh + b_h)`` fine-tuning starts from."""
    return to_host(params["W_dh"]).copy(), to_host(params["b_h"]).copy()


def encode(params, X_nd, chunk: int = 8192):
    """Features ``sigmoid(X W_dh + b_h)``: uncorrupted input, every hidden unit (no dropout)."""
    xp = array_module(X_nd)
    W, b = (xp.asarray(params[n]) for n in ("W_dh", "b_h"))
    parts = [sigmoid(X_nd[s:s + chunk] @ W + b) for s in range(0, X_nd.shape[0], chunk)]
    return xp.concatenate(parts) if parts else xp.zeros((0, W.shape[1]), dtype=W.dtype)


# -- training ----------------------------------------------------------------------------------

@dataclass
class AutoencoderConfig(DictConfig, ValidatedOnce):
    """Options of one dropout / denoising / dropout + denoising autoencoder run.

    Paper: hidden dropout 0.5 (dropout AE), input dropout 0.2 (denoising AE), both (dropout +
    denoising AE), momentum 0.9 and sigma 0.01 (its unsupervised settings, section 4.3.2).
    Ours: lr 0.01, no weight decay and batch 128: the lr and weight decay a validation grid chose on
    MNIST for all three autoencoders over 0.003 (docs/baselines-grid.md; the tables' runs use them).
    """

    hidden: int = paper.HIDDEN
    input_dropout: float = 0.0
    hidden_dropout: float = 0.0
    epochs: int = 100
    batch_size: int = paper.BATCH_SIZE
    lr: float = paper.LR
    momentum: float = paper.MOMENTUM
    weight_decay: float = 0.0
    sigma: float = paper.SIGMA
    seed: int = 0
    dtype: str = "float32"

    def validate(self, n_train: int | None = None) -> None:
        """Raise :class:`KsaeError` naming the first bad option and what is allowed."""
        check_dropout_rate("input_dropout", self.input_dropout)
        check_dropout_rate("hidden_dropout", self.hidden_dropout)
        _check_weight_decay(self.weight_decay)
        _check_common(self, n_train)


# The RBM's settings, none of them the paper's (they happen to equal its k-sparse ones): Hinton's practical
# guide's momentum and sigma, and the rate a validation grid chose.
RBM_RATE, GUIDE_MOMENTUM, GUIDE_SIGMA = 0.01, 0.9, 0.01


@dataclass
class RBMConfig(DictConfig, ValidatedOnce):
    """Options of one RBM run (CD-1). None of these are in the paper; ours follow Hinton's
    practical guide (2010) -- momentum 0.9, weight decay 2e-4, sigma 0.01 -- but for the lr, 0.01 where
    the guide says 0.05: lr and weight decay as a validation grid chose them on MNIST
    (docs/baselines-grid.md; the tables' runs use them)."""

    hidden: int = paper.HIDDEN
    epochs: int = 100
    batch_size: int = paper.BATCH_SIZE
    lr: float = RBM_RATE
    momentum: float = GUIDE_MOMENTUM
    weight_decay: float = 2e-4
    sigma: float = GUIDE_SIGMA
    seed: int = 0
    dtype: str = "float32"

    def validate(self, n_train: int | None = None) -> None:
        """Raise :class:`KsaeError` naming the first bad option and what is allowed."""
        _check_weight_decay(self.weight_decay)
        _check_common(self, n_train)


def _check_weight_decay(weight_decay) -> None:
    if not (isinstance(weight_decay, (int, float)) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise OptionError("weight_decay", f"{{name}} {weight_decay} is not allowed; use a finite value >= 0")


def _check_common(cfg, n_train) -> None:
    """The fields every baseline has, a kind TrainConfig has too, by its rules (training/config.py: RULES)."""
    for field in ("hidden", "epochs"):
        check_by_rule(field, getattr(cfg, field))
    check_with("batch_size", check_batch_size, cfg.batch_size, n_train)
    check_by_rule("lr", cfg.lr, RATE)
    for field in ("momentum", "sigma", "dtype"):
        check_by_rule(field, getattr(cfg, field))
    # legal numbers that lose their meaning in the model's dtype (a step of 0, all-zero weights, no decay)
    check_in_dtype_by_field(cfg.dtype, lr=("rate", cfg.lr), sigma=("sigma", cfg.sigma),
                            momentum=("momentum", cfg.momentum))
    decay = getattr(cfg, "weight_decay", 0) or 0
    if cfg.lr * decay >= 1:  # W <- (1 - lr weight_decay) W - lr g: each step would flip every weight's sign
        raise OptionError("weight_decay", f"{{name}} {decay} is not allowed with {{lr}} {cfg.lr}: lr * weight_decay "
                                          f"= {cfg.lr * decay:.3g} >= 1 would shrink every weight past zero each "
                                          f"step; use {{name}} < {1 / cfg.lr:.3g}")


def check_rbm_input(X_nd):
    """``X_nd`` itself, or a one-line error when it holds values outside [0, 1]."""
    lo, hi = float(to_host(X_nd.min())), float(to_host(X_nd.max()))
    if lo < 0 or hi > 1:
        raise KsaeError(f"the RBM's input holds values in [{lo:g}, {hi:g}]; its visible units are probabilities, "
                        f"so only values in [0, 1] are allowed")
    return X_nd


def _checked_input(X_nd, config, what: str):
    if getattr(X_nd, "ndim", None) != 2:
        raise KsaeError(f"{what} has shape {getattr(X_nd, 'shape', None)}; only an N x D array is allowed")
    config.validate(n_train=X_nd.shape[0])
    return X_nd


# -- one training step and the validation loss, as the trainer calls them -------------------------------

def rbm_step(run, X_bd):
    """``(loss, grads)`` of one CD-1 step; the uniforms drawn from the run's generator. ``run`` is a
    :class:`~ksae_cupy.supervised.baseline_trainer.BaselineTrainer` (its params, config, rng, backend, dtype)."""
    U_nh = run.backend.asarray(run.rng.random((X_bd.shape[0], run.config.hidden)), dtype=run.dtype)
    return rbm_cd1(run.params, X_bd, U_nh, run.config.weight_decay)


def rbm_valid_loss(params, X_nd, chunk: int = 4096) -> float:
    """Mean 0.5 ||x - xhat||^2 per row of the mean-field reconstruction ``sigmoid(sigmoid(x W + b) W^T + c)``
    (no sampling)."""
    xp, total = array_module(X_nd), 0.0
    for s in range(0, X_nd.shape[0], chunk):
        X_chunk = X_nd[s:s + chunk]
        R_nd = sigmoid(encode(params, X_chunk) @ params["W_dh"].T + params["c_d"]) - X_chunk
        total += 0.5 * float(xp.vdot(R_nd, R_nd))
    return total / X_nd.shape[0]


def ae_step(run, X_bd):
    """``(loss, grads)`` of one autoencoder step; its dropout masks (input first, then hidden) drawn from
    the run's generator."""
    cfg, n = run.config, X_bd.shape[0]
    M_in = run.mask((n, X_bd.shape[1]), cfg.input_dropout)
    M_hid = run.mask((n, cfg.hidden), cfg.hidden_dropout)
    return ae_loss_and_grads(run.params, X_bd, M_in, M_hid, cfg.weight_decay)


# -- the entries (ksae_cupy.supervised.baseline_registry) ----------------------------------------

@dataclass(frozen=True)
class Baseline(registry.Baseline):
    """A registry entry whose step and validation loss default to the regularised autoencoder's."""

    step: object = ae_step
    valid_loss: object = ae_reconstruction_error


# An autoencoder above the first layer starts from sigma 0.1 and learns at lr 0.01 (a stated deviation from
# the paper's sigma 0.01; the lr is also layer 1's default, chosen apart on layer 1): on 1000 sigmoid
# features of ||h||^2 ~ 3 a layer drawn at sigma 0.01 has every unit at 0.5, and its tied decoder learns
# only the mean (MNIST: validation loss 1.11-1.14 after 156 epochs, the mean's 1.097); an 8-epoch
# validation grid chose these (docs/baselines.md, "The deep dropout AE again").
UPPER_RATE = 0.01  # the grid's choice (it happens to be the paper's k-sparse rate)
UPPER_AUTOENCODER = {"lr": UPPER_RATE, "sigma": 0.1}


for _baseline in (
    Baseline("rbm", "CD-1", "RBM", RBMConfig, fine_tuned=True, check_input=check_rbm_input, grid_lrs="0.01,0.05",
             grid_weight_decays="2e-5,2e-4", step=rbm_step, valid_loss=rbm_valid_loss, family="rbm"),
    Baseline("dropout-ae", "50% hidden dropout", "dropout autoencoder (50% hidden)", AutoencoderConfig,
             {"hidden_dropout": 0.5}, fine_tuned=True, upper_layers=UPPER_AUTOENCODER),
    Baseline("denoising-ae", "20% input dropout", "denoising autoencoder (20% input dropout)", AutoencoderConfig,
             {"input_dropout": 0.2}, fine_tuned=True, upper_layers=UPPER_AUTOENCODER),
    Baseline("dropout-denoising-ae", "both", "dropout + denoising autoencoder (20% input, 50% hidden)",
             AutoencoderConfig, {"input_dropout": 0.2, "hidden_dropout": 0.5}, upper_layers=UPPER_AUTOENCODER),
):
    register(_baseline)


REGULARISATION = {name: baseline.regularisation for name, baseline in BASELINES.items()}  # each one's dropout

# The paper's figures for these baselines on MNIST (1000 hidden units), from ksae_cupy.paper.
# Table err_mnist: logistic regression on the features (section 5).
PAPER_ERR_MNIST = {model: error for model, error in errors(ERR_MNIST).items() if model in BASELINES}
