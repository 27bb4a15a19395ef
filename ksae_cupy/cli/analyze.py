"""``ksae-analyze``: section 3's analysis of a trained dictionary (coherence, ITI, Theorem 3.1),
encoding variants, and the side-by-side comparison with sparse coding.
"""
from __future__ import annotations

import click

from ksae_cupy.cli.version import VersionedGroup, version_option
from ksae_cupy.cli.common import (CONTEXT, DATA_DIR, DEVICE, QUIET, RUN_DIR, check_run_outputs, run_data_options,
                                   data_overrides, progress_printer, report_errors, write_json)
from ksae_cupy.cli.run_options import SPLITS
from ksae_cupy.errors import KsaeError


@click.group(cls=VersionedGroup, context_settings=CONTEXT)
@version_option
def analyze_command():
    """Section 3 of the paper on trained runs: coherence, ITI sparse recovery, Theorem 3.1."""


@analyze_command.command("coherence", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@report_errors
def analyze_coherence(run_dir):
    """Mutual coherence mu(W) of the learnt dictionary (unit-norm columns), with the Welch
    bound and the largest k for which Theorem 3.1's condition can hold. Writes RUN_DIR/coherence.json."""
    from ksae_cupy.evaluation.analysis import coherence_report
    from ksae_cupy.evaluation.trained_run import open_run

    run = open_run(run_dir)
    report = coherence_report(run.params["W_dh"])
    report["k"] = run.k
    write_json(run.path / "coherence.json", report)
    click.echo(f"mu(W) = {report['mu']:.4f} (Welch bound {report['welch_bound']:.4f}; mean |<w_i,w_j>| "
               f"{report['mean_abs_inner']:.4f}, 99th percentile {report['p99_abs_inner']:.4f}); "
               f"{report['zero_norm_columns']} zero-norm columns of {report['H']}")
    click.echo(f"Theorem 3.1 can hold only for k <= {report['theorem_max_k']} (k mu <= 1/2); this run has k={run.k}")


@analyze_command.command("iti", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--n-samples", type=int, default=1000, help="Rows of the split to analyse.")
@click.option("--split", type=click.Choice(SPLITS), default="test", help="Split whose rows are analysed.")
@click.option("--k", "k", type=int, default=None, help="Sparsity of ITI and of the encoder. [default: the run's k]")
@click.option("--max-iter", type=int, default=100, help="ITI iterations at most.")
@run_data_options
@DEVICE
@DATA_DIR
@QUIET
@report_errors
def analyze_iti(run_dir, n_samples, split, k, max_iter, device, data_dir, quiet, **data):
    """How often the encoder's one-step support supp_k(W^T x + b) equals the support ITI
    converges to (section 3.1-3.2). Writes RUN_DIR/iti.json."""
    from ksae_cupy.evaluation.analysis import encoder_vs_iti
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.evaluation.trained_run import dataset_split, load_run_dataset, open_run

    run = open_run(run_dir)
    check_run_outputs(run_dir, "iti.json")
    k = run.k if k is None else k
    if not 1 <= k <= min(run.params["W_dh"].shape):
        raise KsaeError(f"--k {k} is not allowed; use 1 <= k <= min(D, H) = {min(run.params['W_dh'].shape)}")
    if n_samples < 1 or max_iter < 1:
        raise KsaeError("--n-samples and --max-iter must be positive")
    backend = resolve_device(device)
    say = progress_printer(quiet)
    X_nd = dataset_split(load_run_dataset(run, data_dir, say, data_overrides(data)), split)[0][:n_samples]
    say(f"ITI on {len(X_nd)} {split} rows, k={k}, at most {max_iter} iterations; {backend.description}")
    params = {name: backend.asarray(value) for name, value in run.params.items()}
    report = encoder_vs_iti(params, backend.asarray(X_nd), k, max_iter)
    write_json(run.path / "iti.json", report)
    enc, first = report["encoder_vs_iti"], report["first_step_vs_iti"]
    click.echo(f"ITI converged on {100 * report['iti_converged_rate']:.1f}% of rows "
               f"(mean {report['iti_mean_iterations']:.1f} iterations)")
    click.echo(f"encoder supp_k(W^T x + b) = ITI support on {100 * enc['exact_support_rate']:.1f}% of rows "
               f"(mean overlap {100 * enc['mean_overlap']:.1f}%)")
    click.echo(f"first ITI step supp_k(W^T (x - c)) = ITI support on {100 * first['exact_support_rate']:.1f}% "
               f"(mean overlap {100 * first['mean_overlap']:.1f}%)")
    click.echo(f"relative residual: encoder support {report['relative_residual_encoder_support']:.4f}, "
               f"ITI {report['relative_residual_iti']:.4f}")


# Theorem 3.1 on synthetic dictionaries, and the feature-side commands (the paper's evaluation
# choices; sparse coding beside the encoder), live in modules of their own: subcommands all the same.
from ksae_cupy.cli.analyze_features import analyze_compare, analyze_variants  # noqa: E402
from ksae_cupy.cli.analyze_theorem import analyze_theorem  # noqa: E402

analyze_command.add_command(analyze_theorem, "theorem")
analyze_command.add_command(analyze_variants, "variants")
analyze_command.add_command(analyze_compare, "compare")
