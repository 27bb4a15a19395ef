"""``ksae-data``: fetch, verify and list the built-in datasets under the data root."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.common import GivenPath, report_errors
from ksae_cupy.errors import KsaeError


DATA_DIR = click.option("--data-dir", type=GivenPath(path_type=Path), default=None,
                        help="Data root. [default: $KSAE_DATA_DIR or ./data]")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    from ksae_cupy.datasets.catalog import verify_all

    root = checked_root(data_dir)
    if not Path(root).exists():  # every file "missing" and exit 0 would pass a mistyped root as verified
        raise KsaeError(f"data root {root} does not exist: nothing to verify; give the folder that holds the "
                        f"datasets (--data-dir or $KSAE_DATA_DIR), or fetch one there with ksae-data fetch NAME")
    rows = verify_all(root)
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
    from ksae_cupy.datasets.catalog import list_datasets

    root = checked_root(data_dir)
    if not Path(root).exists():
        click.echo(f"note: data root {root} does not exist yet (ksae-data fetch NAME creates it)", err=True)
    for name, description, state in list_datasets(root):
        click.echo(f"{name:14s} {state:44s} {description}")


def checked_root(data_dir) -> Path:
    """The data root (--data-dir, else $KSAE_DATA_DIR or ./data). One that is a file would read as
    "no files present": say what it is instead."""
    from ksae_cupy.datasets import data_root

    root = data_dir or data_root()
    if Path(root).exists() and not Path(root).is_dir():
        raise KsaeError(f"--data-dir {root} is a file, not a folder; give the folder that holds the datasets")
    return root
