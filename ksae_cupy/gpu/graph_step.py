"""The trainer's step on a GPU, captured as CUDA graphs and replayed for every batch.

Why: on MNIST's shapes (a batch of 128 x 784, 1000 units) a step is microseconds of GPU work but
about 35 array operations, each a Python call and a kernel launch, and the generic step reads its
loss back to the host after every batch. On an H100 that made the trainer launch-bound, about
2 s per epoch (``results/benchmarks/gpu-campaign-2026-11-25``). Here every operation
writes into buffers allocated once, so the operations between the step's four matrix products
(gather the batch's rows, bias, top-k, residual, loss, mask, bias gradients, momentum update,
dead-unit counts) are captured once, part by part, as CUDA graphs and replayed per batch: on an H100
with CuPy 14, 4 products, 7 graphs and the 5 operations of the loss's part (whose sum allocates)
a step instead of about 35 operations, and the host waits on the GPU once per epoch. The products
stay outside the graphs because CuPy refuses cuBLAS calls during capture. With ``products="kernels"``
(our product kernels, :mod:`ksae_cupy.gpu.products`) every part can be captured: the trainer's default
on a GPU, :mod:`ksae_cupy.gpu.graph_epoch`, captures a whole epoch of these steps as one graph; the step
graphs here are kept to compare (``Trainer.gpu_epoch_graph = False``).

The arithmetic is :func:`ksae_cupy.model.loss_and_grads` followed by :class:`~ksae_cupy.momentum_sgd.MomentumSGD`
(linear or ReLU units, with AuxK's parts when asked, :mod:`ksae_cupy.gpu.graph_auxk`), with the top-k kernel
writing the dense sparse code itself and one mask kernel for the gradient through the kept units. Results
agree with the generic step to float32 rounding (``tests/gpu/test_graph_step.py``).

Nothing allocates while a graph is captured (every operation has its ``out``): a block the memory
pool handed out during capture would be shared by the graph with whatever later reused it. On real
CuPy a memory hook counts the pool's allocations during capture and, if there were any, the graph
is dropped and the step runs uncaptured (said once on stderr); the CuPy stand-in of the tests refuses
any allocation during capture outright.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from ksae_cupy.gpu.cuda_kernels import mask_rows_gpu, topk_gpu
from ksae_cupy.gpu.graph_auxk import AuxKParts
from ksae_cupy.gpu.products import add_sum_squares_gpu, kept_dot_gpu, matmul_gpu, sparse_decode_gpu, split_workspace


@dataclass
class EpochCounters:
    """What the steps of one epoch add up on the device, read back once at its end.

    ``loss_sum``: 0-d float64, the sum over batches of each batch's mean ``0.5 ||xhat - x||^2``;
    ``aux_sum``: 0-d float64, the same of the auxiliary loss (with AuxK; this session's batches only);
    ``kept_count_h``: float32, per unit, the examples that kept it this epoch;
    ``since_kept_h``: int64, the trainer's per-unit count of examples since one last kept it (updated in place).
    """

    loss_sum: object
    aux_sum: object
    kept_count_h: object
    since_kept_h: object

    @classmethod
    def zeros(cls, cupy, H: int, since_kept_h):
        return cls(cupy.zeros((), dtype=np.float64), cupy.zeros((), dtype=np.float64), cupy.zeros(H, dtype=np.float32),
                   since_kept_h)

    def start_epoch(self, loss_so_far: float) -> None:
        """Zero the epoch's counts; ``loss_so_far`` is the loss summed before an interruption, if resumed."""
        self.loss_sum.fill(loss_so_far)
        self.aux_sum.fill(0)
        self.kept_count_h.fill(0)


class GraphStep:
    """One training step of ``batch_size`` rows at ``k`` on fixed buffers, replayed as a CUDA graph.

    ``params`` and ``velocities`` (dicts of ``W_dh`` C-contiguous, ``b_h``, ``c_d``) are updated in
    place; ``X_train_nd`` is the device-resident training set whose rows :meth:`run` gathers.
    ``products``: ``"cublas"`` (CuPy's matmul and sums: the parts between the products are captured)
    or ``"kernels"`` (the products and the losses' sums as our kernels, :mod:`ksae_cupy.gpu.products`,
    the two with the sparse code from its kept units only: every part can be captured, which
    :mod:`ksae_cupy.gpu.graph_epoch` does for a whole epoch).
    """

    def __init__(self, cupy, params, velocities, X_train_nd, batch_size: int, k: int, topk_method: str,
                 lr: float, momentum: float, counters: EpochCounters, stream, capture: bool = True,
                 auxk: tuple | None = None, activation: str = "linear", products: str = "cublas"):
        if products not in ("cublas", "kernels"):
            raise ValueError(f"products {products!r}: use 'cublas' or 'kernels'")
        self.kernel_products = products == "kernels"
        W_dh = params["W_dh"]
        if not W_dh.flags.c_contiguous:
            raise ValueError("GraphStep needs W_dh C-contiguous (the trainer stores it so on a GPU)")
        self.cupy, self.params, self.velocities, self.X_train_nd = cupy, params, velocities, X_train_nd
        self.B, self.k, self.topk_method, self.counters, self.stream = batch_size, k, topk_method, counters, stream
        dtype = W_dh.dtype
        self.lr, self.momentum = dtype.type(lr), dtype.type(momentum)  # the parameters' float type, as MomentumSGD
        self.smallest_normal = dtype.type(np.finfo(dtype).tiny)  # below it: denormals, flushed by the update
        (D, H), B = W_dh.shape, batch_size
        empty = cupy.empty
        self.rows_b = cupy.zeros(B, dtype=np.int64)  # the batch's rows of X_train_nd, set before each replay
        # [X; R] and [dZ; Zs] stacked: the weight gradient is one product, as in model.backward.
        self.XR_2bd = empty((2 * B, D), dtype=dtype)
        self.X_bd, self.R_bd = self.XR_2bd[:B], self.XR_2bd[B:]
        self.DZ_2bh = empty((2 * B, H), dtype=dtype)
        self.dZ_bh, self.Zs_bh = self.DZ_2bh[:B], self.DZ_2bh[B:]
        self.Z_bh = empty((B, H), dtype=dtype)
        self.dZs_bh = empty((B, H), dtype=dtype)
        self.idx_bk = empty((B, k), dtype=np.int32)
        self.val_bk = empty((B, k), dtype=dtype)
        self.sq_bd = empty((B, D), dtype=dtype)
        self.loss_b = empty((), dtype=np.float64)
        self.ones_bh = cupy.ones((B, H), dtype=dtype)
        self.kept_bh = empty((B, H), dtype=dtype)
        self.kept_b_h = empty(H, dtype=dtype)
        self.not_kept_h = empty(H, dtype=np.bool_)
        self.relu = activation == "relu"  # kept values clipped at 0; a kept unit at 0 passes no gradient
        self.positive_bh = empty((B, H), dtype=np.bool_) if self.relu else None
        self.grads = {name: empty(value.shape, dtype=value.dtype) for name, value in params.items()}
        # Kernel products: W transposed, once per step, for the two sparse products (a unit's weights in one row).
        self.WT_hd = empty((H, D), dtype=dtype) if self.kernel_products else None
        # Kernel products: room for the dense products' splits along K where their tiles alone would not fill the
        # GPU (the encoder X W at a batch of 128); one buffer, the products run one after another.
        spaces = [split_workspace(cupy, B, H, D, dtype), split_workspace(cupy, D, H, 2 * B, dtype)] \
            if self.kernel_products else []
        self.gemm_workspace = max((w for w in spaces if w is not None), key=lambda w: w.size, default=None)
        # With AuxK, ``auxk = (aux_k, aux_coef, dead_window)``: its parts (ksae_cupy.gpu.graph_auxk).
        self.auxk = None if auxk is None else AuxKParts(self, *auxk)
        self.graphs = None  # {part name: CUDA graph} once captured (the parts that allocate left out)
        self._capture_wanted = capture
        self._ran = False

    def run(self, rows_b) -> None:
        """One step on the rows ``rows_b`` (a device int64 array of length ``batch_size``), queued on
        :attr:`stream`. The first call runs the operations one by one (kernels compile, cuBLAS sets up);
        the second captures the parts between the products and every later call replays them."""
        with self.stream:
            self.rows_b[...] = rows_b
            if self.graphs is None and self._ran and self._capture_wanted:
                self.graphs = self._capture()
            for captured, part in self._parts():
                graph = self.graphs.get(part.__qualname__) if captured and self.graphs else None
                if graph is not None:
                    graph.launch(self.stream)
                else:
                    part()
        self._ran = True

    def _parts(self):
        """The step in order, as ``(captured, function)``: CuPy refuses cuBLAS calls during stream capture
        ("calling cuBLAS API during stream capture is currently unsupported"), so the four products are
        launched as they come and each part between them is replayed as a graph of its own."""
        forward = ((True, self._gather), (False, self._encode), (True, self._select), (False, self._decode),
                   (True, self._residual), (True, self._batch_loss))
        backward = ((False, self._back_through_W), (True, self._mask_to_kept), (False, self._weight_gradient),
                    (True, self._bias_gradients))
        update = ((True, self._momentum_update), (True, self._count_kept))
        if self.auxk is None:
            return forward + backward + update
        return forward + self.auxk.parts() + backward + ((True, self.auxk.add_gradients),) + update

    def _capture(self) -> dict:
        """``{part name: graph}``; a part during whose capture the memory pool allocated is left out (it
        runs uncaptured: the graph would share that block with whatever later reused it)."""
        graphs, uncaptured = {}, []
        for captured, part in self._parts():
            if not captured:
                continue
            with _PoolAllocations(self.cupy) as allocations:
                self.stream.begin_capture()
                try:
                    part()
                finally:
                    graph = self.stream.end_capture()
            if allocations.count:
                uncaptured.append(part.__qualname__)
            else:
                graphs[part.__qualname__] = graph
        _say_uncaptured_once(uncaptured)
        return graphs

    # The parts of one step, each into its buffers (none allocates). Arithmetic: model.loss_and_grads, then
    # optim.momentum_update.
    def parts_after_gather(self) -> list:
        """The step's parts after the batch's rows are gathered (:mod:`ksae_cupy.gpu.graph_epoch` gathers
        each batch of an epoch from its own slice of the epoch's order, :meth:`gather_rows`)."""
        parts = [part for _, part in self._parts()]
        assert parts[0] == self._gather
        return parts[1:]

    def matmul(self, a, b, out) -> None:
        """``out = a @ b``: cuBLAS through CuPy, or with kernel products our GEMM (capturable)."""
        if self.kernel_products:
            matmul_gpu(a, b, out, self.gemm_workspace)
        else:
            self.cupy.matmul(a, b, out=out)

    def _gather(self):
        """The batch's rows of the training set."""
        self.gather_rows(self.rows_b)

    def gather_rows(self, rows_b) -> None:
        """``X_bd``: the rows ``rows_b`` (a device int64 array of length ``batch_size``) of the training set."""
        self.cupy.take(self.X_train_nd, rows_b, axis=0, out=self.X_bd)

    def _encode(self):
        """``Z = X W`` (cuBLAS or our GEMM, as all four products)."""
        self.matmul(self.X_bd, self.params["W_dh"], out=self.Z_bh)

    def _select(self):
        """``Z += b``; the k largest of each row (``Zs``: the kept values in place, zeros elsewhere)."""
        self.cupy.add(self.Z_bh, self.params["b_h"], out=self.Z_bh)
        topk_gpu(self.Z_bh, self.k, self.topk_method, dense=True, out=(self.idx_bk, self.val_bk, self.Zs_bh))
        if self.relu:
            self.cupy.maximum(self.Zs_bh, 0, out=self.Zs_bh)

    def _decode(self):
        """``R = Zs W^T`` (kernel products: W transposed for this step, then from the kept units only)."""
        if self.kernel_products:
            self.cupy.copyto(self.WT_hd, self.params["W_dh"].T)
            sparse_decode_gpu(self.Zs_bh, self.idx_bk, self.WT_hd, self.R_bd)
        else:
            self.matmul(self.Zs_bh, self.params["W_dh"].T, out=self.R_bd)

    def _residual(self):
        """``R = Zs W^T + c - x``."""
        self.cupy.add(self.R_bd, self.params["c_d"], out=self.R_bd)
        self.cupy.subtract(self.R_bd, self.X_bd, out=self.R_bd)

    def _batch_loss(self):
        """The batch's loss ``0.5 / B sum R^2`` added to the epoch's; then ``R /= B`` (dE/dxhat)."""
        cp, c, B = self.cupy, self.counters, self.B
        if self.kernel_products:  # one kernel of ours: CuPy's full sum may allocate (CUB), a capture must not
            add_sum_squares_gpu(self.R_bd, 0.5 / B, c.loss_sum)
        else:
            cp.multiply(self.R_bd, self.R_bd, out=self.sq_bd)
            cp.sum(self.sq_bd, dtype=np.float64, out=self.loss_b)
            cp.multiply(self.loss_b, 0.5 / B, out=self.loss_b)
            cp.add(c.loss_sum, self.loss_b, out=c.loss_sum)
        cp.true_divide(self.R_bd, B, out=self.R_bd)

    def _back_through_W(self):
        """``R W``: the gradient at every unit, before the mask (kernel products: at the kept units only,
        straight into ``dZ``)."""
        if self.kernel_products:
            kept_dot_gpu(self.R_bd, self.idx_bk, self.WT_hd, self.dZ_bh)
        else:
            self.matmul(self.R_bd, self.params["W_dh"], out=self.dZs_bh)

    def _mask_to_kept(self):
        """``dZ``: ``R W`` at the kept units, zeros elsewhere (the gradient passes the kept units only)."""
        if not self.kernel_products:  # (the kernel products wrote dZ at the kept units only)
            mask_rows_gpu(self.dZs_bh, self.idx_bk, out=self.dZ_bh)
        if self.relu:
            self.cupy.greater(self.Zs_bh, 0, out=self.positive_bh)
            self.cupy.multiply(self.dZ_bh, self.positive_bh, out=self.dZ_bh)

    def _weight_gradient(self):
        """``dW = [X; R]^T [dZ; Zs] = X^T dZ + R^T Zs`` (one product for both uses of W)."""
        self.matmul(self.XR_2bd.T, self.DZ_2bh, out=self.grads["W_dh"])

    def _bias_gradients(self):
        """``db = sum_n dZ``, ``dc = sum_n R``."""
        self.cupy.sum(self.dZ_bh, axis=0, out=self.grads["b_h"])
        self.cupy.sum(self.R_bd, axis=0, out=self.grads["c_d"])

    def _momentum_update(self):
        """``v <- m v - lr g; theta <- theta + v`` for every parameter (``lr g`` into ``g``, a scratch), the
        denormals of ``v`` and ``theta`` flushed to zero as :func:`ksae_cupy.momentum_sgd.momentum_update` does."""
        cp = self.cupy
        for name, theta in self.params.items():
            v, grad = self.velocities[name], self.grads[name]
            cp.multiply(v, self.momentum, out=v)
            cp.multiply(grad, self.lr, out=grad)
            cp.subtract(v, grad, out=v)
            self._flush_denormals(v, grad)
            cp.add(theta, v, out=theta)
            self._flush_denormals(theta, grad)

    def _flush_denormals(self, a, scratch):
        """``a`` times (``|a| >= tiny``), in place, through ``scratch`` (no allocation, so it can be captured):
        a denormal becomes a zero (of its sign; the CPU's flush gives +0)."""
        cp = self.cupy
        cp.absolute(a, out=scratch)
        cp.greater_equal(scratch, self.smallest_normal, out=scratch)
        cp.multiply(a, scratch, out=a)

    def _count_kept(self):
        """Dead units: the mask kernel on ones marks the units each example kept; summed per unit, added to
        the epoch's counts; the examples since a unit was last kept reset where the batch kept it."""
        cp, c = self.cupy, self.counters
        mask_rows_gpu(self.ones_bh, self.idx_bk, out=self.kept_bh)
        cp.sum(self.kept_bh, axis=0, out=self.kept_b_h)
        cp.add(c.kept_count_h, self.kept_b_h, out=c.kept_count_h)
        cp.add(c.since_kept_h, self.B, out=c.since_kept_h)
        cp.equal(self.kept_b_h, 0, out=self.not_kept_h)
        cp.multiply(c.since_kept_h, self.not_kept_h, out=c.since_kept_h)


_SAID_UNCAPTURED: set = set()


def _say_uncaptured_once(names: list) -> None:
    """One stderr line per process for the parts that could not be captured (the step is right, slower)."""
    new = [name for name in names if name not in _SAID_UNCAPTURED]
    if new:
        _SAID_UNCAPTURED.update(new)
        print(f"note: the GPU step's part(s) {', '.join(new)} allocated memory while being captured as CUDA "
              f"graphs; they run uncaptured", file=sys.stderr)


class _PoolAllocations:
    """Counts the memory pool's allocations inside the ``with`` (CuPy's memory hooks); counts none where
    the module has no hooks (the tests' stand-in, which refuses an allocation during capture itself)."""

    def __init__(self, cupy):
        self.count = 0
        hooks = getattr(getattr(cupy, "cuda", None), "memory_hook", None)
        self._hook = None
        if hooks is not None:
            outer = self

            class Counter(hooks.MemoryHook):
                name = "ksae_capture_allocations"

                def malloc_preprocess(self, **kwargs):
                    outer.count += 1

            self._hook = Counter()

    def __enter__(self):
        if self._hook is not None:
            self._hook.__enter__()
        return self

    def __exit__(self, *exc):
        if self._hook is not None:
            self._hook.__exit__(*exc)
        return False


def graph_step_applies(config) -> bool:
    """Whether a single-process trainer with ``config`` on a GPU takes the captured step: every
    activation and AuxK setting it knows (linear and ReLU units; the generic step covers others)."""
    return config.activation in ("linear", "relu")


class CountersRead:
    """The epoch's device counters read back by a captured path (its ``stream`` and ``counters``), each read
    waiting for the work queued on the stream."""

    def loss_sum(self) -> float:
        """The epoch's summed batch losses so far."""
        self.stream.synchronize()
        return float(self.counters.loss_sum)

    def aux_loss_sum(self) -> float:
        """The epoch's summed auxiliary losses (this session's batches)."""
        self.stream.synchronize()
        return float(self.counters.aux_sum)

    def kept_count_h(self):
        """Per unit, the examples that kept it this epoch (a device array)."""
        self.stream.synchronize()
        return self.counters.kept_count_h


class CapturedEpochs(CountersRead):
    """A trainer's captured steps: one :class:`GraphStep` per batch size (the last batch of an epoch
    may be smaller), rebuilt when k or the training array changes, and the epoch's counters."""

    runs_whole_epochs = False  # a call per step (ksae_cupy.gpu.graph_epoch runs whole epochs)

    def __init__(self, cupy, params, velocities, since_kept_h, config):
        self.cupy, self.params, self.velocities, self.config = cupy, params, velocities, config
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.counters = EpochCounters.zeros(cupy, params["b_h"].shape[0], since_kept_h)
        self._steps, self._key = {}, None

    def begin(self, X_train_nd, k: int, loss_so_far: float) -> None:
        """Start (or, resumed mid-epoch, continue) an epoch at ``k`` on ``X_train_nd``."""
        key = (k, int(X_train_nd.data.ptr), tuple(X_train_nd.shape))
        if key != self._key:  # a graph holds k and the array's address: capture anew
            self._steps, self._key = {}, key
        # The work queued on the default stream (parameters loaded, the batch order copied in) comes first.
        self.cupy.cuda.Device().synchronize()
        with self.stream:
            self.counters.start_epoch(loss_so_far)

    def run(self, X_train_nd, rows_b) -> None:
        """One step on the rows ``rows_b`` of ``X_train_nd`` (queued; nothing is read back)."""
        B = int(rows_b.shape[0])
        step = self._steps.get(B)
        if step is None:
            cfg = self.config
            auxk = (cfg.aux_k, cfg.aux_coef, cfg.dead_window) if cfg.aux_k else None
            with self.stream:  # its buffers' fills queued where its steps run
                step = self._steps[B] = GraphStep(self.cupy, self.params, self.velocities, X_train_nd, B,
                                                  self._key[0], cfg.topk, cfg.lr, cfg.momentum, self.counters,
                                                  self.stream, auxk=auxk, activation=cfg.activation)
        step.run(rows_b)

