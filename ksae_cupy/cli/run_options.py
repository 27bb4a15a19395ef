"""The options and helpers of the commands that read a run folder (ksae-eval, ksae-plot, ksae-analyze)."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.atomic import write_json_atomic
from ksae_cupy.backend import DEVICES
from ksae_cupy.cli.given_path import GivenPath

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


def progress_printer(quiet: bool):
    """Progress lines go to stderr so stdout stays the result."""
    return (lambda *a, **k: None) if quiet else (lambda msg: click.echo(msg, err=True))


PATH = GivenPath(path_type=Path)
RUN_DIR = PATH  # existence is checked by open_run, with a one-line error
DEVICE = click.option("--device", default="auto", help=f"{DEVICES} (auto: a GPU when one answers, else the CPU).")
DATA_DIR = click.option("--data-dir", type=PATH, default=None,
                        help="Data root. [default: $KSAE_DATA_DIR or ./data]")
QUIET = click.option("--quiet", is_flag=True, help="No progress lines on stderr.")


def check_run_outputs(run_dir: Path, *names: str) -> None:
    """Before minutes of work: the files a command will write into ``run_dir`` can be written
    (a missing folder is left to the command's own one-line error)."""
    from ksae_cupy.session.outputs import check_output

    if Path(run_dir).is_dir():
        for name in names:  # the command's own files in the run folder: replaced when it runs again
            check_output(Path(run_dir) / name, "RUN_DIR output", runs=[run_dir], overwrite=True)


def write_json(path: Path, payload: dict) -> None:
    write_json_atomic(path, payload)


SPLITS = ("test", "valid", "train")  # --split's choices (evaluation.trained_run.dataset_split)
