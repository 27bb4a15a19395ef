"""``ksae-train --resume``: every option given on the command line is applied or refused by name.

Applied (safe to change mid-run): ``--epochs`` (extend: the k schedule keeps the epochs it
was planned over; shorten, to no fewer than the epochs done: the schedule shrinks with it), ``--topk`` (both algorithms keep the same set), ``--step`` (the same math), ``--device``,
``--checkpoint-every``, ``--checkpoint-minutes``, ``--threads``, ``--data-dir``, ``--quiet``,
``--progress-seconds``. Refused when they differ from the run: the options that shape the
model or the sequence of batches, and a ``--run-dir``, DATASET or data option (``--labels``,
``--valid-fraction``, ...) other than the run's own.
Options not given keep the run's values (the checkpoint's configuration, config.json), never
the defaults: ``--threads`` included. ``--quiet`` is the one option of a session only.
"""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.errors import KsaeError
from ksae_cupy.training.options import check_positive_count
from ksae_cupy.training.runs import dataset_record, file_sha256
from ksae_cupy.training.wording import epochs_done, position  # noqa: F401 (used here and by the commands)

# The data options choose the rows a run trains on: refused when they differ from the run's.
DATA = ("labels", "test", "test_labels", "valid_fraction", "test_fraction", "split_seed")
REFUSED = ("hidden", "k", "k_start", "no_k_schedule", "batch_size", "lr", "momentum", "sigma", "seed", "dtype",
           "activation", "aux_k", "aux_coef", "dead_window", "center_input")
APPLIED = ("epochs", "topk", "step", "device", "checkpoint_every", "checkpoint_minutes", "threads", "data_dir", "quiet",
           "progress_seconds")
# Run-level options kept in config.json; on resume, one not given takes the run's value.
RUN_LEVEL = ("checkpoint_every", "checkpoint_minutes", "threads", "device", "data_dir", "progress_seconds")
# Applied options kept in the checkpoint's training configuration (see apply_options).
IN_CHECKPOINT = ("epochs", "topk", "step")
# Options of one session only: --quiet is how this invocation talks, not part of the run.
SESSION = ("quiet",)


def given(ctx) -> set:
    """The options the user typed on this command line."""
    return {name for name in ctx.params if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}


def where_line(folder_path: Path, epoch: int, batch_in_epoch: int, step: int) -> str:
    return f"resuming {folder_path} {position(epoch, batch_in_epoch)} (step {step})"


def check_dataset(dataset: str | None, previous: dict) -> str:
    """The run's dataset; a DATASET given again must name the same data, and a user file must
    still hold the bytes it held when the run started."""
    recorded = previous["dataset"]
    if dataset is not None and dataset_record(dataset, False)["dataset"] != dataset_record(recorded, False)["dataset"]:
        raise KsaeError(f"--resume: DATASET {dataset!r} contradicts the run's dataset {recorded!r}")
    expected = previous.get("dataset_sha256")
    if expected:
        path = Path(recorded.rsplit(":", 1)[0] if ".h5:" in recorded or ".hdf5:" in recorded else recorded)
        if not path.is_file():
            raise KsaeError(f"--resume: the run's data file {path} does not exist any more")
        found = file_sha256(path)
        if found != expected:
            raise KsaeError(f"--resume: the run's data file {path} changed since the run started "
                            f"(SHA-256 {found[:16]}..., the run has {expected[:16]}...)")
    return recorded


def check_data_options(typed: set, given: dict, dataset: str, previous: dict):
    """The run's DataSpec; data options given again must equal the run's (they choose its rows)."""
    from ksae_cupy.datasets.user_files import DataSpec

    spec = DataSpec.from_record(dataset, previous.get("data"))
    typed_spec = DataSpec(dataset, **{key: value for key, value in given.items() if key in typed})
    differing = [f"--{key.replace('_', '-')} {given[key]} (the run has {getattr(spec, key)})"
                 for key in sorted(typed & set(given))
                 if getattr(typed_spec.resolved(), key) != getattr(spec, key)]
    if differing:
        raise KsaeError("--resume: options contradict the run's data (they choose the rows it trains on): "
                        + ", ".join(differing))
    return spec


def check_run_dir(run_dir: Path | None, resume: Path) -> None:
    if run_dir is not None and Path(run_dir).resolve() != Path(resume).resolve():
        raise KsaeError(f"--run-dir {run_dir} is not allowed with --resume; the run lives in {resume} "
                        f"(move or copy that folder to continue elsewhere)")


def check_refused(ctx, typed: set, config) -> None:
    """Name every model- or sequence-shaping option whose value differs from the checkpoint's."""
    saved = config.to_dict()
    differing = []
    for name in sorted(typed & set(REFUSED)):
        value = ctx.params[name]
        if name == "no_k_schedule":
            if value and saved["k_start"] is not None:
                differing.append(f"--no-k-schedule (the run has k-start {saved['k_start']})")
            continue
        if name == "lr":
            from ksae_cupy.cli.common import parse_lr

            value = parse_lr(value, None)
            if value == "auto" and saved.get("lr_auto"):
                continue  # the run's rate was derived from its data: the same rate
        if value != saved[name]:
            differing.append(f"--{name.replace('_', '-')} {value} (the run has {saved[name]})")
    if differing:
        raise KsaeError("--resume: options contradict the checkpoint (they shape the model or the batches): "
                        + ", ".join(differing))


def apply_options(ctx, typed: set, trainer) -> list[str]:
    """Apply --epochs, --topk and --step to the resumed run's configuration; return what changed."""
    config, changes = trainer.config, []
    if "epochs" in typed and ctx.params["epochs"] != config.epochs:
        epochs = ctx.params["epochs"]
        check_positive_count("--epochs", epochs, "epochs")
        done = trainer.epoch + (1 if trainer.batch_in_epoch else 0)
        if epochs < done:
            raise KsaeError(f"--epochs {epochs} is not allowed on resume; the run has already trained "
                            f"{done} epochs; use at least {done}")
        change = f"epochs {config.epochs} -> {epochs}"
        if config.k_start is not None:
            # Extended: k goes on as planned instead of climbing back up. Shortened: the
            # schedule shrinks with the run, so that k is still reached.
            planned = config.k_schedule_epochs or config.epochs
            config.k_schedule_epochs = min(planned, epochs)
            if epochs < planned:
                change += f" (the k schedule now spans {epochs} epochs)"
        changes.append(change)
        config.epochs = epochs
    if "topk" in typed and ctx.params["topk"] != config.topk:
        changes.append(f"topk {config.topk} -> {ctx.params['topk']}")
        config.topk = ctx.params["topk"]
    if "step" in typed and ctx.params["step"] != config.step:
        changes.append(f"step {config.step} -> {ctx.params['step']}")
        config.step = ctx.params["step"]
    return changes


def run_level(ctx, typed: set, previous: dict) -> dict:
    """Every :data:`RUN_LEVEL` option: as given, else as the run had it (``previous``, its
    config.json), else the default. Paths come back as text, as config.json holds them."""
    values = {name: ctx.params[name] if name in typed or name not in previous else previous[name]
              for name in RUN_LEVEL}
    if isinstance(values["data_dir"], Path):
        values["data_dir"] = str(values["data_dir"])
    return values
