"""The k-sparse autoencoder of Makhzani & Frey (2014), section 2.2, with hand-written gradients.

Names carry their shapes (the whole package follows this): the letters after the underscore
name the axes in order, so ``X_nd`` is N x D, ``W_dh`` is D x H, ``W_hd`` is H x D, ``b_h`` is a
vector of H. The letters:

    n   examples: the rows of a minibatch (N) or of a dataset
    d   input dimensions (D; 784 on MNIST)
    h   hidden units (H; 1000 in the paper)
    k   the units kept in each row (k, or alpha*k when encoding): idx_nk, val_nk
    c   classes (the softmax of the classifier and of fine-tuning: W_hc, P_nc)
    m   dead units (the AuxK loss of auxk_step.py: Za_nm, Wd_md)

``idx_nk`` holds the column (0 .. H-1) of each kept unit and ``val_nk`` its value; a prefix says
what an array is: ``d`` a gradient (``dW_dh``), ``V`` a velocity, ``Zs`` the code with only the
kept units, ``Xhat`` the reconstruction.

Tied weights ``W_dh`` (D inputs, H hidden units), encoder bias ``b_h``, decoder bias ``c_d``.
The paper's algorithm box, for a minibatch ``X_nd``:

    1) Z_nh    = X_nd W_dh + b_h                      (feedforward; linear units)
    2) Gamma   = supp_k(Z_nh) per row; Zs_nh = Z_nh on Gamma, 0 elsewhere
    3) Xhat_nd = Zs_nh W_dh^T + c_d ;  E = 0.5/N * sum_n ||Xhat_n - X_n||^2
    4) backpropagate the error through the k kept units only.

Hidden units are linear, as in the paper. ``activation="relu"`` is a variant for the
investigation of the paper's 1.35% (the authors' released notebook used ReLU units): the
k largest are selected as before, then negative survivors are set to zero, and gradient
passes only through kept units that are positive.

Loss scale: half the squared error, summed over dimensions and averaged over the batch,
as in the authors' code; so the paper's learning rate 0.01 keeps its meaning.

Gradients, with R_nd = (Xhat_nd - X_nd) / N and S_nh the mask of kept units:
    dc_d  = sum_n R_nd
    dZ_nh = (R_nd W_dh) * S_nh            (only the kept units pass gradient)
    db_h  = sum_n dZ_nh
    dW_dh = X_nd^T dZ_nh + R_nd^T Zs_nh   (W is used twice: encoder and decoder)

Every function is written against the array module of its inputs (NumPy or CuPy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ksae_cupy.backend import array_module
from ksae_cupy.topk import scatter_rows, topk

PARAM_NAMES = ("W_dh", "b_h", "c_d")
ACTIVATIONS = ("linear", "relu")


def init_params(D: int, H: int, sigma: float, rng: np.random.Generator, dtype=np.float32):
    """Gaussian weights of standard deviation ``sigma`` (section 4.3.2), zero biases.

    Drawn on the host from ``rng`` so CPU and GPU runs with one seed start identically.
    """
    return {
        "W_dh": (rng.standard_normal((D, H)) * sigma).astype(dtype),
        "b_h": np.zeros(H, dtype=dtype),
        "c_d": np.zeros(D, dtype=dtype),
    }


def hidden_preactivations(params, X_nd):
    """``Z_nh = X_nd W_dh + b_h``: the linear hidden code before selection."""
    return X_nd @ params["W_dh"] + params["b_h"]


@dataclass
class ForwardCache:
    """What the backward pass needs from the forward pass."""

    X_nd: object
    idx_nk: object  # int32 columns of the kept units
    Zs_nh: object  # sparse code: Z on the kept units, 0 elsewhere (None from the sparse step)
    activation: str = "linear"
    val_nk: object = None  # the kept values, set by the sparse step (ksae_cupy/sparse_step.py)


def select_units(Z_nh, k: int, topk_method: str = "sort", activation: str = "linear"):
    """``(idx_nk, val_nk)``: the k largest units of each row, after ``activation``."""
    idx_nk, val_nk = topk(Z_nh, k, topk_method)
    if activation == "relu":
        val_nk = array_module(val_nk).maximum(val_nk, 0)
    elif activation != "linear":
        from ksae_cupy.errors import OptionError, literal
        raise OptionError("activation", f"{{name}} {literal(repr(activation))} is not allowed; use one of "
                                        f"{', '.join(ACTIVATIONS)}")
    return idx_nk, val_nk


def forward(params, X_nd, k: int, topk_method: str = "sort", activation: str = "linear"):
    """Reconstruct ``X_nd`` through the k largest hidden units: ``(Xhat_nd, cache)``."""
    Z_nh = hidden_preactivations(params, X_nd)
    idx_nk, val_nk = select_units(Z_nh, k, topk_method, activation)
    Zs_nh = scatter_rows(idx_nk, val_nk, Z_nh.shape[1])
    Xhat_nd = Zs_nh @ params["W_dh"].T + params["c_d"]
    return Xhat_nd, ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=Zs_nh, activation=activation)


def reconstruction_loss(Xhat_nd, X_nd):
    """``(E, R_nd)``: E = 0.5/N sum ||Xhat - X||^2 (a host float) and R = dE/dXhat."""
    xp = array_module(X_nd)
    R_nd = Xhat_nd - X_nd
    N = X_nd.shape[0]
    loss = 0.5 * float(xp.vdot(R_nd, R_nd)) / N
    R_nd /= N
    return loss, R_nd


def backward(params, R_nd, cache: ForwardCache):
    """Gradients of the loss for every parameter, through the kept units only.

    ``R_nd`` is dE/dXhat. Returns a dict with the keys of :data:`PARAM_NAMES`.
    """
    xp = array_module(R_nd)
    # Gradient reaches Z only at the kept units: gather there, zero elsewhere.
    dZs_nh = R_nd @ params["W_dh"]
    dZ_nk = xp.take_along_axis(dZs_nh, cache.idx_nk, axis=1)
    if cache.activation == "relu":  # a kept unit clipped to zero passes no gradient
        dZ_nk *= xp.take_along_axis(cache.Zs_nh, cache.idx_nk, axis=1) > 0
    dZ_nh = scatter_rows(cache.idx_nk, dZ_nk, dZs_nh.shape[1])
    # Both uses of W in one product: [X; R]^T [dZ; Zs] = X^T dZ + R^T Zs.
    dW_dh = xp.concatenate([cache.X_nd, R_nd]).T @ xp.concatenate([dZ_nh, cache.Zs_nh])
    return {"W_dh": dW_dh, "b_h": dZ_nh.sum(axis=0), "c_d": R_nd.sum(axis=0)}


def loss_and_grads(params, X_nd, k: int, topk_method: str = "sort", activation: str = "linear"):
    """One forward and backward pass: ``(loss, grads, cache)``."""
    Xhat_nd, cache = forward(params, X_nd, k, topk_method, activation)
    loss, R_nd = reconstruction_loss(Xhat_nd, X_nd)
    return loss, backward(params, R_nd, cache), cache


def encode(params, X_nd, k: int, alpha: float = 1.0, topk_method: str = "sort", activation: str = "linear"):
    """Sparse features ``h = supp_{alpha k}(W^T x + b)`` of section 2.2, as a dense (N, H) array.

    ``alpha * k`` is rounded to the nearest integer and must not exceed H.
    """
    H = params["W_dh"].shape[1]
    kept = alpha_k(k, alpha, H)
    Z_nh = hidden_preactivations(params, X_nd)
    idx_nk, val_nk = select_units(Z_nh, kept, topk_method, activation)
    return scatter_rows(idx_nk, val_nk, H)


def decode(params, Zs_nh):
    """``Xhat_nd = Zs_nh W_dh^T + c_d``."""
    return Zs_nh @ params["W_dh"].T + params["c_d"]


def alpha_k(k: int, alpha: float, H: int) -> int:
    """The number of units kept at encoding time, ``round(alpha * k)``, checked against H."""
    from ksae_cupy.errors import KsaeError

    if not 1 <= alpha < float("inf"):  # NaN too; an infinite alpha would keep "infinitely many" units
        raise KsaeError(f"alpha={alpha} is not allowed; use a finite alpha >= 1 (section 2.2)")
    if alpha * k > H + 0.5:  # before rounding: alpha * k may overflow to infinity
        raise KsaeError(f"alpha*k = {alpha}*{k} = {alpha * k:g} exceeds the {H} hidden units; use alpha <= {H / k:g}")
    return int(round(alpha * k))


# ---- Beyond the paper: the auxiliary loss of Gao et al. (2024), "AuxK" ----
# Units that no example kept for a while ("dead") get a gradient of their own: with the main
# reconstruction's residual e_nd = X_nd - Xhat_nd held constant, the top ``aux_k`` of the dead
# units' pre-activations reconstruct e through W alone (no decoder bias):
#
#     L_aux = aux_coef * 0.5/N * sum_n ||e_n - ehat_n||^2,   ehat_n = sum over the kept dead units j of Z_nj W_j
#
# the same 0.5/N scale as the main loss, so aux_coef (1/32 in Gao et al.'s code) weighs it against
# that loss directly. With Ra_nd = aux_coef * (ehat_nd - e_nd) / N and Sa_nh the kept dead units:
#     dZa_nh = (Ra_nd W_dh) * Sa_nh;  db_h += sum_n dZa_nh;  dW_dh += X_nd^T dZa_nh + Ra_nd^T Za_nh
# (W is used twice again, as encoder and decoder); c gets nothing.

def select_dead_units(Z_nh, dead_h, aux_k: int, topk_method: str = "sort", activation: str = "linear"):
    """``(idx_na, val_na)``: each row's ``a = min(aux_k, dead units)`` largest pre-activations among
    the units where ``dead_h`` is true (after ``activation``), columns of ``Z_nh``; None when no unit is dead.

    Same set as the top a of ``Z_nh`` with every live unit masked out, ties to the lower column."""
    xp = array_module(Z_nh)
    dead_cols = xp.flatnonzero(dead_h)
    a = min(int(aux_k), int(dead_cols.size))
    if a == 0:
        return None
    local_na, val_na = select_units(xp.ascontiguousarray(Z_nh[:, dead_cols]), a, topk_method, activation)
    return dead_cols[local_na].astype(np.int32), val_na


def auxk_loss_and_grads(params, X_nd, R_nd, Z_nh, dead_h, aux_k: int, aux_coef: float, topk_method: str = "sort",
                        activation: str = "linear"):
    """``(aux_loss, grads)``: the auxiliary loss and its gradients (dense arrays, keys of :data:`PARAM_NAMES`).

    ``R_nd`` is the main loss's ``(Xhat_nd - X_nd) / N`` (so ``e_nd = -N R_nd``), ``Z_nh`` the
    pre-activations, ``dead_h`` a boolean mask of the dead units."""
    xp = array_module(X_nd)
    W_dh = params["W_dh"]
    N, H = X_nd.shape[0], W_dh.shape[1]
    grads = {name: xp.zeros_like(params[name]) for name in PARAM_NAMES}
    selected = select_dead_units(Z_nh, dead_h, aux_k, topk_method, activation)
    if selected is None:
        return 0.0, grads
    idx_na, val_na = selected
    Za_nh = scatter_rows(idx_na, val_na, H)
    # ehat - e = Za W^T + N R  (e = X - Xhat = -N R is a constant: no gradient flows into it)
    Ra_nd = Za_nh @ W_dh.T + R_nd * X_nd.dtype.type(N)
    aux_loss = float(aux_coef) * 0.5 * float(xp.vdot(Ra_nd, Ra_nd)) / N
    Ra_nd *= X_nd.dtype.type(aux_coef / N)
    dZa_na = xp.take_along_axis(Ra_nd @ W_dh, idx_na, axis=1)
    if activation == "relu":  # a selected unit clipped to zero passes no gradient
        dZa_na *= val_na > 0
    dZa_nh = scatter_rows(idx_na, dZa_na, H)
    grads["W_dh"] = xp.concatenate([X_nd, Ra_nd]).T @ xp.concatenate([dZa_nh, Za_nh])
    grads["b_h"] = dZa_nh.sum(axis=0)
    return aux_loss, grads


def loss_and_grads_auxk(params, X_nd, k: int, dead_h, aux_k: int, aux_coef: float, topk_method: str = "sort",
                        activation: str = "linear"):
    """:func:`loss_and_grads` plus the auxiliary loss on the ``dead_h`` units: ``(loss, aux_loss, grads, cache)``.

    ``loss`` is the main reconstruction loss alone (what the training log reports); ``grads`` are
    those of ``loss + aux_loss``. The dense reference of :mod:`ksae_cupy.auxk_step`."""
    Z_nh = hidden_preactivations(params, X_nd)
    idx_nk, val_nk = select_units(Z_nh, k, topk_method, activation)
    Zs_nh = scatter_rows(idx_nk, val_nk, Z_nh.shape[1])
    Xhat_nd = Zs_nh @ params["W_dh"].T + params["c_d"]
    cache = ForwardCache(X_nd=X_nd, idx_nk=idx_nk, Zs_nh=Zs_nh, activation=activation)
    loss, R_nd = reconstruction_loss(Xhat_nd, X_nd)
    grads = backward(params, R_nd, cache)
    aux_loss, aux_grads = auxk_loss_and_grads(params, X_nd, R_nd, Z_nh, dead_h, aux_k, aux_coef, topk_method,
                                              activation)
    for name in PARAM_NAMES:
        grads[name] += aux_grads[name]
    return loss, aux_loss, grads, cache
