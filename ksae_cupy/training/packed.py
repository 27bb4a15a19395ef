"""Many runs in one process: R trainers stepped together, on the GPU as one stacked model.

    pack = Pack([trainer_a, trainer_b, trainer_c])          # Trainers of one backend, each its own run
    pack.fit(X_train_nd, X_valid_nd, on_epoch=lambda i, report: ..., checkpoint=lambda i: ...)

Each member stays a whole :class:`~ksae_cupy.training.trainer.Trainer`: its own seed (initial weights,
and each epoch's order from its own generator), k and k schedule, learning rate, momentum, epochs,
tally, dead-unit counts and checkpoint. The pack only decides when each member trains a batch: one
batch of every member per pack step, each from the member's own order, so every member sees the
batches it sees alone. The epochs are the engine's (:func:`ksae_cupy.training.epochs.run_interleaved`: each
member's epoch opened, stepped and closed by the calls a run alone takes); an epoch ends member by member
(validation, report, checkpoint), and a member resumed mid-epoch simply has fewer batches left.

Two ways to take a pack step:

* **one member after another** (the CPU's way, and the default there): each member's own step
  (:func:`ksae_cupy.training.epochs.step`), so a packed run gives the numbers of the run alone bit
  for bit, whatever step, top-k, activation or AuxK it trains with.
* **stacked** (the GPU's way): the members' parameters and velocities live in stacked arrays
  (``W_mdh``: member, input, unit), each trainer holding views of its slice
  (:meth:`Trainer.share_arrays`); the members at one k and batch size take one batched step
  (:func:`ksae_cupy.packed_step.stacked_loss_and_grads`) and one momentum update with a rate and a
  momentum per member. Sixteen runs of the paper's 784 x 1000 model then cost about one launch each
  product, where one run alone leaves most of a GPU idle. Equal to the run alone within float32
  rounding (the products sum in another order). It takes the paper's dense step; members must share
  the input width, hidden size and dtype, the top-k method and the activation, and train without AuxK.

A member whose loss becomes NaN or infinite stops (:attr:`Pack.failed` holds its
:class:`~ksae_cupy.errors.TrainingDiverged`); the others go on. One by one it stops at that step, as
alone; stacked, no value comes back to the host per step, and it stops when that epoch ends.
"""
from __future__ import annotations

import time

import numpy as np

from ksae_cupy.errors import KsaeError, TrainingDiverged
from ksae_cupy.model import PARAM_NAMES
from ksae_cupy.packed_step import kept_counts, stacked_loss_and_grads, stacked_momentum_update
from ksae_cupy.training import epochs

# What members stepped as one stacked model must share (the stacked arrays' shape and the one top-k).
STACK_SHARED = ("hidden", "dtype", "topk", "activation")


def stack_key(config, D: int) -> tuple:
    """Members whose configurations give one key can be stepped as one stacked model (:class:`Pack`)."""
    return (D,) + tuple(getattr(config, name) for name in STACK_SHARED)


class Pack:
    """R trainers on one backend, trained in lockstep (see the module's docstring).

    ``stacked``: step them as one stacked model; default: on a GPU yes, on the CPU no (one after another,
    bit for bit the runs alone)."""

    def __init__(self, trainers: list, stacked: bool | None = None):
        if not trainers:
            raise KsaeError("a pack needs at least one run")
        self.members = list(trainers)
        self.backend = self.members[0].backend
        names = sorted({t.backend.name for t in self.members})
        if len(names) > 1:
            raise KsaeError(f"the runs of one pack train on one device; these are on {', '.join(names)}")
        self.stacked = self.backend.is_gpu if stacked is None else bool(stacked)
        self.failed: dict[int, TrainingDiverged] = {}  # member -> why it stopped
        self.stop_requested = False  # set (e.g. by a signal handler) to stop after the current pack step
        if self.stacked:
            self._stack()

    # -- the stacked arrays ----------------------------------------------------------------------
    def _stack(self) -> None:
        """Move the members' parameters and velocities into stacked arrays, each trainer keeping views."""
        members, xp = self.members, self.backend.xp
        keys = {stack_key(t.config, t.params["W_dh"].shape[0]) for t in members}
        if len(keys) > 1:
            raise KsaeError(f"runs stepped as one stacked model must share the input width, {', '.join(STACK_SHARED)}; "
                            f"these differ: {sorted(keys)}; pack them apart")
        aux = [t.config.aux_k for t in members if t.config.aux_k]
        if aux:
            raise KsaeError(f"aux_k {aux[0]}: the stacked step trains without the auxiliary loss; pack such runs "
                            f"one after another (stacked=False) or train them alone")
        self.params_m = {name: xp.stack([xp.ascontiguousarray(t.params[name]) for t in members])
                         for name in PARAM_NAMES}
        self.velocities_m = {name: xp.stack([xp.ascontiguousarray(t.optimizer.velocities[name]) for t in members])
                             for name in PARAM_NAMES}
        # All runs at once, on the device: the dead-unit counts, and the running epoch's sums (its loss, squared
        # error and count of examples that kept each unit; each run's tally holds views of its row: _sums_in_stack).
        self.since_kept_mh = xp.stack([t.since_kept_h for t in members])
        self.kept_mh = xp.zeros(self.since_kept_mh.shape, dtype=np.int64)
        self.loss_m, self.sq_error_m = xp.zeros(len(members)), xp.zeros(len(members))  # float64 sums
        dtype = self.params_m["W_dh"].dtype
        self.lr_m = xp.asarray(np.array([t.config.lr for t in members], dtype=dtype))
        self.momentum_m = xp.asarray(np.array([t.config.momentum for t in members], dtype=dtype))
        for i, trainer in enumerate(members):
            trainer.share_arrays({name: self.params_m[name][i] for name in PARAM_NAMES},
                                 {name: self.velocities_m[name][i] for name in PARAM_NAMES}, self.since_kept_mh[i])

    # -- training ---------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return all(i in self.failed or t.finished for i, t in enumerate(self.members))

    def fit(self, X_train, X_valid=None, on_epoch=None, should_checkpoint=None, checkpoint=None) -> None:
        """Train every member its remaining epochs, or until :attr:`stop_requested` (members then stand
        mid-epoch, as a stopped run alone does). ``X_train``/``X_valid``: device arrays, one for all members
        or a list of one per member. After each member's epoch: ``on_epoch(i, report)``, then ``checkpoint(i)``
        when ``should_checkpoint(i, epoch)`` says so. The epochs: :func:`ksae_cupy.training.epochs.run_interleaved`."""
        def after_epoch(i, report):
            if checkpoint is not None and should_checkpoint is not None and should_checkpoint(i, report.epoch):
                checkpoint(i)

        X_trains, X_valids = self._each(X_train), self._each(X_valid)
        with self.backend.use(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            self._share_sets(X_trains, X_valids)
            epochs.run_interleaved(self.members, list(zip(X_trains, X_valids)), lambda: self.stop_requested,
                                   self.failed, on_epoch, after_epoch,
                                   step_all=self._stacked_step if self.stacked else None)

    def _each(self, X):
        if isinstance(X, (list, tuple)):
            if len(X) != len(self.members):
                raise KsaeError(f"{len(X)} data arrays for {len(self.members)} runs; give one, or one per run")
            return list(X)
        return [X] * len(self.members)

    def _share_sets(self, X_trains, X_valids) -> None:
        """What the members training on one set compute of it once: its spread (the FVE's denominator) and its
        CSR form (:class:`~ksae_cupy.cpu.sparse_encoder.RunInputs` finds a set by identity)."""
        spreads, inputs = epochs.SpreadCache(keep=2 * len(self.members)), {}
        for trainer, X, X_valid in zip(self.members, X_trains, X_valids):
            trainer._spreads = spreads
            trainer._spread_of(X, X_valid)  # before any member's BLAS limit, as a run alone computes them
            trainer._inputs = inputs.setdefault((id(X), id(X_valid), trainer._inputs.applies), trainer._inputs)

    def _stacked_step(self, running: dict) -> None:
        """One batch of every running member: the members at one k and batch size as one stacked step."""
        xp, members = self.backend.xp, self.members
        for i, epoch in running.items():
            if "stacked" not in epoch.own:
                self._sums_in_stack(i)
                epoch.own["stacked"] = True
        groups = {}  # (k, batch size) -> [(member, its batch's rows)]
        for i, epoch in running.items():
            trainer = members[i]
            b, size = trainer.batch_in_epoch, trainer.config.batch_size
            rows = epoch.order[b * size:(b + 1) * size]
            groups.setdefault((epoch.k, int(rows.shape[0])), []).append((i, rows))
        for (k, n), batch in groups.items():
            started = time.perf_counter()
            chosen = [i for i, _ in batch]
            take = _slice_or_indices(chosen, xp)
            X_trains = {i: running[i].data[0] for i in chosen}
            if all(X_trains[i] is X_trains[chosen[0]] for i in chosen):  # one gather for the whole stack
                X_mnd = X_trains[chosen[0]][xp.stack([rows for _, rows in batch])]
            else:
                X_mnd = xp.stack([X_trains[i][rows] for i, rows in batch])
            params = {name: value[take] for name, value in self.params_m.items()}  # views for a slice
            config = members[chosen[0]].config
            sq_error_m, grads, idx_mnk, val_mnk = stacked_loss_and_grads(
                params["W_dh"], params["b_h"], params["c_d"], X_mnd, k, config.topk, config.activation)
            self._update(take, params, grads)
            self._count(take, sq_error_m, kept_counts(idx_mnk, params["W_dh"].shape[2]), n)
            seconds = time.perf_counter() - started
            for j, i in enumerate(chosen):
                trainer = members[i]
                running[i].parts["steps"] += seconds  # the group's launch time (the GPU's own is in the epoch's total)
                if config.activation != "linear":  # relu units: a kept unit may be 0 (linear ones keep n * k)
                    trainer._batch_nonzero = xp.count_nonzero(val_mnk[j])
                trainer.count_step(None, n, k, None)  # the loss and the per-unit counts: _count, for the stack
                trainer.step += 1
                trainer.batch_in_epoch += 1

    def _sums_in_stack(self, i: int) -> None:
        """Member ``i``'s epoch sums in the stacked arrays (from a resumed tally's, mid-epoch): its tally holds
        views of its row (a 0-d one for the losses), which :meth:`_count` adds to for all members at once."""
        tally = self.members[i].tally
        for name, sums in (("loss", self.loss_m), ("sq_error", self.sq_error_m), ("kept_h", self.kept_mh)):
            sums[i] = tally.get(name, 0)
            tally.values[name] = sums[i, ...]

    def _count(self, take, sq_error_m, kept_mh, n: int) -> None:
        """What :meth:`Trainer.count_step` counts per run, for the members ``take`` selects at once and on the
        device after a step on ``n`` examples each: the epoch's loss and squared error, its examples that kept
        each unit, and the dead-unit counts (``n`` more for every unit, 0 for those the step kept). No value
        comes back to the host per step: a loss that is no longer finite stops its run when its epoch ends
        (:meth:`Trainer.close_epoch`'s health check), as the captured step of a run alone on a GPU does."""
        sums = (self.loss_m[take], self.sq_error_m[take], self.kept_mh[take], self.since_kept_mh[take])
        loss_m, sq_m, epoch_kept_mh, since_kept_mh = sums
        sq_error_m = sq_error_m.astype(np.float64)  # each batch's float32 sum, summed over batches in float64
        sq_m += sq_error_m
        loss_m += sq_error_m * (0.5 / n)
        epoch_kept_mh += kept_mh
        since_kept_mh += n
        since_kept_mh *= kept_mh == 0  # 0 where kept: one elementwise pass, no mask to gather
        if not isinstance(take, slice):  # fancy indexing copied them: written back
            self.loss_m[take], self.sq_error_m[take], self.kept_mh[take], self.since_kept_mh[take] = sums

    def _update(self, take, params: dict, grads: dict) -> None:
        """Momentum SGD of the members ``take`` selects, each at its own rate and momentum."""
        lr_m, momentum_m = self.lr_m[take], self.momentum_m[take]
        for name in PARAM_NAMES:
            theta_m = params[name]
            v_m = self.velocities_m[name][take]
            stacked_momentum_update(theta_m, v_m, grads[name], momentum_m, lr_m)
            if not isinstance(take, slice):  # fancy indexing copied them: written back
                self.params_m[name][take] = theta_m
                self.velocities_m[name][take] = v_m


def _slice_or_indices(chosen: list[int], xp):
    """A slice where the members are consecutive (then the stacked arrays are updated through views), else
    their indices (a device array of ``xp``)."""
    if chosen == list(range(chosen[0], chosen[0] + len(chosen))):
        return slice(chosen[0], chosen[0] + len(chosen))
    return xp.asarray(np.asarray(chosen, dtype=np.int64))
