"""Seconds per training epoch on the GPU (``ksae-bench train --device gpu``): a fresh model and a trained one,
side by side, every contender checked before it is timed.

A run spends 4,990 of its 5,000 epochs on a trained model (:mod:`ksae_cupy.bench.trained`), so the epochs are
timed twice: from the untrained model (the initial weights ``ksae-train`` draws, seed 0) and from a trained
one (``--from-run RUN``'s checkpoint, or a model trained here for ``--trained-epochs`` epochs as ``ksae-train``
trains it: its rate, the paper's momentum, k from 100 down to k over the first half). Every contender of one
start begins from that very state, at that state's rate and momentum, on the same rows: MNIST's training
images where they load (:func:`ksae_cupy.bench.train_cpu.mnist_inputs`), else random rows with MNIST's 19% of
non-zeros (at lr 1e-3: they diverge at the paper's 0.01).

Contenders, per start: our trainer's epoch as ``ksae-train`` runs it, validation pass included, for each top-k
method: one CUDA graph per epoch (``trainer_epoch_graph_*``, the default; ``*_host_order_*``: the epoch's
order drawn on the host), its step graphs between the products (``trainer_graph_*``), uncaptured
(``trainer_generic_*``); and, where torch sees CUDA, the same model in PyTorch, eager (``torch``) and captured
whole as one CUDA graph (``torch_cuda_graph``): the start's weights, velocities and rate, full batches in order.

Protocol per contender: warm-up epochs (compilation; our captured trainer runs two, as its first runs
uncaptured and its second captures the epoch's graph; PyTorch's graph is captured before its first), which are
also its check: their mean losses must be finite and not diverged, and PyTorch's first step must lose what
NumPy float64 loses on the start's weights (it trains the same model); then ``epochs`` timed epochs, each
checked again. A contender that
diverged (an epoch's mean loss not finite, above the untrained model's, or above twice the start's; or our
trainer stopping as diverged) is recorded ``diverged``, with why, and gets no time.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ksae_cupy import paper
from ksae_cupy.bench.metadata import import_torch, run_metadata, torch_meta, write_results
from ksae_cupy.errors import KsaeError, TrainingDiverged
from ksae_cupy.topk import TOPK_METHODS

DIVERGED_FACTOR = 2.0  # an epoch's mean loss above twice the starting model's: the run diverged
FIRST_STEP_RTOL = 1e-3  # PyTorch's first step against NumPy float64 on the same weights (float32: about 1e-6)
LOSS_ROWS = 4096  # rows the starting model's loss is taken on (float64, on the host)


@dataclasses.dataclass
class Contender:
    """One way to train an epoch: ``run_epoch()`` trains one and returns its losses (per step, or the trainer's
    epoch mean once); ``first_step``: the first loss is the first batch's, in order, from the start's state
    (checked against NumPy); ``from_epoch``: the epoch the contender's model starts at (the start's);
    ``warmup_epochs``: epochs before the timed ones (our captured trainer: its first runs uncaptured and the
    second captures, as in ``ksae-train``; the timed ones replay)."""

    run_epoch: Callable[[], list]
    path: str
    from_epoch: int
    first_step: bool = False
    warmup_epochs: int = 1


@dataclasses.dataclass
class Divergence:
    """When a run has diverged: an epoch's mean loss not finite, above ``untrained`` (the untrained model's
    loss) or above :data:`DIVERGED_FACTOR` times ``start`` (the starting model's)."""

    untrained: float
    start: float

    def why(self, epoch_losses) -> str | None:
        for epoch, loss in enumerate(epoch_losses, start=1):
            if not math.isfinite(loss):
                return f"epoch {epoch}'s mean loss is {loss}: not finite"
            if loss > self.untrained:
                return f"epoch {epoch}'s mean loss {loss:.6g} is above the untrained model's {self.untrained:.6g}"
            if loss > DIVERGED_FACTOR * self.start:
                return (f"epoch {epoch}'s mean loss {loss:.6g} is above {DIVERGED_FACTOR:g} x the starting "
                        f"model's {self.start:.6g}")
        return None


def model_loss(params: dict, X_nd: np.ndarray, k: int) -> float:
    """The model's mean loss on ``X_nd`` (host float64): 0.5 ||x - xhat||^2 per row."""
    from ksae_cupy.model import forward, reconstruction_loss

    params64 = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    X64 = np.asarray(X_nd, dtype=np.float64)
    return float(reconstruction_loss(forward(params64, X64, k, "sort")[0], X64)[0])


def weights_digest(params: dict) -> str:
    """SHA-256 of ``W_dh`` as float32, C order: which weights a start holds, said in the results."""
    return hashlib.sha256(np.ascontiguousarray(params["W_dh"], dtype=np.float32).tobytes()).hexdigest()


def measure(contender: Contender, epochs: int, divergence: Divergence, first_loss: float | None = None) -> dict:
    """Check, then time, one contender: its warm-up epochs (its check), then ``epochs`` timed ones (medians)."""
    record = {"path": contender.path, "from_epoch": contender.from_epoch, "warmup_epochs": contender.warmup_epochs}
    try:
        warm = contender.run_epoch()
        losses = [float(np.mean(warm))]
        if contender.first_step and first_loss is not None:
            diff = abs(float(warm[0]) - first_loss) / abs(first_loss)
            record.update(first_step_loss=float(warm[0]), first_step_rel_diff=diff)
            if not diff <= FIRST_STEP_RTOL:
                record["refused"] = (f"its first step lost {float(warm[0]):.6g}, NumPy float64 {first_loss:.6g} on the "
                                     f"same weights (rel. diff. {diff:.3g} > {FIRST_STEP_RTOL:g}); not timed")
                record["epoch_losses"] = losses
                return record
        for _ in range(contender.warmup_epochs - 1):
            losses.append(float(np.mean(contender.run_epoch())))
        why = divergence.why(losses)
        times = []
        for _ in range(0 if why else epochs):
            t0 = time.perf_counter()
            losses.append(float(np.mean(contender.run_epoch())))
            times.append(time.perf_counter() - t0)
        record["epoch_losses"] = losses  # the warm-up's first
        why = why or divergence.why(losses)
        if why:  # a run that went to NaN or diverged times other arithmetic
            record["diverged"] = why + "; no time reported"
            return record
        record.update(seconds_per_epoch=float(np.median(times)), epoch_times=times)
    except TrainingDiverged as exc:
        record["diverged"] = f"{type(exc).__name__}: {exc}".splitlines()[0] + "; no time reported"
    except (KsaeError, RuntimeError, MemoryError) as exc:
        record["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return record


# ------------------------------------------------------------------------------------------------
# The contenders.

def trainer_kinds() -> dict:
    """name prefix -> Trainer subclass: the GPU paths of our trainer."""
    from ksae_cupy.training.trainer import Trainer

    class _HostOrderTrainer(Trainer):
        gpu_order_on_device = False

    class _StepGraphTrainer(Trainer):
        gpu_epoch_graph = False

    class _UncapturedTrainer(Trainer):
        captures_gpu_step = False

    return {"trainer_epoch_graph": Trainer, "trainer_epoch_graph_host_order": _HostOrderTrainer,
            "trainer_graph": _StepGraphTrainer, "trainer_generic": _UncapturedTrainer}


def trainer_contender(backend, start, trainer_class, D: int, k: int, method: str, X_train, X_valid,
                      more_epochs: int) -> Contender:
    """Our trainer of class ``trainer_class`` from ``start``, its epochs as ``ksae-train`` runs them."""
    trainer = start.trainer(backend, D, k, more_epochs, trainer_class, topk=method)
    path = ("uncaptured step" if not trainer._captures else
            "step graphs between the products" if not trainer.gpu_epoch_graph else
            "one CUDA graph per epoch" + ("" if trainer.gpu_order_on_device else ", order drawn on the host"))

    def run_epoch():
        return [trainer.run_epoch(X_train, X_valid).train_loss]

    return Contender(run_epoch, f"Trainer.run_epoch ({path}), validation pass included", trainer.epoch,
                     warmup_epochs=2 if trainer._captures else 1)


def torch_contender(torch, device: str, state: tuple[dict, dict], X_host, k: int, batch: int, lr: float,
                    momentum: float, from_epoch: int, captured: bool) -> Contender:
    """The same model in PyTorch (torch.topk, autograd, ``v <- m v - lr g; theta <- theta + v``, float32) from
    ``state`` (``(params, velocities)``, host float32), full batches of ``X_host`` in order; ``captured``:
    the step captured whole as one CUDA graph (PyTorch's recipe: warm-up on a side stream, capture, then back
    to the start's state in place) and replayed per batch, the losses kept on the device until the epoch ends."""
    params_np, velocities_np = state
    dev = torch.device(device)
    names = ("W_dh", "b_h", "c_d")
    params = [torch.tensor(np.ascontiguousarray(params_np[n]), device=dev, requires_grad=True) for n in names]
    velocities = [torch.tensor(np.ascontiguousarray(velocities_np[n]), device=dev) for n in names]
    start = [t.detach().clone() for t in (*params, *velocities)]
    X = torch.tensor(np.ascontiguousarray(X_host, dtype=np.float32), device=dev)
    starts = range(0, X.shape[0] - batch + 1, batch)
    W, b, c = params

    def step(x):
        z = torch.addmm(b, x, W)
        vals, idx = torch.topk(z, k, dim=1)
        zs = torch.zeros_like(z).scatter(1, idx, vals)
        xhat = torch.addmm(c, zs, W.T)
        loss = 0.5 * ((xhat - x) ** 2).sum() / x.shape[0]
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, v, g in zip(params, velocities, grads):
                v.mul_(momentum).sub_(lr * g)
                p.add_(v)
        return loss.detach()

    if not captured:
        def run_epoch():
            losses = [step(X[i:i + batch]).item() for i in starts]  # one host sync per step, as an eager loop
            return losses

        return Contender(run_epoch, f"PyTorch {torch.__version__} eager on {device}", from_epoch, first_step=True)

    x_static = torch.empty((batch, X.shape[1]), device=dev)
    with torch.cuda.device(dev):  # streams, capture and replay are per device
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(3):
                x_static.copy_(X[i * batch:(i + 1) * batch])
                step(x_static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss_static = step(x_static)
        with torch.no_grad():  # the warm-up trained: back to the start's state, in place (the graph holds addresses)
            for t, value in zip((*params, *velocities), start):
                t.copy_(value)

    def run_epoch():
        with torch.cuda.device(dev):
            losses = torch.empty(len(starts), device=dev)
            for j, i in enumerate(starts):
                x_static.copy_(X[i:i + batch])
                graph.replay()
                losses[j] = loss_static
            torch.cuda.synchronize()
            return losses.tolist()

    # The graph reads and writes these tensors by address: they must live as long as it does.
    run_epoch.graph_tensors = (*params, *velocities, x_static, loss_static)
    return Contender(run_epoch, f"PyTorch {torch.__version__} on {device}, captured whole as one CUDA graph",
                     from_epoch, first_step=True)


def _torch_on(backend, include_torch: bool):
    """``(torch, None)`` where torch runs on the backend's GPU, else ``(None, why)``."""
    if not include_torch:
        return None, "left out (--no-torch)"
    torch, why = import_torch(cuda=True)
    if why is not None and why.endswith("sees no CUDA device"):
        why += ": not like for like with ours on the GPU"
    return torch, why


def contenders(backend, start, D: int, k: int, X_train, X_valid, X_host, batch: int, topk_methods, epochs: int,
               torch) -> tuple[dict, dict]:
    """``(builders, absent)``: name -> a function building the contender from ``start`` (built one at a time: each
    holds its own model); name -> why a contender is left out."""
    from ksae_cupy import optimizers

    builders, absent = {}, {}
    for method in topk_methods:
        for prefix, cls in trainer_kinds().items():
            builders[f"{prefix}_{method}"] = (
                lambda cls=cls, method=method: trainer_contender(backend, start, cls, D, k, method, X_train, X_valid,
                                                                 epochs + 2))
    config = start.config(k, 0)
    if torch is not None and (config.activation, config.aux_k, config.optimizer) != ("linear", 0, optimizers.PAPER):
        absent["torch"] = absent["torch_cuda_graph"] = (
            f"the model has {config.activation} units, aux_k {config.aux_k}, optimizer {config.optimizer}: PyTorch's "
            f"step here is the paper's (linear units, no AuxK, momentum SGD)")
    elif torch is not None:
        device = f"cuda:{backend.gpu_index}"
        for name, captured in (("torch", False), ("torch_cuda_graph", True)):
            builders[name] = lambda captured=captured: torch_contender(
                torch, device, start.host_state(), X_host, k, batch, config.lr, config.momentum, start.epoch, captured)
    return builders, absent


# ------------------------------------------------------------------------------------------------
# The benchmark.

def bench_train_gpu(backend, D: int = 784, H: int = paper.HIDDEN, k: int = paper.K, batch: int = paper.BATCH_SIZE,
                    *, topk: str = "sort", topk_methods=TOPK_METHODS, epochs: int = 3, trained_epochs: int = 10,
                    from_run=None, rows: int | None = None, lr: float | None = None, include_torch: bool = True,
                    project_epochs: int = paper.EPOCHS, out_dir: Path | None = None, write: bool = True,
                    log=print) -> dict:
    """Seconds per epoch on the GPU ``backend``, fresh and trained side by side (the module's docstring).
    ``from_run`` (a :class:`~ksae_cupy.bench.trained.TrainedStart`): the trained model; else one trained here
    for ``trained_epochs`` epochs (0: the fresh model only). ``rows``: the first ROWS training images (default
    50,000), a fifth as many validation ones; ``lr``: the fresh model's rate (default: the paper's on MNIST,
    1e-3 on random rows); ``topk``: the top-k of the model trained here. Returns the result (``"path"``: the
    JSON written unless ``write=False``)."""
    from ksae_cupy.bench import trained
    from ksae_cupy.bench.train_cpu import mnist_inputs

    if not backend.is_gpu:
        raise KsaeError(f"device {backend.name}: this benchmark times GPU epochs; use ksae-bench train --device cpu")
    if rows is not None and rows < batch:
        raise KsaeError(f"--rows {rows} is not allowed; use at least --batch-size ({batch}) rows")
    n_train = rows or 50_000
    X_host, X_valid_host, what = mnist_inputs(D, n_train, 10_000 if rows is None else max(1, rows // 5))
    if lr is None:
        lr = paper.LR if what.startswith("MNIST") else 1e-3
    torch, torch_absent = _torch_on(backend, include_torch)
    t0 = time.perf_counter()
    with backend.use():
        X_train, X_valid = backend.asarray(X_host), backend.asarray(X_valid_host)
        starts = {"fresh": trained.fresh(backend, D, H, k, batch, topk, lr)}
        if from_run is not None:
            starts["trained"] = from_run
        elif trained_epochs > 0:
            starts["trained"] = trained.trained_here(backend, X_host, X_valid_host, H, k, batch, topk, trained_epochs,
                                                     lr, log)
        sample = X_host[:LOSS_ROWS]
        untrained = model_loss(starts["fresh"].checkpoint.params, sample, k)
        first_rows = X_host[:batch]
        said, results, absent = {}, {}, {} if torch is not None else {"torch": torch_absent}
        for which, start in starts.items():
            start_loss = model_loss(start.checkpoint.params, sample, k)
            config = start.config(k, 0)
            said[which] = {"made": start.made, "epoch": start.epoch, "lr": float(config.lr),
                           "momentum": float(config.momentum), "start_loss": start_loss,
                           "W_dh_sha256": weights_digest(start.checkpoint.params)}
            divergence = Divergence(untrained, start_loss)
            first_loss = model_loss(start.checkpoint.params, first_rows, k)
            results[which] = {}
            builders, left_out = contenders(backend, start, D, k, X_train, X_valid, X_host, batch, topk_methods,
                                            epochs, torch)
            absent.update({f"{name} ({which} model)": why for name, why in left_out.items()})
            for name, build in builders.items():
                try:
                    contender = build()
                except (KsaeError, RuntimeError, MemoryError) as exc:  # e.g. a capture refused: the others go on
                    results[which][name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
                    continue
                record = measure(contender, epochs, divergence, first_loss)
                if "seconds_per_epoch" in record:
                    record["projected_hours"] = record["seconds_per_epoch"] * project_epochs / 3600.0
                results[which][name] = record
                del contender
                log(f"{which} model, {name}: " + (f"{record['seconds_per_epoch']:.4f} s/epoch"
                                                  if "seconds_per_epoch" in record else
                                                  record.get("diverged") or record.get("refused") or record["error"]))
    trained_over_fresh = {name: r["seconds_per_epoch"] / results["fresh"][name]["seconds_per_epoch"]
                          for name, r in results.get("trained", {}).items()
                          if "seconds_per_epoch" in r and "seconds_per_epoch" in results["fresh"].get(name, {})}
    payload = {
        "benchmark": "train-gpu",
        "meta": {**run_metadata(backend), **torch_meta()},
        "torch": getattr(torch, "__version__", None),
        "absent": absent,
        "config": {"D": D, "H": H, "k": k, "batch": batch, "n_train": int(X_host.shape[0]),
                   "n_valid": int(X_valid_host.shape[0]), "inputs": what, "epochs_timed": epochs,
                   "project_epochs": project_epochs, "dtype": "float32", "topk_methods": list(topk_methods),
                   "untrained_loss": untrained, "diverged_factor": DIVERGED_FACTOR,
                   "first_step_rtol": FIRST_STEP_RTOL, "seconds": time.perf_counter() - t0},
        "starts": said,
        "results": results,
        "trained_over_fresh": trained_over_fresh,
    }
    for name, ratio in trained_over_fresh.items():
        log(f"{name}: trained model's epoch / fresh model's = {ratio:.2f}")
    if write:
        payload["path"] = str(write_results("train-gpu", payload, out_dir))
    return payload
