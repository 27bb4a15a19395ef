"""``ksae-data``: fetch, verify and list the built-in datasets under the data root; write a run's codes as the
dataset of a next layer; restore a checkpoint kept in git history into a clone's results/; export a run's
weights for other tools (safetensors, .npz, PyTorch)."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.common import GivenPath, report_errors
from ksae_cupy.session.export import FORMATS, LAYOUTS
from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.outputs import OVERWRITE_HELP, check_output


DATA_DIR = click.option("--data-dir", type=GivenPath(path_type=Path), default=None,
                        help="Data root. [default: $KSAE_DATA_DIR or ./data]")


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


@data_command.command("codes")
@click.argument("run_dir", type=GivenPath(path_type=Path))
@click.argument("out", type=GivenPath(path_type=Path))
@click.option("--alpha", type=float, default=None,
              help="A ksae-train run's codes keep alpha*k units (1: the plain k-sparse codes). A ksae-baseline "
                   "run's features are every sigmoid unit. [default: the alpha RUN_DIR's ksae-eval chose, else 3, "
                   "the paper's]")
@click.option("--layout", type=click.Choice(("csr", "topk", "dense")), default=None,
              help="csr: a SciPy CSR matrix (.npz, scipy.sparse.load_npz reads it, and ksae-train); topk: an .npz "
                   "of indices and values (N x alpha*k each); dense: an N x H .npy. [default: by OUT's suffix, csr "
                   "for .npz, dense for .npy; dense for a ksae-baseline run, whose features are all non-zero]")
@DATA_DIR
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@report_errors
def data_codes(run_dir, out, alpha, layout, data_dir, overwrite):
    """Write RUN_DIR's codes of its training rows to OUT: layer 2's dataset (section 4.6).

    RUN_DIR is a ksae-train run (its alpha*k-sparse codes) or a ksae-baseline run (every sigmoid unit of
    the uncorrupted input). OUT is an .npz (--layout csr or topk) or an .npy (--layout dense). Then (csr or dense):
    ksae-train OUT (or ksae-baseline OUT --model ...) trains the next layer, and ksae-finetune RUN_DIR
    LAYER2_RUN fine-tunes both. A JSON file beside OUT, named as OUT with the suffix .json (codes.npz:
    codes.json), records where the codes came from (RUN_DIR's checkpoint SHA-256 and epoch): the next
    layer records it, and ksae-finetune checks it.
    """
    from ksae_cupy.supervised.pretrain import CODE_LAYOUTS, layout_of, write_codes
    from ksae_cupy.session.provenance import origin_file

    if alpha is not None and (alpha <= 0 or alpha != alpha):
        raise KsaeError(f"--alpha {alpha} is not allowed; use a positive number (the paper's 3, or 1)")
    from ksae_cupy.supervised.baseline_trainer import is_baseline_run

    baseline = is_baseline_run(run_dir)
    layout = layout or ("dense" if baseline else layout_of(out))
    if out.suffix != CODE_LAYOUTS[layout]:
        raise KsaeError(f"OUT {out} is not allowed with --layout {layout}; name an {CODE_LAYOUTS[layout]} file "
                        f"(ksae-train reads it)")
    if baseline and alpha is not None:
        raise KsaeError(f"--alpha {alpha} has no effect on {run_dir}, a ksae-baseline run folder: its codes are "
                        f"every sigmoid unit; leave --alpha out")
    if baseline and layout != "dense":
        raise KsaeError(f"--layout {layout} does not fit {run_dir}, a ksae-baseline run folder: its features are "
                        f"all non-zero; leave --layout out (dense)")
    for path in (out, origin_file(out)):  # the codes and their origin, OUT.json
        check_output(path, "OUT", runs=[run_dir], overwrite=overwrite)
    info = write_codes(run_dir, out, alpha=alpha, data_dir=data_dir, layout=layout)
    alpha_words = "" if info["alpha"] is None else f", alpha {info['alpha']:g}"
    click.echo(f"wrote {out}: {info['shape'][0]} x {info['shape'][1]} {layout} float32{alpha_words}, from {run_dir} "
               f"after {info['epochs_trained']} epochs, in {info['seconds']:.1f} s; their origin in "
               f"{origin_file(out)}")


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


@data_command.command("export")
@click.argument("run_dir", type=GivenPath(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(tuple(FORMATS)), default=None,
              help="safetensors and npz need nothing; torch (a PyTorch state dict, .pt) needs PyTorch. "
                   "[default: from --out's suffix, else safetensors]")
@click.option("--layout", type=click.Choice(LAYOUTS), default="linear", show_default=True,
              help="linear: two nn.Linear layers' weights in one file; saelens or sparsify: a folder those "
                   "libraries load (W_enc, b_enc, W_dec, b_dec or sparsify's names, and cfg.json).")
@click.option("--out", type=GivenPath(path_type=Path), default=None,
              help="The file (or, for --layout saelens/sparsify, the folder) to write; written whole or not at "
                   "all. [default: RUN_DIR's name in the current folder: RUN.safetensors, or RUN-saelens/]")
@click.option("--alpha", type=float, default=None,
              help="Recorded with the weights: features keep the alpha*k largest units (1: the k-sparse codes). "
                   "[default: the alpha RUN_DIR's ksae-eval chose, else 3, the paper's]")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@report_errors
def data_export(run_dir, fmt, layout, out, alpha, overwrite):
    """Write RUN_DIR's autoencoder as two nn.Linear layers' weights (docs/guide/export.md).

    RUN_DIR is a ksae-train run folder or a checkpoint file. The file holds encoder.weight (H x D),
    encoder.bias, decoder.weight (D x H, the encoder's transpose) and decoder.bias, input.mean, and
    the run's units.firing_count and units.dead (from its units.json), with k, alpha, where alpha came
    from and the input scale in its metadata; a --center-input run's mean is folded into the biases.

    \b
    Examples:
      ksae-data export runs/mnist-h1000-k25-20261121-101500       (mnist-h1000-k25-20261121-101500.safetensors)
      ksae-data export RUN_DIR --format npz --out model.npz
      ksae-data export RUN_DIR --layout saelens --out my-sae      (SAELens: SAE.load_from_disk("my-sae"))
    """
    from ksae_cupy.session.export import default_path, export

    if alpha is not None and not 1 <= alpha < float("inf"):
        raise KsaeError(f"--alpha {alpha} is not allowed; use a finite alpha >= 1 (the paper's 3, or 1)")
    out = default_path(run_dir, fmt, layout) if out is None else out
    if layout == "linear":  # a file; a layout's folder is refused by the export itself when it exists
        check_output(out, "--out", runs=[run_dir], overwrite=overwrite)
    info = export(run_dir, out, format=fmt, alpha=alpha, layout=layout)
    dead = "" if info["n_dead"] is None else f", {info['n_dead']} dead units"
    click.echo(f"wrote {out}: encoder {info['n_hidden']} x {info['n_inputs']} and decoder {info['n_inputs']} x "
               f"{info['n_hidden']} {info['dtype']}, k {info['k']}, alpha {info['alpha']:g} ({info['alpha_from']}), "
               f"alpha*k {info['alpha_k']}, {info['activation']} units{dead}, from {run_dir} after {info['epoch']} "
               f"epochs")


def checked_root(data_dir) -> Path:
    """The data root (--data-dir, else $KSAE_DATA_DIR or ./data). One that is a file would read as
    "no files present": say what it is instead."""
    from ksae_cupy.datasets import data_root

    root = data_dir or data_root()
    if Path(root).exists() and not Path(root).is_dir():
        raise KsaeError(f"--data-dir {root} is a file, not a folder; give the folder that holds the datasets")
    return root
