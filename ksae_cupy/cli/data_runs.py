"""``ksae-data codes`` and ``ksae-data export``: a run folder's codes written as the dataset of a next layer, and its
weights for other tools. Subcommands of :mod:`ksae_cupy.cli.data`'s group."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.common import DATA_DIR, GivenPath, report_errors
from ksae_cupy.errors import KsaeError
from ksae_cupy.session.export import FORMATS, LAYOUTS
from ksae_cupy.session.outputs import OVERWRITE_HELP, check_output


@click.command("codes")
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
    from ksae_cupy.supervised.pretrain import write_asked_codes

    click.echo(write_asked_codes(run_dir, out, alpha, layout, data_dir, overwrite))


@click.command("export")
@click.argument("run_dir", type=GivenPath(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(tuple(FORMATS)), default=None,
              help="safetensors and npz need nothing; torch (a PyTorch state dict, .pt) needs PyTorch. "
                   "[default: from --out's suffix, else safetensors]")
@click.option("--layout", type=click.Choice(LAYOUTS), default="linear", show_default=True,
              help="linear: two nn.Linear layers' weights in one file; saelens or sparsify: a folder those "
                   "libraries load (W_enc, b_enc, W_dec, b_dec or sparsify's names, and cfg.json), our "
                   "own tensors (input mean, unit counts) beside them in ksae_cupy.safetensors.")
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
