"""``ksae-dist train --resume``: the run's own values, the options given applied or refused by name
(rank 0, before any work), as ``ksae-train --resume`` does (:mod:`ksae_cupy.session.resuming`)."""
from __future__ import annotations

from types import SimpleNamespace

from ksae_cupy.errors import KsaeError
from ksae_cupy.parallel.distributed_run import RunSettings
from ksae_cupy.session import resuming, train_run
from ksae_cupy.session.fields import REFUSED as REFUSED_POLICY, TRAIN, named
from ksae_cupy.training.trainer import TrainConfig

# Refused on --resume when they differ from the run: they shape the model or the batches: ksae-train's
# (those ksae-dist does not offer are never given), and how the ranks share the work.
REFUSED = named(TRAIN, REFUSED_POLICY) + ("shard_hidden",)
# Applied on --resume (kept from the run when not given): options of config.json's, by parameter name.
RUN_LEVEL = {"device": "device", "comm_kind": "comm", "topk_dist": "topk_dist", "checkpoint_every": "checkpoint_every",
             "data_dir": "data_dir"}


def resumed(params: dict, typed: set, folder, ckpt, previous: dict):
    """``(spec, config, settings, changes)`` of a resumed run: its own values (``spec``: its data, labels and
    splits), the options given applied or refused by name (rank 0, before any work)."""
    resuming.check_run_dir(params["run_dir"], folder.path)
    dataset = resuming.check_dataset(params["dataset"], previous)
    spec = resuming.check_data_options(typed, params, dataset, previous)  # given again: the run's own
    config = TrainConfig.from_dict(ckpt.config)
    sharded = bool(ckpt.config.get("shard_hidden", False))

    def same(name, value, saved):  # --no-k-schedule as ksae-train judges it; --shard-hidden by the checkpoint's
        if name == "shard_hidden":
            return sharded or "--shard-hidden (the run shards its data, not its hidden units)"
        return train_run.same(name, value, saved) if name == "no_k_schedule" else None

    resuming.check_refused(REFUSED, typed, params, config.to_dict(), same)
    settings = RunSettings.from_record(previous)
    settings.shard_hidden = sharded
    if "topk_dist" in typed and not sharded:
        raise KsaeError(f"--topk-dist {params['topk_dist']} is not allowed: the run shards its data, not its hidden "
                        f"units (--shard-hidden), so it has no distributed top-k; drop it")
    # --epochs (extend, or shorten to no fewer than done) and --topk (the same set): as ksae-train applies them.
    where = SimpleNamespace(config=config, epoch=ckpt.epoch, batch_in_epoch=ckpt.batch_in_epoch)
    changes = resuming.apply(("epochs", "topk"), typed, params, where)
    for param, field in RUN_LEVEL.items():
        if param in typed:
            value = params[param] if params[param] is None or field != "data_dir" else str(params[param])
            if value != getattr(settings, field):
                changes.append(f"{field.replace('_', '-')} {getattr(settings, field)} -> {value}")
                setattr(settings, field, value)
    return spec, config, settings, changes
