"""Our training step against PyTorch's, like for like on one GPU (``bin/gpu-campaign``'s ``step`` stage).

Why a module of its own: the first comparisons (``ksae-bench train --device gpu``, 2026-11-25/26) timed
PyTorch on synthetic uniform [0, 1) rows at the paper's rate 0.01, where the loss goes to NaN within the
first epoch (a row's squared norm is about 261 there, 80 on MNIST), while our trainer ran at a tenth of
that rate; and they took the median of three epochs. Here every variant trains the same model on the
same data with the same hyper-parameters, is checked before it is timed, and a run whose loss is not
finite or grew is refused a time, with the reason recorded.

The same for every variant: the tied-weight k-sparse autoencoder (:mod:`ksae_cupy.model`), float32, its
initial weights drawn once (:func:`ksae_cupy.model.init_params` from ``default_rng(seed)``, as the trainer
draws them), the paper's lr 0.01 and momentum 0.9 (``v <- m v - lr g; theta <- theta + v``), batch 128,
the training rows already on the device, each epoch's order drawn once on the host and given to every
variant (the rows of a batch gathered on the device), full batches only (MNIST's 50,000 training rows:
390 batches; the last 80 rows are left out, so that a captured step of fixed shape serves every batch),
the loss summed on the device and read back once per epoch.

Variants: ``ours_step_graphs_<sort|threshold>`` (:class:`ksae_cupy.gpu.graph_step.GraphStep` driven
directly: the parts between the four products replayed as CUDA graphs), ``ours_trainer`` (the trainer's
own epoch, :meth:`Trainer.run_epoch`, given the same order; it also counts dead units; ``path`` records
which GPU path the trainer took, so the one-graph-per-epoch path is timed here once the trainer takes it),
``torch_eager`` and ``torch_graph`` (the same step in PyTorch: ``torch.topk(sorted=False)``, autograd,
the same update; the second captured whole, gather to update, as one CUDA graph and replayed per batch).
PyTorch runs where ours does: ``cuda:N`` for ``gpu:N``, the CPU (eager only) for ``cpu``; beside a GPU run,
a torch without CUDA is recorded absent. Both of its variants run one function (:meth:`TorchStep.train_step`),
so its eager step validated on the CPU checks the arithmetic of the captured one too.

Where every variant starts (``start``): by default a trained model, as users run it (a run spends 4,990 of
its 5,000 epochs on one): the state, parameters and velocities, after :attr:`StepSetup.trained_epochs` epochs
of our trainer at the same rate from the initial weights (:class:`ModelState`); ``fresh``: the initial weights
with zero velocities. Every variant is reset to that very state.

Protocol: (1) validate: from the starting state, every variant trains ``2 x validate_steps`` steps (the
first ``validate_steps`` batches, twice); its losses must equal a NumPy float64 run of the same steps to
:data:`VALIDATE_RTOL` (the trainer's two epoch means against the reference's); a variant that does not is
not timed. (2) time: back to the starting state, one warm-up epoch (compilation, capture), then
``epochs`` timed epochs (at least 5; host clock around each, which ends with the loss's read-back); the
median is reported. Every epoch's mean loss must be finite and at most the untrained model's loss, or the
variant's time is refused.

Over 400 lines: the like-for-like setup, the float64 reference every variant is checked against, and the
variants themselves (ours and PyTorch's) must share one module so that no variant is timed on another setup.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import import_torch, run_metadata, torch_meta, write_results

VALIDATE_RTOL = 1e-3  # float32 against float64 over 16 steps differs by about 1e-6; a wrong rate by percents
MIN_TIMED_EPOCHS = 5
STARTS = ("trained", "fresh")
OUR_METHODS = ("sort", "threshold")
TORCH_GRAPH_ON_CPU = "a CPU run: a CUDA graph needs a CUDA device"


@dataclass(frozen=True)
class StepSetup:
    """The model, the data's shape and the hyper-parameters every variant shares."""

    D: int = 784
    H: int = paper.HIDDEN
    k: int = paper.K
    batch: int = paper.BATCH_SIZE
    lr: float = paper.LR
    momentum: float = paper.MOMENTUM
    sigma: float = paper.SIGMA
    seed: int = 0
    validate_steps: int = 8
    epochs: int = MIN_TIMED_EPOCHS
    trained_epochs: int = 10  # the trained start: epochs of our trainer from the initial weights


@dataclass
class ModelState:
    """Where every variant starts: float32 host arrays, ``params`` (``W_dh`` C-contiguous, ``b_h``, ``c_d``) and
    their ``velocities`` (same names); ``made``: how (said in the results)."""

    params: dict
    velocities: dict
    made: str

    @classmethod
    def fresh(cls, setup: "StepSetup") -> "ModelState":
        """The initial weights (:func:`ksae_cupy.model.init_params` from ``default_rng(seed)``, as the trainer
        draws them) and zero velocities."""
        from ksae_cupy.model import init_params

        params = {name: np.ascontiguousarray(value, dtype=np.float32)
                  for name, value in init_params(setup.D, setup.H, setup.sigma, np.random.default_rng(setup.seed)).items()}
        return cls(params, {name: np.zeros_like(value) for name, value in params.items()}, "fresh: the initial weights")

    @classmethod
    def trained(cls, backend, setup: "StepSetup", X_nd) -> "ModelState":
        """The state of our trainer after ``setup.trained_epochs`` epochs on ``X_nd`` from the initial weights, at
        the setup's rate and momentum, k fixed."""
        from ksae_cupy.backend import to_host

        trainer = OursTrainer(backend, setup, X_nd).trainer
        X_device = backend.asarray(X_nd)
        for _ in range(setup.trained_epochs):
            trainer.run_epoch(X_device)
        host = {group: {name: np.ascontiguousarray(to_host(value), dtype=np.float32) for name, value in arrays.items()}
                for group, arrays in (("params", trainer.params), ("velocities", trainer.optimizer.velocities))}
        return cls(host["params"], host["velocities"],
                   f"trained: {setup.trained_epochs} epochs of our trainer from the initial weights at lr {setup.lr}")


TINY = dict(D=16, H=32, k=4, batch=8, validate_steps=3, lr=0.05, trained_epochs=2)  # lr: so that a few tiny epochs learn visibly
TINY_ROWS = 64


# ------------------------------------------------------------------------------------------------
# Data and the checks every variant passes.

def mnist_like(n: int, D: int, seed: int) -> np.ndarray:
    """Synthetic rows on MNIST's scale, where MNIST is not at hand: 19% of the pixels non-zero (MNIST's
    share), each uniform in (0, 1]. Uniform [0, 1) rows diverge at the paper's rate."""
    rng = np.random.default_rng(seed)
    X_nd = rng.random((n, D), dtype=np.float32)
    X_nd *= rng.random((n, D), dtype=np.float32) < 0.19
    return X_nd


def training_rows(tiny: bool, data_dir: Path | None, D: int, seed: int) -> tuple[np.ndarray, str]:
    """``(X_nd, what it is)``: MNIST's training split when its files are there (not tiny), else MNIST-like rows."""
    if not tiny:
        from ksae_cupy.datasets import data_root, load_dataset
        from ksae_cupy.errors import KsaeError

        try:
            return load_dataset("mnist", data_dir or data_root(), log=lambda *_: None).X_train, "mnist (training split)"
        except (KsaeError, OSError) as exc:
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            return mnist_like(50_000, D, seed), f"synthetic MNIST-like (19% non-zero, uniform (0, 1]); MNIST: {why}"
    return mnist_like(TINY_ROWS, D, seed), "synthetic MNIST-like (19% non-zero, uniform (0, 1]), tiny"


def reference_losses(setup: StepSetup, state: ModelState, X_nd, batches) -> list[float]:
    """Each step's loss of the same steps from ``state`` in NumPy float64 (the model's own functions)."""
    from ksae_cupy.model import loss_and_grads
    from ksae_cupy.momentum_sgd import MomentumSGD

    params = {name: value.astype(np.float64) for name, value in state.params.items()}
    optimizer = MomentumSGD(params, setup.momentum, np)
    for name, value in state.velocities.items():
        optimizer.velocities[name][...] = value
    losses = []
    for rows in batches:
        loss, grads, _ = loss_and_grads(params, X_nd[rows].astype(np.float64), setup.k, "sort")
        optimizer.step(params, grads, setup.lr)
        losses.append(loss)
    return losses


def worst_relative_difference(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return math.inf
    return float(np.max(np.abs(got - want) / np.abs(want)))


def untrained_loss(setup: StepSetup, W0_dh, X_nd, rows: int = 4096) -> float:
    """The initial model's mean loss over (at most ``rows`` of) the rows, in float64: where training starts."""
    from ksae_cupy.model import forward, reconstruction_loss

    params = {"W_dh": W0_dh.astype(np.float64), "b_h": np.zeros(setup.H), "c_d": np.zeros(setup.D)}
    X_sample = X_nd[:rows].astype(np.float64)
    return reconstruction_loss(forward(params, X_sample, setup.k, "sort")[0], X_sample)[0]


def refusal(epoch_losses, initial_loss: float) -> str | None:
    """Why no time may be reported for a run with these epoch mean losses (None: it may): a loss not
    finite, or one above ``initial_loss``, the untrained model's (the run diverged)."""
    for epoch, loss in enumerate(epoch_losses, start=1):
        if not math.isfinite(loss):
            return f"epoch {epoch}'s mean loss is {loss}: not finite"
        if loss > initial_loss:
            return f"diverged: epoch {epoch}'s mean loss {loss:.6g} is above the untrained model's {initial_loss:.6g}"
    return None


# ------------------------------------------------------------------------------------------------
# The variants. Each: reset() (back to the starting state, in place: a captured graph holds addresses),
# steps(order, batches) -> per-step losses (validation), epoch(order) -> the epoch's mean loss.

class _BatchedVariant:
    """A variant driven one batch at a time; subclasses give ``start``, ``run(order, b)``, ``loss_sum``."""

    def __init__(self, setup: StepSetup, n_rows: int):
        self.setup, self.n_batches = setup, n_rows // setup.batch

    def steps(self, order, n_steps: int) -> list[float]:
        losses = []
        for b in range(n_steps):
            self.start()
            self.run(order, b)
            losses.append(self.loss_sum())
        return losses

    def epoch(self, order) -> float:
        self.start()
        for b in range(self.n_batches):
            self.run(order, b)
        return self.loss_sum() / self.n_batches


class OursStepGraphs(_BatchedVariant):
    """Our captured step (:class:`~ksae_cupy.gpu.graph_step.GraphStep`) on the batches of ``order``."""

    def __init__(self, cupy, setup: StepSetup, state: ModelState, X_nd, method: str):
        from ksae_cupy.gpu.graph_step import EpochCounters, GraphStep

        super().__init__(setup, X_nd.shape[0])
        self.cupy, self.name = cupy, f"ours_step_graphs_{method}"
        self.state = {group: {name: cupy.asarray(value) for name, value in arrays.items()}
                      for group, arrays in (("params", state.params), ("velocities", state.velocities))}
        self.params = {name: value.copy() for name, value in self.state["params"].items()}
        self.velocities = {name: value.copy() for name, value in self.state["velocities"].items()}
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.counters = EpochCounters.zeros(cupy, setup.H, cupy.zeros(setup.H, dtype=np.int64))
        self.step = GraphStep(cupy, self.params, self.velocities, cupy.asarray(X_nd), setup.batch, setup.k, method,
                              setup.lr, setup.momentum, self.counters, self.stream)
        self.path = "GraphStep: the parts between the 4 products as CUDA graphs, the products launched between them"
        cupy.cuda.Device().synchronize()  # what the default stream queued comes first: the steps' stream does not wait

    def device_order(self, order):
        order_dev = self.cupy.asarray(order)
        self.cupy.cuda.Device().synchronize()  # copied before the steps' stream (which does not wait on it) reads it
        return order_dev

    def reset(self):
        with self.stream:
            for group, arrays in (("params", self.params), ("velocities", self.velocities)):
                for name, array in arrays.items():
                    array[...] = self.state[group][name]

    def start(self):
        with self.stream:
            self.counters.start_epoch(0.0)

    def run(self, order, b: int):
        B = self.setup.batch
        self.step.run(order[b * B:(b + 1) * B])

    def loss_sum(self) -> float:
        self.stream.synchronize()
        return float(self.counters.loss_sum)


def torch_device(torch, backend) -> tuple[str | None, str | None]:
    """``(device, None)``: where PyTorch's step runs, like for like with ours (``cpu`` for a CPU run, the same
    GPU, ``cuda:N``, for ``gpu:N``); ``(None, why)`` where torch cannot run there."""
    if not backend.is_gpu:
        return "cpu", None
    if not torch.cuda.is_available():
        return None, (f"torch {torch.__version__} sees no CUDA device: its step on the CPU against ours on "
                      f"{backend.name} would not be like for like")
    return f"cuda:{backend.gpu_index}", None


class TorchStep(_BatchedVariant):
    """The same step in PyTorch (``torch.topk`` unsorted, autograd, the same update) on ``device`` (``cpu`` or
    ``cuda:N``), eager or (``captured``, CUDA only) captured whole as one CUDA graph and replayed per batch.

    Both run the one function :meth:`train_step`: the eager variant calls it per batch, the captured one
    captures that very call once. So the eager step validated on the CPU validates the captured step's
    arithmetic; what capture adds is PyTorch's recipe (``_capture``): every tensor the step reads or
    writes (rows, data, parameters, velocities, the loss total) allocated before capture and only ever
    written in place afterwards, warm-up on a side stream, no host sync inside the step."""

    WARMUP_STEPS = 3  # before capture: autograd's and cuBLAS's lazy set-up happens outside it

    def __init__(self, torch, setup: StepSetup, state: ModelState, X_nd, device: str, captured: bool):
        super().__init__(setup, X_nd.shape[0])
        self.torch, self.name = torch, "torch_graph" if captured else "torch_eager"
        self.device = torch.device(device)
        if captured and self.device.type != "cuda":
            raise ValueError(f"captured on device {device!r} is not allowed; a CUDA graph needs a cuda device")
        # float32 given everywhere: a caller's torch.set_default_dtype must not turn a bias into float64
        f32, dev = torch.float32, self.device
        self.X = torch.as_tensor(X_nd, dtype=f32, device=dev)  # only read (on the CPU: X_nd's own memory)
        names = ("W_dh", "b_h", "c_d")
        # copies: reset() restores the parameters and velocities from them, in place
        self.start_params = tuple(torch.tensor(state.params[name], dtype=f32, device=dev) for name in names)
        self.start_velocities = tuple(torch.tensor(state.velocities[name], dtype=f32, device=dev) for name in names)
        self.W, self.b, self.c = (p.clone().requires_grad_(True) for p in self.start_params)
        self.params = (self.W, self.b, self.c)
        self.velocities = tuple(v.clone() for v in self.start_velocities)  # before capture: its addresses
        self.rows = torch.zeros(setup.batch, dtype=torch.int64, device=dev)  # the batch's rows, copied in place
        self.total = torch.zeros((), dtype=torch.float64, device=dev)  # the losses' sum, read once per epoch
        self.graph = None
        precision = torch.get_float32_matmul_precision()  # recorded: "highest" is no TF32, as CuPy's default
        self.path = f"PyTorch {torch.__version__} on {dev}, float32 matmul precision {precision}, " + \
                    ("captured whole as one CUDA graph, replayed per batch" if captured else "eager")
        if captured:
            with self._on_device():
                self._capture()

    def device_order(self, order):
        return self.torch.as_tensor(np.asarray(order, dtype=np.int64), device=self.device)

    def _on_device(self):
        """The step's GPU as torch's current device (streams, capture and replay are per device)."""
        return self.torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()

    def train_step(self):
        """One step on the batch ``self.rows``; adds its loss to ``self.total``. No host sync: captured as is.
        ``v <- m v - lr g; theta <- theta + v`` in float32, as :func:`ksae_cupy.momentum_sgd.momentum_update`."""
        torch, s = self.torch, self.setup
        X_nd = self.X.index_select(0, self.rows)
        Z_nh = torch.addmm(self.b, X_nd, self.W)
        val_nk, idx_nk = torch.topk(Z_nh, s.k, dim=1, sorted=False)  # int64 indices, as scatter wants
        Zs_nh = torch.zeros_like(Z_nh).scatter(1, idx_nk, val_nk)
        Xhat_nd = torch.addmm(self.c, Zs_nh, self.W.T)
        loss = 0.5 * ((Xhat_nd - X_nd) ** 2).sum() / s.batch  # the model's 0.5/N sum of squares
        grads = torch.autograd.grad(loss, self.params)
        with torch.no_grad():
            for theta, v, g in zip(self.params, self.velocities, grads):
                v.mul_(s.momentum).sub_(g * s.lr)
                theta.add_(v)
            self.total.add_(loss.double())

    def _capture(self):
        """PyTorch's recipe for capturing a whole training step (its CUDA Graphs notes): warm-up on a side
        stream that waits for what the current stream queued, then capture on that same stream; the
        warm-up trained, so back to the starting state, in place (the graph holds the addresses)."""
        torch = self.torch
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(self.WARMUP_STEPS):
                self.train_step()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.train_step()
        self.reset()

    def reset(self):
        with self.torch.no_grad(), self._on_device():
            for t, start in zip((*self.params, *self.velocities), (*self.start_params, *self.start_velocities)):
                t.copy_(start)

    def steps(self, order, n_steps: int) -> list[float]:
        with self._on_device():
            return super().steps(order, n_steps)

    def epoch(self, order) -> float:
        with self._on_device():
            return super().epoch(order)

    def start(self):
        self.total.zero_()

    def run(self, order, b: int):
        B = self.setup.batch
        self.rows.copy_(order[b * B:(b + 1) * B])  # in place: the graph reads this buffer
        if self.graph is not None:
            self.graph.replay()
        else:
            self.train_step()

    def loss_sum(self) -> float:
        return float(self.total.item())  # the one host sync, after the step(s)


class OursTrainer:
    """The trainer's own epoch (:meth:`Trainer.run_epoch`), given each epoch's order."""

    name = "ours_trainer"

    def __init__(self, backend, setup: StepSetup, X_nd, state: ModelState | None = None):
        self.backend, self.setup, self.X_nd, self.state = backend, setup, backend.asarray(X_nd), state
        self.device_order = np.asarray
        self.reset()

    def reset(self):
        from ksae_cupy.training.trainer import TrainConfig, Trainer

        s = self.setup
        config = TrainConfig(hidden=s.H, k=s.k, k_start=None, epochs=10 ** 6, batch_size=s.batch, lr=s.lr,
                             momentum=s.momentum, sigma=s.sigma, seed=s.seed)
        self.trainer = Trainer(config, self.backend, D=s.D)  # the same initial weights: default_rng(seed)
        if self.state is not None:  # then the starting state, in place (before any step: nothing holds old values)
            for arrays, values in ((self.trainer.params, self.state.params),
                                   (self.trainer.optimizer.velocities, self.state.velocities)):
                for name, value in values.items():
                    arrays[name][...] = self.backend.asarray(value)
        captured = getattr(self.trainer, "_captured", None)
        self.path = "generic step" if captured is None else \
            f"{type(captured).__module__}.{type(captured).__qualname__}"

    def _epoch_on(self, X_nd, order) -> float:
        self.trainer.epoch_perm = np.asarray(order, dtype=np.int64)  # as a checkpoint resumes an epoch's order
        return float(self.trainer.run_epoch(X_nd).train_loss)

    def steps(self, order, n_steps: int) -> list[float]:
        """Two epochs on the first ``n_steps`` batches (the second replays what the first captured):
        their two means, to compare with the reference's."""
        B = self.setup.batch
        X_first = self.X_nd[self.backend.asarray(np.asarray(order[:n_steps * B], dtype=np.int64))]
        return [self._epoch_on(X_first, np.arange(n_steps * B)) for _ in range(2)]

    def epoch(self, order) -> float:
        return self._epoch_on(self.X_nd, order)


# ------------------------------------------------------------------------------------------------
# The comparison.

def _variants(backend, torch, setup: StepSetup, state: ModelState, X_nd) -> tuple[list, dict]:
    """``(variants, absent)``: every variant that could be built, each starting from ``state``; each that could
    not, with why."""
    variants, absent = [], {}
    builders = [(f"ours_step_graphs_{m}", lambda m=m: OursStepGraphs(backend.xp, setup, state, X_nd, m))
                for m in OUR_METHODS] if backend.is_gpu else []
    builders.append(("ours_trainer", lambda: OursTrainer(backend, setup, X_nd, state)))
    if torch is not None:
        device, why = torch_device(torch, backend)
        if device is None:
            absent["torch_eager"] = absent["torch_graph"] = why
        else:
            builders.append(("torch_eager", lambda: TorchStep(torch, setup, state, X_nd, device, captured=False)))
            if device.startswith("cuda"):
                builders.append(("torch_graph", lambda: TorchStep(torch, setup, state, X_nd, device, captured=True)))
            else:
                absent["torch_graph"] = TORCH_GRAPH_ON_CPU
    if not backend.is_gpu:
        absent["ours_step_graphs"] = "not a GPU: the captured step needs one"
    for name, build in builders:
        try:
            variants.append(build())
        except Exception as exc:  # noqa: BLE001 -- e.g. a capture refused: recorded, the others go on
            absent[name] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return variants, absent


def _validate_and_time(variant, setup: StepSetup, validation_order, reference, orders, initial_loss: float,
                       validate_only: bool = False) -> dict:
    record = {"path": variant.path}
    V = setup.validate_steps
    try:
        variant.reset()
        if isinstance(variant, OursTrainer):
            got = variant.steps(validation_order, V)
            want = [float(np.mean(reference[:V])), float(np.mean(reference[V:]))]
        else:
            order = variant.device_order(np.concatenate([validation_order[:V * setup.batch]] * 2))
            got, want = variant.steps(order, 2 * V), reference
        record.update(validation_losses=got, validation_max_rel_diff=worst_relative_difference(got, want))
        if not record["validation_max_rel_diff"] <= VALIDATE_RTOL:
            record["refused"] = f"validation: losses differ from NumPy float64's by {record['validation_max_rel_diff']:.3g}" \
                                f" (allowed {VALIDATE_RTOL:g}); not timed"
            return record
        if validate_only:
            return record
        variant.reset()
        device_orders = [variant.device_order(order) for order in orders]
        losses, seconds = [], []
        for order in device_orders:  # the first: warm-up (compilation, capture), not timed
            t0 = time.perf_counter()
            losses.append(variant.epoch(order))
            seconds.append(time.perf_counter() - t0)
        record["epoch_losses"] = losses
        why = refusal(losses, initial_loss)
        if why:
            record["refused"] = why + "; no time reported"
            return record
        record.update(warmup_seconds=seconds[0], epoch_seconds=seconds[1:],
                      seconds_per_epoch=float(np.median(seconds[1:])), timed_epochs=len(seconds) - 1)
    except Exception as exc:  # noqa: BLE001 -- one variant's failure is recorded, the others go on
        record["refused"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return record


def compare_steps(device: str = "gpu", *, tiny: bool = False, data_dir: Path | None = None,
                  epochs: int = MIN_TIMED_EPOCHS, include_torch: bool = True, out_dir: Path | None = None,
                  write: bool = True, validate_only: bool = False, start: str = "trained") -> dict:
    """Validate, then time, every variant on one device; returns the result (``"path"``: the JSON written).
    ``device``: ``gpu[:N]`` (or ``cpu``: the trainer and PyTorch eager only, a check of the code paths).
    ``validate_only``: the validation alone, no epoch timed (on the CPU, MNIST's epochs take minutes).
    ``start``: ``trained`` (every variant from the state after ``setup.trained_epochs`` epochs of our trainer)
    or ``fresh`` (from the initial weights)."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.model import init_params

    if start not in STARTS:
        raise ValueError(f"start {start!r} is not allowed; use one of {', '.join(STARTS)}")
    if epochs < MIN_TIMED_EPOCHS:
        raise ValueError(f"epochs {epochs} is not allowed; use at least {MIN_TIMED_EPOCHS} (a median of fewer says little)")
    setup = StepSetup(epochs=epochs, **(TINY if tiny else {}))
    backend = resolve_device(device)
    torch, torch_absent = import_torch() if include_torch else (None, "left out (--no-torch)")
    X_host, data = training_rows(tiny, data_dir, setup.D, setup.seed)
    X_nd = np.ascontiguousarray(X_host[:(len(X_host) // setup.batch) * setup.batch], dtype=np.float32)
    W0_dh = init_params(setup.D, setup.H, setup.sigma, np.random.default_rng(setup.seed))["W_dh"]
    state = ModelState.trained(backend, setup, X_nd) if start == "trained" else ModelState.fresh(setup)
    rng = np.random.default_rng(setup.seed + 1)
    orders = [rng.permutation(len(X_nd)) for _ in range(1 + setup.epochs)]  # warm-up, then the timed epochs
    validation_order = orders[0]
    V = setup.validate_steps
    first_rows = [validation_order[b * setup.batch:(b + 1) * setup.batch] for b in range(V)]
    reference = reference_losses(setup, state, X_nd, first_rows * 2)
    initial_loss = untrained_loss(setup, W0_dh, X_nd)
    t0 = time.perf_counter()
    with backend.use():
        variants, absent = _variants(backend, torch, setup, state, X_nd)
        if torch is None:
            absent["torch"] = torch_absent
        results = {v.name: _validate_and_time(v, setup, validation_order, reference, orders, initial_loss,
                                              validate_only) for v in variants}
    timed = {name: r["seconds_per_epoch"] for name, r in results.items() if "seconds_per_epoch" in r}
    payload = {
        "benchmark": "step-compare",
        "meta": {**run_metadata(backend), **torch_meta()},
        "setup": {**asdict(setup), "rows": len(X_nd), "batches_per_epoch": len(X_nd) // setup.batch, "data": data,
                  "dtype": "float32", "validate_rtol": VALIDATE_RTOL, "reference": "NumPy float64, the same steps",
                  "validate_only": validate_only, "start": state.made},
        "reference_losses": reference,
        "untrained_loss": initial_loss,
        "results": results,
        "absent": absent,
        # How many times faster each of ours is than PyTorch's captured step (both validated and timed).
        "speedup_vs_torch_graph": {name: timed["torch_graph"] / sec for name, sec in timed.items()
                                   if name.startswith("ours") and "torch_graph" in timed},
        "seconds": time.perf_counter() - t0,
    }
    if write:
        payload["path"] = str(write_results("step-compare", payload, out_dir))
    return payload


def main(argv=None) -> int:
    """``python -m ksae_cupy.bench.step_compare --out DIR [--device gpu] [--tiny] [--epochs N] [--no-torch]
    [--validate-only]``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of the JSON")
    ap.add_argument("--device", default="gpu", help="gpu, gpu:N or cpu (cpu: the trainer and PyTorch eager only)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and synthetic rows (a check of the code paths)")
    ap.add_argument("--epochs", type=int, default=MIN_TIMED_EPOCHS, help="timed epochs after the warm-up (>= 5)")
    ap.add_argument("--data-dir", type=Path, default=None, help="data root holding mnist/ (default $KSAE_DATA_DIR)")
    ap.add_argument("--no-torch", action="store_true", help="leave PyTorch out")
    ap.add_argument("--validate-only", action="store_true", help="validate every variant, time none")
    ap.add_argument("--start", choices=STARTS, default="trained",
                    help="every variant from a trained model (default; what users run) or the initial weights")
    args = ap.parse_args(argv)
    result = compare_steps(args.device, tiny=args.tiny, data_dir=args.data_dir, epochs=args.epochs,
                           include_torch=not args.no_torch, out_dir=args.out, validate_only=args.validate_only,
                           start=args.start)
    for name, why in result["absent"].items():
        print(f"step {name}: absent: {why}", flush=True)
    for name, r in result["results"].items():
        said = f"refused: {r['refused']}" if "refused" in r else f"{r['seconds_per_epoch']:.4f} s/epoch" \
            if "seconds_per_epoch" in r else f"validated (worst relative difference {r['validation_max_rel_diff']:.2g})"
        print(f"step {name}: {said}", flush=True)
    print(f"step-compare JSON: {result['path']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
