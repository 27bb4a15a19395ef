"""The auxiliary loss (AuxK, beyond the paper) as parts of the captured GPU step.

The arithmetic of :func:`ksae_cupy.model.auxk_loss_and_grads`, on fixed buffers so that the parts
between its three matrix products are captured as CUDA graphs with the rest of the step
(:mod:`ksae_cupy.gpu.graph_step`). One difference of form: a graph cannot hold a count read from
the device, so instead of the top ``min(aux_k, dead units)`` of the dead units' columns it takes the
top ``aux_k`` of the whole row with every live unit set to the dtype's lowest value, then zeroes
what it took from live units. Where ``aux_k`` or more units are dead the two select the same units
(ties to the lower column either way); where fewer are dead both keep every dead unit; where none
is, the gradients are zero and the batch's auxiliary loss is counted as 0, as the reference returns.
"""
from __future__ import annotations

import numpy as np

from ksae_cupy.gpu.cuda_kernels import mask_rows_gpu, topk_gpu
from ksae_cupy.gpu.products import add_sum_squares_gpu, kept_dot_gpu, sparse_decode_gpu


class AuxKParts:
    """The AuxK parts of one :class:`~ksae_cupy.gpu.graph_step.GraphStep` (``step``): its buffers and,
    in :meth:`parts`, the order they run in after the main loss; :meth:`add_gradients` adds its
    gradients to the step's."""

    def __init__(self, step, aux_k: int, aux_coef: float, dead_window: int):
        cp, W_dh, B = step.cupy, step.params["W_dh"], step.B
        (D, H), dtype = W_dh.shape, W_dh.dtype
        self.step, self.aux_k, self.dead_window = step, aux_k, dead_window
        self.coef_over_B = dtype.type(aux_coef / B)  # Ra *= aux_coef / N, in the data's float type (as the reference)
        self.half_coef_over_B = float(aux_coef) * 0.5 / B
        self.lowest = dtype.type(np.finfo(dtype).min)
        self.dead_h = cp.empty(H, dtype=np.bool_)
        self.deadf_h = cp.empty(H, dtype=dtype)  # 1 where dead, 0 where live
        self.floor_h = cp.empty(H, dtype=dtype)  # 0 where dead, the lowest value where live
        self.Zm_bh = cp.empty((B, H), dtype=dtype)  # Z with the live units at the lowest value
        self.idx_ba = cp.empty((B, aux_k), dtype=np.int32)
        self.val_ba = cp.empty((B, aux_k), dtype=dtype)
        # [X; Ra] and [dZa; Za] stacked: its weight gradient is one product, as the main one.
        self.XRa_2bd = cp.empty((2 * B, D), dtype=dtype)
        self.Xa_bd, self.Ra_bd = self.XRa_2bd[:B], self.XRa_2bd[B:]
        self.DZa_2bh = cp.empty((2 * B, H), dtype=dtype)
        self.dZa_bh, self.Za_bh = self.DZa_2bh[:B], self.DZa_2bh[B:]
        self.dZaf_bh = cp.empty((B, H), dtype=dtype)  # Ra W at every unit, before the mask
        self.NR_bd = cp.empty((B, D), dtype=dtype)
        self.sq_bd = cp.empty((B, D), dtype=dtype)
        self.aux_b = cp.empty((), dtype=np.float64)
        self.n_dead = cp.empty((), dtype=dtype)
        self.any_dead = cp.empty((), dtype=np.bool_)
        self.gW_dh = cp.empty((D, H), dtype=dtype)
        self.gb_h = cp.empty(H, dtype=dtype)
        self.positive_bh = cp.empty((B, H), dtype=np.bool_) if step.relu else None

    def parts(self):
        """``(captured, function)`` in order; the three products uncaptured where they are cuBLAS."""
        return ((True, self._select_dead), (False, self._decode), (True, self._residual), (True, self._loss),
                (False, self._back_through_W), (True, self._mask_to_selected), (False, self._weight_gradient))

    def _select_dead(self):
        """The units dead now (no example kept them in the last ``dead_window``); the top ``aux_k`` of each
        row among them (``Za``: their pre-activations in place, zeros elsewhere and at live units taken)."""
        cp, s = self.step.cupy, self.step
        cp.greater_equal(s.counters.since_kept_h, self.dead_window, out=self.dead_h)
        cp.multiply(self.dead_h, 1, out=self.deadf_h)
        cp.subtract(1, self.deadf_h, out=self.floor_h)
        cp.multiply(self.floor_h, self.lowest, out=self.floor_h)
        cp.multiply(s.Z_bh, self.deadf_h, out=self.Zm_bh)
        cp.add(self.Zm_bh, self.floor_h, out=self.Zm_bh)
        topk_gpu(self.Zm_bh, self.aux_k, s.topk_method, dense=True, out=(self.idx_ba, self.val_ba, self.Za_bh))
        cp.multiply(self.Za_bh, self.deadf_h, out=self.Za_bh)
        if s.relu:
            cp.maximum(self.Za_bh, 0, out=self.Za_bh)
        cp.copyto(self.Xa_bd, s.X_bd)

    def _decode(self):
        """``Ra = Za W^T`` (kernel products: from the selected units only, on the step's W transposed)."""
        if self.step.kernel_products:
            sparse_decode_gpu(self.Za_bh, self.idx_ba, self.step.WT_hd, self.Ra_bd)
        else:
            self.step.matmul(self.Za_bh, self.step.params["W_dh"].T, out=self.Ra_bd)

    def _residual(self):
        """``Ra = Za W^T + N R = ehat - e`` (the main residual ``e = -N R`` held constant)."""
        cp, s = self.step.cupy, self.step
        cp.multiply(s.R_bd, s.R_bd.dtype.type(s.B), out=self.NR_bd)
        cp.add(self.Ra_bd, self.NR_bd, out=self.Ra_bd)

    def _loss(self):
        """The batch's ``aux_coef 0.5 / N sum Ra^2`` (0 when no unit is dead) added to the epoch's; then
        ``Ra *= aux_coef / N``."""
        cp, c = self.step.cupy, self.step.counters
        if self.step.kernel_products:  # one kernel of ours (no allocation), the dead units as its gate
            add_sum_squares_gpu(self.Ra_bd, self.half_coef_over_B, c.aux_sum, gate=self.deadf_h)
            cp.multiply(self.Ra_bd, self.coef_over_B, out=self.Ra_bd)
            return
        cp.multiply(self.Ra_bd, self.Ra_bd, out=self.sq_bd)
        cp.sum(self.sq_bd, dtype=np.float64, out=self.aux_b)
        cp.multiply(self.aux_b, self.half_coef_over_B, out=self.aux_b)
        cp.sum(self.deadf_h, out=self.n_dead)
        cp.greater(self.n_dead, 0, out=self.any_dead)
        cp.multiply(self.aux_b, self.any_dead, out=self.aux_b)
        cp.add(c.aux_sum, self.aux_b, out=c.aux_sum)
        cp.multiply(self.Ra_bd, self.coef_over_B, out=self.Ra_bd)

    def _back_through_W(self):
        """``Ra W`` (kernel products: at the selected units only, straight into ``dZa``)."""
        if self.step.kernel_products:
            kept_dot_gpu(self.Ra_bd, self.idx_ba, self.step.WT_hd, self.dZa_bh)
        else:
            self.step.matmul(self.Ra_bd, self.step.params["W_dh"], out=self.dZaf_bh)

    def _mask_to_selected(self):
        """``dZa``: ``Ra W`` at the selected dead units, zeros elsewhere."""
        if not self.step.kernel_products:  # (the kernel products wrote dZa at the selected units only)
            mask_rows_gpu(self.dZaf_bh, self.idx_ba, out=self.dZa_bh)
        self.step.cupy.multiply(self.dZa_bh, self.deadf_h, out=self.dZa_bh)
        if self.step.relu:  # a selected unit clipped to zero passes no gradient
            self.step.cupy.greater(self.Za_bh, 0, out=self.positive_bh)
            self.step.cupy.multiply(self.dZa_bh, self.positive_bh, out=self.dZa_bh)

    def _weight_gradient(self):
        """``dW_aux = [X; Ra]^T [dZa; Za]``."""
        self.step.matmul(self.XRa_2bd.T, self.DZa_2bh, out=self.gW_dh)

    def add_gradients(self):
        """The auxiliary loss's gradients added to the main loss's (``c`` gets none)."""
        cp, g = self.step.cupy, self.step.grads
        cp.sum(self.dZa_bh, axis=0, out=self.gb_h)
        cp.add(g["W_dh"], self.gW_dh, out=g["W_dh"])
        cp.add(g["b_h"], self.gb_h, out=g["b_h"])
