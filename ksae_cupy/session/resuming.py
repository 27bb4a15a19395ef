"""``--resume``: every option given is applied, refused or checked against the run, as its declared
policy says (:mod:`ksae_cupy.session.fields`); every option not given keeps the run's value.

``options`` are the command's values (:func:`~ksae_cupy.session.fields.options_class`), ``options.given`` the names
typed; a policy reads each option it lists by its name. Messages name the options as the command line spells them.
"""
from __future__ import annotations

from pathlib import Path

from ksae_cupy.errors import KsaeError
from ksae_cupy.training.options import check_positive_count
from ksae_cupy.paths import file_sha256
from ksae_cupy.session.runs import dataset_record
from ksae_cupy.training.wording import position


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def where_line(folder_path: Path, epoch: int, batch_in_epoch: int, step: int) -> str:
    return f"resuming {folder_path} {position(epoch, batch_in_epoch)} (step {step})"


def run_level(names, options, previous: dict) -> dict:
    """Each of ``names`` the command offers: as given, else as the run had it (``previous``, its config.json),
    else the default. Paths come back as text, as config.json holds them."""
    settings = {name: getattr(options, name) if name in options.given or name not in previous else previous[name]
                for name in names if hasattr(options, name)}
    if isinstance(settings.get("data_dir"), Path):
        settings["data_dir"] = str(settings["data_dir"])
    return settings


def run_level_changes(settings: dict, given: set, previous: dict) -> list[str]:
    """The settings given that changed the run's (``previous``, its config.json), as ``comm mpi -> nccl``."""
    return [f"{name.replace('_', '-')} {previous[name]} -> {value}" for name, value in settings.items()
            if name in given and name in previous and value != previous[name]]


def check_overwrite(resume: Path, overwrite: bool) -> None:
    if overwrite:
        raise KsaeError(f"--overwrite contradicts --resume: --resume continues the run in {resume}, --overwrite "
                        f"would discard it; give one")


def check_run_dir(run_dir: Path | None, resume: Path) -> None:
    if run_dir is not None and Path(run_dir).resolve() != Path(resume).resolve():
        raise KsaeError(f"--run-dir {run_dir} is not allowed with --resume; the run lives in {resume} "
                        f"(move or copy that folder to continue elsewhere)")


def check_dataset(dataset: str | None, previous: dict) -> str:
    """The run's dataset; a DATASET given again must name the same data, and a user file must
    still hold the bytes it held when the run started. A user file given at another path is the
    run's data moved (run folders and their data travel between machines) when its bytes are the
    run's, by SHA-256: that path is returned, and the run records it from then on."""
    recorded = previous["dataset"]
    expected = previous.get("dataset_sha256")
    if dataset is not None and dataset_record(dataset, False)["dataset"] != dataset_record(recorded, False)["dataset"]:
        moved = dataset_record(dataset, False)["dataset"]
        moved_file = _data_file(moved)
        if expected and _member(moved) == _member(recorded) and moved_file.is_file() \
                and file_sha256(moved_file) == expected:
            return moved
        raise KsaeError(f"--resume: DATASET {dataset!r} contradicts the run's dataset {recorded!r}"
                        + (" (a moved data file is taken when its bytes are the run's; these are not)"
                           if expected and moved_file.is_file() else ""))
    if expected:
        path = _data_file(recorded)
        if not path.is_file():
            raise KsaeError(f"--resume: the run's data file {path} does not exist any more; if it moved, give its "
                            f"new path as DATASET (its bytes are checked against the run's)")
        found = file_sha256(path)
        if found != expected:
            raise KsaeError(f"--resume: the run's data file {path} changed since the run started "
                            f"(SHA-256 {found[:16]}..., the run has {expected[:16]}...); put the run's data back "
                            f"there, or give the run's data at its new path as DATASET")
    return recorded


def _data_file(dataset: str) -> Path:
    """The file of a user dataset as config.json records it (an HDF5 file's ``:member`` dropped)."""
    return Path(dataset.rsplit(":", 1)[0] if ".h5:" in dataset or ".hdf5:" in dataset else dataset)


def _member(dataset: str) -> str:
    return dataset.rsplit(":", 1)[1] if ".h5:" in dataset or ".hdf5:" in dataset else ""


def check_data_options(options, dataset: str, previous: dict):
    """The run's DataSpec; data options given again must equal the run's (they choose its rows)."""
    from ksae_cupy.datasets.user_files import DataSpec

    spec = DataSpec.from_record(dataset, previous.get("data"))
    data_given = {key: getattr(options, key) for key in options.given
                  if key in DataSpec.__dataclass_fields__ and key != "data"}
    typed_spec = DataSpec(dataset, **data_given)
    differing = [f"{flag(key)} {data_given[key]} (the run has {getattr(spec, key)})" for key in sorted(data_given)
                 if getattr(typed_spec.resolved(), key) != getattr(spec, key)]
    if differing:
        raise KsaeError("--resume: options contradict the run's data (they choose the rows it trains on): "
                        + ", ".join(differing))
    return spec


def check_refused(names, options, saved: dict, same=None) -> None:
    """Name every refused option given whose value differs from the run's ``saved`` one.
    ``same(name, value, saved)`` judges where equality is not the test: True (the run's own), a
    text (refused, worded so), or None elsewhere (compared with ``==``)."""
    differing = []
    for name in sorted(options.given & set(names)):
        value = getattr(options, name)
        verdict = same(name, value, saved) if same is not None else None
        if verdict is None:
            verdict = value == saved.get(name) or f"{flag(name)} {value} (the run has {saved.get(name)})"
        if verdict is not True:
            differing.append(verdict)
    if differing:
        raise KsaeError("--resume: options contradict the checkpoint (they shape the model or the batches): "
                        + ", ".join(differing))


def check_epochs(epochs: int, trainer) -> None:
    """``--epochs`` on --resume: at least the epochs begun."""
    check_positive_count("--epochs", epochs, "epochs")
    done = trainer.epoch + (1 if trainer.batch_in_epoch else 0)
    if epochs < max(done, 1):
        raise KsaeError(f"--epochs {epochs} is not allowed on resume; the run has already trained {done} epochs; "
                        f"use at least {max(done, 1)}")


def apply(names, options, trainer) -> list[str]:
    """Apply the options ``names`` given to ``trainer.config`` (--epochs first checked against the
    epochs done; a k schedule keeps the epochs it was planned over, or shrinks with a shortened run so
    that k is still reached); return what changed, as ``epochs 4 -> 8``."""
    config, changes = trainer.config, []
    for name in names:
        if name not in options.given or getattr(options, name) == getattr(config, name):
            continue
        value = getattr(options, name)
        change = f"{name} {getattr(config, name)} -> {value}"
        fields = {name: value}
        if name == "epochs":
            check_epochs(value, trainer)
            if getattr(config, "k_start", None) is not None:
                planned = config.k_schedule_epochs or config.epochs
                fields["k_schedule_epochs"] = min(planned, value)
                if value < planned:
                    change += f" (the k schedule now spans {value} epochs)"
            # check_epochs asks of the epochs all a config's validate does (a positive count), and more
            if hasattr(config, "changed_validly"):
                config.changed_validly(**fields)
                fields = {}
        for field, field_value in fields.items():
            setattr(config, field, field_value)  # validated again where the config is next checked
        changes.append(change)
    return changes
