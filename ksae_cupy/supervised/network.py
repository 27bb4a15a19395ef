"""The fine-tuned network's parameter names and its softmax cross-entropy.

What the dense step (:mod:`ksae_cupy.supervised.finetune`, which re-exports these) and the sparse
step (:mod:`ksae_cupy.supervised.sparse_finetune`) share; here so that neither imports the other's
module (the trainer in ``finetune`` chooses between the two steps).

Parameter names: ``W1_dh, b1_h`` (layer 1), ``W2_hh, b2_h`` (layer 2, and so on),
``W_hc, b_c`` (softmax).
"""
from __future__ import annotations

from ksae_cupy.backend import array_module


def layer_names(l: int) -> tuple[str, str]:
    """Names of the weight and bias of hidden layer ``l`` (1-based)."""
    return ("W1_dh", "b1_h") if l == 1 else (f"W{l}_hh", f"b{l}_h")


def param_names(L: int) -> list[str]:
    names = [n for l in range(1, L + 1) for n in layer_names(l)]
    return names + ["W_hc", "b_c"]


def softmax_cross_entropy(S_nc, y_n):
    """``(E, P_nc)``: mean cross-entropy (a host float) and the softmax probabilities."""
    xp = array_module(S_nc)
    shifted = S_nc - S_nc.max(axis=1, keepdims=True)  # stable log-sum-exp
    log_norm_n = xp.log(xp.exp(shifted).sum(axis=1))
    N = S_nc.shape[0]
    log_p_true = shifted[xp.arange(N), y_n] - log_norm_n
    P_nc = xp.exp(shifted - log_norm_n[:, None])
    return -float(log_p_true.sum()) / N, P_nc


def logits_gradient(P_nc, y_n):
    """``G_nc = (P_nc - onehot(y)_nc) / N``: the mean cross-entropy's gradient with respect to the logits."""
    xp = array_module(P_nc)
    N = P_nc.shape[0]
    G_nc = P_nc.copy()
    G_nc[xp.arange(N), y_n] -= 1
    G_nc /= N
    return G_nc
