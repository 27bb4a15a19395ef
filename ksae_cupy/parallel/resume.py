"""``mpi_train train --resume``: the run's checkpoint and what the options given change in it (rank 0,
before any work), as ``ksae-train --resume`` does (:func:`ksae_cupy.session.train_run.resumed_job`).

The run folder, its data and the session's settings (--device, --comm, --topk-dist, --checkpoint-every,
--data-dir) are the lifecycle's (:meth:`RunLifecycle.open <ksae_cupy.session.lifecycle.RunLifecycle.open>`);
this module adds what an MPI run's checkpoint holds: its rank count and how the ranks share the work.
"""
from __future__ import annotations

from types import SimpleNamespace

from ksae_cupy.errors import KsaeError
from ksae_cupy.session import resuming, train_run
from ksae_cupy.session.fields import REFUSED as REFUSED_POLICY, TRAIN, named
from ksae_cupy.training.trainer import TrainConfig

# Refused on --resume when they differ from the run: they shape the model or the batches: ksae-train's
# (those ksae-dist does not offer are never given), and how the ranks share the work.
REFUSED = named(TRAIN, REFUSED_POLICY) + ("shard_hidden",)


def resumed_run(folder, options, size: int):
    """``(ckpt, config, changes)`` of the run in ``folder`` (checked and locked by the lifecycle): its
    checkpoint, this folder's and trained on ``size`` ranks, and its configuration with the options given
    applied or refused (:func:`resumed`)."""
    from ksae_cupy.training.checkpoint import load_checkpoint

    ckpt = load_checkpoint(folder.checkpoint)
    folder.check_checkpoint(ckpt.run_id, ckpt.config)  # this folder's run, not a copy
    saved_size = ckpt.config.get("world_size")
    if saved_size is None:
        raise KsaeError(f"--resume {folder.path}: a run of ksae-train (one process: its checkpoint names no rank "
                        f"count); continue it with ksae-train --resume {folder.path}")
    if saved_size != size:
        raise KsaeError(f"--resume: the run was trained on {saved_size} ranks; resume it with mpiexec -n "
                        f"{saved_size} (this job has {size})")
    config, changes = resumed(options, ckpt)
    return ckpt, config, changes


def resumed(options, ckpt):
    """``(config, changes)``: the checkpoint's configuration, the refused ``options`` given checked (by name),
    --epochs and --topk applied as ksae-train applies them, and --topk-dist refused on a run that does not
    shard its hidden units."""
    config = TrainConfig.from_dict(ckpt.config)
    sharded = bool(ckpt.config.get("shard_hidden", False))

    def same(name, value, saved):  # the k schedule as ksae-train judges it; --shard-hidden by the checkpoint's
        if name == "shard_hidden":
            return value == sharded or "--shard-hidden (the run shards its data, not its hidden units)"
        # --k-start: a schedule the run dropped when it was made, asked again, is the run's own
        return train_run.same(name, value, saved) if name in ("k_start", "no_k_schedule") else None

    resuming.check_refused(REFUSED, options, config.to_dict(), same)
    if "topk_dist" in options.given and not sharded:
        raise KsaeError(f"--topk-dist {options.topk_dist} is not allowed: the run shards its data, not its hidden "
                        f"units (--shard-hidden), so it has no distributed top-k; drop it")
    # --epochs (extend, or shorten to no fewer than done) and --topk (the same set): as ksae-train applies them.
    where = SimpleNamespace(config=config, epoch=ckpt.epoch, batch_in_epoch=ckpt.batch_in_epoch)
    return config, resuming.apply(("epochs", "topk"), options, where)
