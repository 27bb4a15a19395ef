"""The fine-tuning step that uses the sparsity of a net whose hidden layers are all "ksparse".

Same contract and, to float rounding, the same results as the dense reference
:func:`ksae_cupy.supervised.finetune.loss_and_grads` (no dropout, no sigmoid layers): ``(loss,
grads)`` for the trainable names. Only layer 1's ``X W1`` needs every unit; after each top-k
an example is ``k_l`` kept units, ``idx_l`` (N, k_l) int32 and ``val_l`` (N, k_l), and every
later product touches only those. The softmax layer is taken as a layer that keeps all its C
classes (``idx_c``: every class in every row), so one set of loops serves it and layers 2..L.

Forward, for N examples, D inputs, H_l units in layer l, C classes:

    Z1_nh       = X_nd W1_dh + b1_h                                   N D H_1 (the one dense product)
    idx_l, val_l = top-k_l of Z_l
    Z_l[n]      = b_l + sum_j val_{l-1}[n, j] W_l[idx_{l-1}[n, j]]    N k_{l-1} H_l   (l >= 2)
    S_nc[n]     = b_c + sum_j val_L[n, j] W_hc[idx_L[n, j]]           N k_L C

Backward, with G_nc = (P_nc - onehot(y)) / N; a kept unit passes its gradient straight
through (dZ = dA there) and the others none, so only kept units carry one:

    dZ_L[n, j]     = G_n . W_hc[idx_L[n, j]]                                     N k_L C
    dZ_{l-1}[n, j] = sum_t dZ_l[n, t] W_l[idx_{l-1}[n, j], idx_l[n, t]]          N k_{l-1} k_l
    dW_hc[i]       = sum of val_L[n, j] G_n over the (n, j) that kept unit i     N k_L C
    dW_l[i, idx_l[n, t]] += val_{l-1}[n, j] dZ_l[n, t]  where idx_{l-1}[n, j] = i  N k_{l-1} k_l
    dW1_dh[:, h]   = sum of dZ_1[n, j] X_n over the (n, j) that kept unit h      N k_1 D
    db_l           = scatter-add of dZ_l into the kept units ;  db_c = sum_n G_n

Products that feed only frozen parameters are skipped, as in the dense backward.

Three ways to run it, one contract (as :mod:`ksae_cupy.sparse_step` for the autoencoder):

* NumPy with Numba: the loops of :mod:`ksae_cupy.cpu.finetune_kernels`. With
  ``defer_weight_gradient`` (the trainer's setting) each weight gradient comes back in parts
  (:class:`InputLayerGradient`, :class:`SparseOuterGradient`) that
  :class:`~ksae_cupy.momentum_sgd.MomentumSGD` applies row by row, never building the dense array;
  the update is still the full ``v <- m v - lr g; W <- W + v`` over every entry.
* NumPy without Numba (or ``KSAE_CPU_KERNELS=0``): SciPy CSR products and batched gathers.
* CuPy: not supported; the trainer takes the dense step on a GPU.

``W1_dh`` stored in Fortran order (:func:`ksae_cupy.sparse_step.sparse_layout`, what the trainer
does for this step) makes ``W1_dh.T`` the contiguous ``(H_1, D)`` array of one row per unit
that the layer-1 gradient is a scatter of rows into.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ksae_cupy.cpu import finetune_kernels
from ksae_cupy.cpu import numba_kernels as cpu_kernels
from ksae_cupy.errors import KsaeError
from ksae_cupy.sparse_step import _csr_rows, _in_layout_of
from ksae_cupy.supervised.network import layer_names, logits_gradient, param_names, softmax_cross_entropy
from ksae_cupy.topk import topk


@dataclass
class SparseCache:
    """What the sparse backward needs: the input and, per hidden layer, its kept units."""

    X_nd: object
    idx: list = field(default_factory=list)  # idx_nk (int32) of layer l = 1..L
    val: list = field(default_factory=list)  # val_nk: the kept units' values (the layer's output there)


def _check_numpy(X_nd) -> None:
    if not isinstance(X_nd, np.ndarray):
        raise KsaeError("the sparse fine-tuning step runs on NumPy arrays (the CPU) only; use step dense on a GPU")


def forward_sparse(params, X_nd, kept: list, topk_method: str = "sort"):
    """Logits ``S_nc`` and the :class:`SparseCache`; layer l keeps ``kept[l-1]`` units."""
    _check_numpy(X_nd)
    cache = SparseCache(X_nd=X_nd)
    Z_nh = X_nd @ params["W1_dh"] + params["b1_h"]  # the one dense product
    for l, k in enumerate(kept, start=1):
        if l > 1:
            w_name, b_name = layer_names(l)
            Z_nh = _sparse_rows_product(cache.idx[-1], cache.val[-1], params[w_name], params[b_name])
        idx_nk, val_nk = topk(Z_nh, k, topk_method)
        cache.idx.append(idx_nk)
        cache.val.append(val_nk)
    S_nc = _sparse_rows_product(cache.idx[-1], cache.val[-1], params["W_hc"], params["b_c"])
    return S_nc, cache


def backward_sparse(params, P_nc, y_n, cache: SparseCache, trainable, defer_weight_gradient: bool = False) -> dict:
    """Gradients of the mean cross-entropy for the ``trainable`` names only, through the kept units.

    ``defer_weight_gradient``: where the CPU kernels run, the weight gradients come back in parts
    that the momentum update applies row by row (``numpy.asarray`` builds any of them).
    """
    G_nc = logits_gradient(P_nc, y_n)
    N, C = G_nc.shape
    idx_nc = np.broadcast_to(np.arange(C, dtype=np.int32), (N, C))  # the softmax layer keeps every class
    L = len(cache.idx)
    in_parts = defer_weight_gradient and cpu_kernels.enabled()
    grads = {}
    if "W_hc" in trainable:
        grads["W_hc"] = _sparse_outer(cache.idx[L - 1], cache.val[L - 1], idx_nc, G_nc, params["W_hc"].shape,
                                      in_parts)
    if "b_c" in trainable:
        grads["b_c"] = G_nc.sum(axis=0)
    lowest = min([l for l in range(1, L + 1) if set(layer_names(l)) & set(trainable)], default=L + 1)
    if lowest > L:
        return grads
    # dZ_nk of the top layer: G W_hc^T at its kept units.
    dZ_nk = _kept_row_dots(cache.idx[L - 1], params["W_hc"], idx_nc, G_nc)
    for l in range(L, lowest - 1, -1):
        w_name, b_name = layer_names(l)
        W, idx_nk = params[w_name], cache.idx[l - 1]
        if w_name in trainable:
            if l == 1:
                grads[w_name] = _input_layer_gradient(cache.X_nd, idx_nk, dZ_nk, W, in_parts)
            else:
                grads[w_name] = _sparse_outer(cache.idx[l - 2], cache.val[l - 2], idx_nk, dZ_nk, W.shape, in_parts)
        if b_name in trainable:
            grads[b_name] = np.bincount(idx_nk.ravel(), weights=dZ_nk.ravel(), minlength=W.shape[1]).astype(W.dtype)
        if l > lowest:  # dZ of layer l-1: dZ_l W_l^T at the kept units of layer l-1
            dZ_nk = _kept_row_dots(cache.idx[l - 2], W, idx_nk, dZ_nk)
    return grads


def loss_and_grads_sparse(params, X_nd, y_n, kept, trainable=None, topk_method: str = "sort",
                          defer_weight_gradient: bool = False):
    """One forward and backward pass through the kept units: ``(loss, grads)``; ``trainable=None`` means all."""
    S_nc, cache = forward_sparse(params, X_nd, kept, topk_method)
    loss, P_nc = softmax_cross_entropy(S_nc, y_n)
    names = param_names(len(kept)) if trainable is None else trainable
    return loss, backward_sparse(params, P_nc, y_n, cache, names, defer_weight_gradient)


# -- the products, on the CPU kernels or on NumPy/SciPy ----------------------------------------

def _sparse_rows_product(idx_nk, val_nk, W_im, b_m):
    """``Zs W + b`` where row n of ``Zs`` holds ``val_nk[n]`` at ``idx_nk[n]``: ``(N, M)``."""
    if cpu_kernels.enabled():
        return finetune_kernels.sparse_rows_product(idx_nk, val_nk, W_im, b_m)
    import scipy.sparse

    return np.asarray(_csr_rows(np, scipy.sparse, idx_nk, val_nk, W_im.shape[0]) @ W_im) + b_m


def _kept_row_dots(idx_nk, W_im, idx_nt, val_nt):
    """``(Ys W^T)`` at the kept columns ``idx_nk`` only, with ``Ys`` sparse (``val_nt`` at ``idx_nt``): ``(N, k)``."""
    if cpu_kernels.enabled():
        return finetune_kernels.kept_row_dots(idx_nk, W_im, np.ascontiguousarray(idx_nt), val_nt)
    # Per example, the (k, t) block of W at its kept inputs and outputs, times its t values.
    block_nkt = W_im[idx_nk[:, :, None], idx_nt[:, None, :]]
    return np.matmul(block_nkt, val_nt[:, :, None])[:, :, 0]


def _input_layer_gradient(X_nd, idx_nk, dZ_nk, W1_dh, in_parts: bool):
    """``dW1_dh = X^T dZ`` with ``dZ`` on the kept units only, in the memory order of ``W1_dh``."""
    H = W1_dh.shape[1]
    if in_parts and W1_dh.flags.f_contiguous:
        return InputLayerGradient(X_nd, idx_nk, dZ_nk, H)
    if cpu_kernels.enabled():
        dW_hd = finetune_kernels.dense_rows_gradient(idx_nk, dZ_nk, X_nd, H)
    else:
        import scipy.sparse

        dW_hd = np.asarray(_csr_rows(np, scipy.sparse, idx_nk, dZ_nk, H).T @ X_nd)
    return _in_layout_of(W1_dh, dW_hd)


def _sparse_outer(idx_nk, val_nk, idx_nt, dZ_nt, shape, in_parts: bool):
    """``dW_im = A^T dZ`` with ``A`` kept as ``(idx_nk, val_nk)`` and ``dZ`` as ``(idx_nt, dZ_nt)``."""
    if in_parts:
        return SparseOuterGradient(idx_nk, val_nk, idx_nt, dZ_nt, shape)
    if cpu_kernels.enabled():
        return finetune_kernels.sparse_rows_gradient(idx_nk, val_nk, np.ascontiguousarray(idx_nt), dZ_nt, shape)
    import scipy.sparse

    A = _csr_rows(np, scipy.sparse, idx_nk, val_nk, shape[0])
    dZ = _csr_rows(np, scipy.sparse, np.ascontiguousarray(idx_nt), dZ_nt, shape[1])
    return (A.T @ dZ).toarray()


# -- weight gradients kept in parts, for the row-by-row momentum update -----------------------

class InputLayerGradient:
    """``dW1_dh`` kept as its parts: column ``h`` (unit h) is the sum of ``dZ_nk[n, j] X_n`` over the
    ``(n, j)`` with ``idx_nk[n, j] = h``.

    The momentum update applies it row by row of ``W1_dh.T`` (Fortran-ordered ``W1_dh``);
    ``numpy.asarray`` builds the dense ``(D, H)`` gradient for anything else.
    """

    def __init__(self, X_nd, idx_nk, dZ_nk, H: int):
        self.X_nd, self.idx_nk, self.dZ_nk = X_nd, idx_nk, dZ_nk
        self.shape = (X_nd.shape[1], H)
        self.dtype = X_nd.dtype

    def __array__(self, dtype=None, copy=None):
        dW_hd = finetune_kernels.dense_rows_gradient(self.idx_nk, self.dZ_nk, self.X_nd, self.shape[1])
        return dW_hd.T if dtype is None else dW_hd.T.astype(dtype)

    def momentum_update(self, W_dh, V_dh, momentum: float, lr: float) -> bool:
        """``V <- m V - lr dW; W <- W + V`` over every entry, in place; False (nothing done) unless
        both are Fortran-ordered (their transposes then hold one row per unit) and of its dtype."""
        if not (W_dh.flags.f_contiguous and V_dh.flags.f_contiguous and W_dh.dtype == V_dh.dtype == self.dtype):
            return False
        finetune_kernels.momentum_update_dense_rows(W_dh.T, V_dh.T, self.idx_nk, self.dZ_nk, self.X_nd,
                                                    momentum, lr)
        return True


class SparseOuterGradient:
    """``dW_im = A^T dZ`` kept as its parts, both factors sparse: row ``i`` gets ``val_nk[n, j]``
    times the sparse row ``(idx_nt[n], dZ_nt[n])`` for each ``(n, j)`` with ``idx_nk[n, j] = i``.

    The momentum update applies it row by row of a C-ordered ``W_im``; ``numpy.asarray`` builds it.
    """

    def __init__(self, idx_nk, val_nk, idx_nt, dZ_nt, shape):
        self.idx_nk, self.val_nk = idx_nk, val_nk
        self.idx_nt, self.dZ_nt = np.ascontiguousarray(idx_nt), dZ_nt
        self.shape = tuple(shape)
        self.dtype = dZ_nt.dtype

    def __array__(self, dtype=None, copy=None):
        dW_im = finetune_kernels.sparse_rows_gradient(self.idx_nk, self.val_nk, self.idx_nt, self.dZ_nt, self.shape)
        return dW_im if dtype is None else dW_im.astype(dtype)

    def momentum_update(self, W_im, V_im, momentum: float, lr: float) -> bool:
        """``V <- m V - lr dW; W <- W + V`` over every entry, in place; False (nothing done) unless
        both are C-ordered and of its dtype."""
        if not (W_im.flags.c_contiguous and V_im.flags.c_contiguous and W_im.dtype == V_im.dtype == self.dtype):
            return False
        finetune_kernels.momentum_update_sparse_rows(W_im, V_im, self.idx_nk, self.val_nk, self.idx_nt, self.dZ_nt,
                                                     momentum, lr)
        return True
