"""The trainer's epoch on a GPU as one CUDA graph: every step of it replayed with no host work per step.

Why: :mod:`ksae_cupy.gpu.graph_step` captures the parts between a step's four matrix products, so
each of an MNIST epoch's 469 steps still goes through the host (4 cuBLAS calls and about 8 graph
launches from Python per step; on an H200 0.111 s an epoch, PyTorch's step captured whole 0.081 s).
Here the products and the losses' sums are kernels of ours (:mod:`ksae_cupy.gpu.products`, which
says why not cuBLAS), so nothing in a step stops a capture, and the whole epoch is captured once as
one graph: for each batch, its rows gathered from its slice of the epoch's order, the step's parts
(:class:`~ksae_cupy.gpu.graph_step.GraphStep`, with AuxK's and ReLU's parts when asked), the
momentum update and the loss and dead-unit counts, all on the device. The host launches the graph
and reads the epoch's counters back once, at its end.

The epoch's order is drawn on the device too, first in the graph (:mod:`ksae_cupy.gpu.shuffle`):
NumPy's own ``Generator.permutation`` run by a kernel from the trainer's generator state, so a GPU
run still sees the very batches a CPU run of the same seed sees, and the state it leaves is NumPy's.
What stays on the host, once per epoch: six words of generator state copied in, one graph launch,
and at the end the counters, the state and the order read back (the order for a checkpoint taken
before the epoch is counted). With ``order_on_device=False`` the trainer draws the order on the
host and it is copied in (the way to compare, and what a resumed epoch does: its checkpointed
order is replayed from the batch it stopped at).

How it changes with the run:

* **k** (the sparsity schedule) changes between epochs: the graph holds k in its top-k launches,
  so a new k (or another training array) means new step buffers and a new capture at once (the
  kernels are the same: they compiled in the first epoch).
* **The first epoch** on a trainer runs the same parts one by one, uncaptured: kernels compile and
  CUDA loads its modules (lazily, since CUDA 12) outside any capture. Captures begin once every
  batch size the epoch needs (the last batch may be smaller) has run once.
* **A resume mid-epoch** at batch b runs the rest of that epoch from batch b of its checkpointed
  order (uncaptured: it is the trainer's first epoch; and the next, the first whose order the device
  draws, too); a capture from batch b, were one needed, would be keyed by b.
* **Stop requests and progress** act per epoch: the trainer calls ``on_batch`` once, with the
  epoch done, and honours a stop request at the epoch's end.

Results equal the step graphs' (and the CPU trainer's) to float32 rounding: the same arithmetic,
with the products summed in another order (``tests/gpu/test_graph_epoch.py``). On real CuPy the
memory pool's allocations are counted during the capture (a block the pool handed out would be
shared by the graph with whatever reused it later); if any happened, the epoch runs its parts one
by one instead, and says so once on stderr.
"""
from __future__ import annotations

import sys

import numpy as np

from ksae_cupy.gpu.graph_step import CountersRead, EpochCounters, GraphStep, _PoolAllocations
from ksae_cupy.gpu.shuffle import permutation_gpu, state_from_words, state_words


class EpochGraph(CountersRead):
    """A trainer's epochs on a GPU, each launched as one captured graph.

    The interface of :class:`~ksae_cupy.gpu.graph_step.CapturedEpochs` (``begin``, the counters'
    reads) with :meth:`run_epoch` in place of a call per step. ``launches`` and ``captures`` count
    the graphs launched and captured (the tests read them). ``order_on_device``: whether a fresh epoch's
    order is drawn in its graph (:attr:`draws_orders`).
    """

    runs_whole_epochs = True

    def __init__(self, cupy, params, velocities, since_kept_h, config, capture: bool = True,
                 order_on_device: bool = True):
        self.cupy, self.params, self.velocities, self.config = cupy, params, velocities, config
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.counters = EpochCounters.zeros(cupy, params["b_h"].shape[0], since_kept_h)
        self.loss_before_last_batch = cupy.zeros((), dtype=np.float64)
        self._capture_wanted = capture
        self.draws_orders = order_on_device
        self._words = cupy.zeros(6, dtype=np.int64)  # the generator's state, in and out of the drawn order
        self._steps: dict[int, GraphStep] = {}  # batch size -> its step's buffers and parts
        self._warm: set = set()  # batch sizes whose parts ran once uncaptured (and "drawn order": the draw did)
        self._graphs: dict[tuple, object] = {}  # (first batch, order drawn in it) -> the graph of the epoch from it
        self._key = None  # (k, the training array's address and shape): what the graphs hold
        self._order_n = None  # the epoch's order, read by the graph
        self.launches = self.captures = 0

    def begin(self, X_train_nd, k: int, loss_so_far: float) -> None:
        """Start (or, resumed mid-epoch, continue) an epoch at ``k`` on ``X_train_nd``."""
        key = (k, int(X_train_nd.data.ptr), tuple(X_train_nd.shape))
        if key != self._key:  # the steps' buffers and the graphs hold k and the array (the kernels stay warm)
            self._steps, self._graphs, self._key = {}, {}, key
        # The work queued on the default stream (parameters loaded, the order copied in) comes first.
        self.cupy.cuda.Device().synchronize()
        with self.stream:
            self.counters.start_epoch(loss_so_far)

    def run_epoch(self, X_train_nd, order_n, first_batch: int, batch_size: int, rng_state: dict | None = None) -> None:
        """Queue the epoch's batches ``first_batch ..`` on the rows ``order_n`` (a device int64 array,
        the epoch's order) of ``X_train_nd``: one graph launch, or the parts one by one while warming up.
        ``order_n`` None: a fresh epoch whose order the device draws from ``rng_state`` (a PCG64
        ``bit_generator.state``); :meth:`drawn_order` then gives it and the state after it."""
        N = int(X_train_nd.shape[0])
        n_batches = -(-N // batch_size)
        batches = [(b, b * batch_size, min(batch_size, N - b * batch_size)) for b in range(first_batch, n_batches)]
        draw = order_n is None
        if draw and (first_batch or rng_state is None):
            raise ValueError("the device draws the order of a fresh epoch only, from the generator's state")
        with self.stream:
            if self._order_n is None or self._order_n.shape != (N,):
                self._order_n = self.cupy.empty(N, dtype=np.int64)
            if draw:
                self._words.set(state_words(rng_state), stream=self.stream)
            else:
                self.cupy.copyto(self._order_n, order_n)
            sizes = {rows for _, _, rows in batches}
            for rows in sizes:  # the steps' buffers are allocated here, never during a capture
                self._step(X_train_nd, rows)
            needed = sizes | ({"drawn order"} if draw else set())  # what must have run once, uncaptured
            if not self._capture_wanted or not needed <= self._warm:
                self._queue(X_train_nd, batches, n_batches, draw)
                self._warm |= needed
                return
            graph = self._graphs.get((first_batch, draw))
            if graph is None:
                graph = self._capture(X_train_nd, batches, n_batches, draw)
                if graph is None:
                    return
                self._graphs[(first_batch, draw)] = graph
            graph.launch(self.stream)
            self.launches += 1

    def _capture(self, X_train_nd, batches, n_batches: int, draw: bool):
        """The epoch's graph; None (the epoch then runs its parts one by one, from now on) when the
        memory pool allocated during the capture."""
        with _PoolAllocations(self.cupy) as allocations:
            self.stream.begin_capture()
            try:
                self._queue(X_train_nd, batches, n_batches, draw)
            finally:
                graph = self.stream.end_capture()
        self.captures += 1
        if allocations.count:
            print(f"note: the GPU epoch allocated memory {allocations.count} time(s) while being captured as a CUDA "
                  f"graph; its steps run one by one instead", file=sys.stderr)
            self._capture_wanted = False
            self._queue(X_train_nd, batches, n_batches, draw)
            return None
        return graph

    def _queue(self, X_train_nd, batches, n_batches: int, draw: bool) -> None:
        """The epoch's order when ``draw``, then every step of ``batches`` (``(b, first row, rows)``),
        queued on the stream (or recorded)."""
        if draw:
            permutation_gpu(self._order_n, self._words)
        for b, start, rows in batches:
            step = self._step(X_train_nd, rows)
            if b == n_batches - 1:  # the loss before the last (maybe smaller) batch: the trainer's sums need it
                self.cupy.copyto(self.loss_before_last_batch, self.counters.loss_sum)
            step.gather_rows(self._order_n[start:start + rows])
            for part in step.parts_after_gather():
                part()

    def _step(self, X_train_nd, rows: int) -> GraphStep:
        step = self._steps.get(rows)
        if step is None:
            cfg = self.config
            auxk = (cfg.aux_k, cfg.aux_coef, cfg.dead_window) if cfg.aux_k else None
            step = self._steps[rows] = GraphStep(self.cupy, self.params, self.velocities, X_train_nd, rows,
                                                 self._key[0], cfg.topk, cfg.lr, cfg.momentum, self.counters,
                                                 self.stream, capture=False, auxk=auxk, activation=cfg.activation,
                                                 products="kernels")
        return step

    def drawn_order(self) -> tuple:
        """``(order, generator state)``: the order the device drew for the epoch (host int64) and the
        PCG64 ``bit_generator.state`` after it (waits for the queued epoch)."""
        self.stream.synchronize()
        return self._order_n.get(), state_from_words(self._words.get())

    def loss_before_last(self) -> float:
        """The epoch's summed batch losses before its last batch (waits for the queued epoch)."""
        self.stream.synchronize()
        return float(self.loss_before_last_batch)

