"""``ksae-data``: fetch, verify and list the built-in datasets under the data root; write a run's codes as the
dataset of a next layer; restore a checkpoint kept in git history into a clone's results/; export a run's
weights for other tools (safetensors, .npz, PyTorch)."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.common import DATA_DIR, GivenPath, report_errors
from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.errors import KsaeError


@click.group(cls=VersionedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@version_option
def data_command():
    """Fetch, verify and list the datasets under the data root ($KSAE_DATA_DIR or ./data)."""


@data_command.command("fetch")
@click.argument("name")
@DATA_DIR
@report_errors
def data_fetch(name, data_dir):
    """Download NAME's files, verify their SHA-256 and put them in place."""
    from ksae_cupy.datasets import data_root
    from ksae_cupy.datasets.catalog import fetch_dataset

    root = data_dir or data_root()
    paths = fetch_dataset(name, root, log=lambda msg: click.echo(msg, err=True))
    for path in paths.values():
        click.echo(f"ok  {path}")


@data_command.command("verify")
@DATA_DIR
@report_errors
def data_verify(data_dir):
    """Check every dataset file present under the data root; name the bad ones."""
    from ksae_cupy.datasets.catalog import checked_root, verify_all

    rows = verify_all(checked_root(data_dir))
    bad = [row for row in rows if row[2] == "bad"]
    for dataset, filename, status, detail in rows:
        click.echo(f"{status:8s} {dataset:14s} {filename}{'  ' + detail if detail else ''}")
    if bad:
        raise KsaeError(f"{len(bad)} file(s) fail verification: " + ", ".join(f"{d}/{f}" for d, f, _, _ in bad))


@data_command.command("list")
@DATA_DIR
@report_errors
def data_list(data_dir):
    """The built-in datasets and whether their files are present."""
    from ksae_cupy.datasets.catalog import checked_root, list_datasets

    root = checked_root(data_dir)
    if not Path(root).exists():
        click.echo(f"note: data root {root} does not exist yet (ksae-data fetch NAME creates it)", err=True)
    for name, description, state in list_datasets(root):
        click.echo(f"{name:14s} {state:44s} {description}")


@data_command.command("restore-checkpoint")
@click.argument("paths", nargs=-1, type=GivenPath(path_type=Path))
@click.option("--all", "everything", is_flag=True, help="Every checkpoint results/checkpoints.json lists.")
@report_errors
def data_restore_checkpoint(paths, everything):
    """Put a checkpoint of results/ back in place from git history, its SHA-256 checked.

    PATHS are checkpoints (or the run folders holding them) that results/checkpoints.json lists: they were
    removed from the tree to keep a clone small. Each is read from the commit that holds it (fetched with
    git fetch --depth=1 origin COMMIT when a shallow clone lacks it), checked against the manifest's SHA-256
    and size, and only then renamed into place. Run it inside the clone.
    """
    from ksae_cupy.reports.kept_checkpoints import repository_root, restore, select

    if bool(paths) == everything:
        raise KsaeError("give the checkpoints to restore (PATH ..., a checkpoint or its run folder) or --all, "
                        "not both and not neither")
    root = repository_root(paths[0] if paths else Path.cwd())
    for entry in select(root, list(paths), everything):
        click.echo(restore(root, entry, log=lambda msg: click.echo(msg, err=True)))


# The subcommands that read a run folder (codes, export) live in a module of their own: subcommands all the same.
from ksae_cupy.cli.data_runs import data_codes, data_export  # noqa: E402

data_command.add_command(data_codes, "codes")
data_command.add_command(data_export, "export")
