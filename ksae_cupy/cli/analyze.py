"""``ksae-analyze``: section 3's analysis of a trained dictionary (coherence, ITI, Theorem 3.1),
encoding variants, and the side-by-side comparison with sparse coding.
"""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.cli.common import (GivenPath, CONTEXT, DATA_DIR, DEVICE, QUIET, RUN_DIR, check_run_outputs, run_data_options,
                                   data_overrides, dataset_split, progress_printer, report_errors, write_json)
from ksae_cupy.errors import KsaeError


@click.group(context_settings=CONTEXT)
def analyze_command():
    """Section 3 of the paper on trained runs: coherence, ITI sparse recovery, Theorem 3.1."""


@analyze_command.command("coherence", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@report_errors
def analyze_coherence(run_dir):
    """Mutual coherence mu(W) of the learnt dictionary (unit-norm columns), with the Welch
    bound and the largest k for which Theorem 3.1's condition can hold. Writes RUN_DIR/coherence.json."""
    from ksae_cupy.evaluation.analysis import coherence_report
    from ksae_cupy.evaluation.features import open_run

    run = open_run(run_dir)
    report = coherence_report(run.params["W_dh"])
    report["k"] = run.k
    write_json(run.path / "coherence.json", report)
    click.echo(f"mu(W) = {report['mu']:.4f} (Welch bound {report['welch_bound']:.4f}; mean |<w_i,w_j>| "
               f"{report['mean_abs_inner']:.4f}, 99th percentile {report['p99_abs_inner']:.4f}); "
               f"{report['dead_columns']} dead columns of {report['H']}")
    click.echo(f"Theorem 3.1 can hold only for k <= {report['theorem_max_k']} (k mu <= 1/2); this run has k={run.k}")


@analyze_command.command("iti", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--n-samples", type=int, default=1000, help="Rows of the split to analyse.")
@click.option("--split", type=click.Choice(["test", "valid", "train"]), default="test", help="Split whose rows are analysed.")
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
    from ksae_cupy.evaluation.features import load_run_dataset, open_run

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


@analyze_command.command("theorem", context_settings=CONTEXT)
@click.option("--dictionary", default="incoherent",
              help="incoherent ([I | Hadamard], mu = 1/sqrt(D)), gaussian, or a RUN_DIR (its trained W).")
@click.option("--dim", "D", type=int, default=256, help="D, the signal dimension (synthetic dictionaries).")
@click.option("--atoms", "H", type=int, default=512, help="H, the number of atoms (gaussian only; incoherent has 2D).")
@click.option("--k", "k", type=int, default=4, help="Non-zeros per code.")
@click.option("--n", "n", type=int, default=1000, help="Codes drawn per case.")
@click.option("--seed", type=int, default=0, help="Seed of the drawn codes (and of a gaussian dictionary).")
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None, help="Also write the report as JSON.")
@report_errors
def analyze_theorem(dictionary, D, H, k, n, seed, output):
    """Theorem 3.1: x = W z with k-sparse z drawn to satisfy and to violate k mu <= z_k / (2 z_1);
    how often supp_k(W^T x) finds the support of z in each case."""
    import numpy as np

    from ksae_cupy.evaluation.analysis import gaussian_dictionary, incoherent_dictionary, theorem_experiment
    from ksae_cupy.paths import check_output_file

    if output:
        check_output_file(output, "-o")  # before the experiment, not after it
    if n < 1 or D < 1 or H < 1:
        raise KsaeError("--n, --dim and --atoms must be positive")
    from ksae_cupy.training.options import check_seed

    check_seed("--seed", seed)
    if dictionary == "incoherent":
        W_dh = incoherent_dictionary(D)
    elif dictionary == "gaussian":
        W_dh = gaussian_dictionary(D, H, np.random.default_rng(seed))
    else:
        from ksae_cupy.evaluation.features import open_run

        W_dh = open_run(dictionary).params["W_dh"]
    report = theorem_experiment(W_dh, k, n, seed)
    report["dictionary"] = dictionary
    click.echo(f"{dictionary} dictionary {report['D']}x{report['H']}: mu = {report['mu']:.4f}, k = {k}, "
               f"k mu = {report['k_mu']:.3f}")
    sat, vio = report["recovery_when_satisfied"], report["recovery_when_violated"]
    click.echo("condition holds:    " + (f"support recovered for {100 * sat:.1f}% of {n} codes" if sat is not None
                                       else "impossible on this dictionary (k mu > 1/2)"))
    click.echo("condition violated: " + (f"support recovered for {100 * vio:.1f}% of {n} codes" if vio is not None
                                       else "impossible for k = 1"))
    if output:
        write_json(output, report)


@analyze_command.command("variants", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--variants", "variants_text", default="sparse,relu,standardized,early-stop-50,early-stop-150",
              help="Comma-separated: sparse (the ksae-eval protocol), relu, standardized, early-stop-N.")
@click.option("--alphas", default="1,2,3,4", help="Comma-separated alpha grid of every variant.")
@click.option("--l2", "l2_text", default="1e-3,1e-4,1e-5", help="Comma-separated L2 grid (not for early-stop-N).")
@click.option("--max-iter", type=int, default=500, help="L-BFGS iterations at most (variants without early stopping).")
@run_data_options
@DEVICE
@DATA_DIR
@QUIET
@report_errors
def analyze_variants(run_dir, variants_text, alphas, l2_text, max_iter, device, data_dir, quiet, **data):
    """The feature evaluation under each choice the paper leaves open (ReLU at encoding,
    standardised features, early stopping instead of L2), every one chosen on validation and
    tested once. Writes RUN_DIR/variants.json and variants.md."""
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.evaluation.features import load_run_dataset, open_run, parse_alphas, parse_l2
    from ksae_cupy.evaluation.variants import markdown, parse_variants, run_variants

    variants, alpha_list, l2_list = parse_variants(variants_text), parse_alphas(alphas), parse_l2(l2_text)
    check_run_outputs(run_dir, "variants.json", "variants.md")
    if max_iter < 1:
        raise KsaeError(f"--max-iter {max_iter} is not allowed; use a positive number of iterations")
    say = progress_printer(quiet)
    overrides = data_overrides(data)  # without any, run_variants loads the run's own data after its checks
    dataset = load_run_dataset(open_run(run_dir), data_dir, say, overrides) if overrides else None
    result = run_variants(run_dir, variants, alpha_list, l2_list, max_iter, resolve_device(device), data_dir,
                          log=say, dataset=dataset)
    click.echo(markdown(result))

@analyze_command.command("compare", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--alpha", type=float, default=1.0, help="Non-zeros per row: alpha*k, for every method.")
@click.option("--l2", "l2_text", default="1e-3,1e-4", help="Comma-separated L2 grid of the classifier.")
@click.option("--n-train", type=int, default=10000, help="Training rows for the classifiers (OMP is slow).")
@click.option("--dict-seconds", default="none",
              help="Also learn a dictionary by sparse coding (scikit-learn) for this many seconds; "
                   "'auto' = the run's own training time; 'none' = skip.")
@run_data_options
@DATA_DIR
@QUIET
@report_errors
def analyze_compare(run_dir, alpha, l2_text, n_train, dict_seconds, data_dir, quiet, **data):
    """k-sparse encoder vs OMP on the same dictionary (same number of non-zeros), and vs a
    dictionary learnt by MiniBatchDictionaryLearning in the same wall time: test error and
    encoding speed (needs: pip install ksae-cupy[compare]). Writes RUN_DIR/compare.json."""
    from ksae_cupy.evaluation.compare import compare_encoders, require_sklearn
    from ksae_cupy.evaluation.features import load_run_dataset, open_run, parse_l2

    require_sklearn()
    run = open_run(run_dir)
    check_run_outputs(run_dir, "compare.json")
    l2_list = parse_l2(l2_text)
    if n_train < 1:
        raise KsaeError(f"--n-train {n_train} is not allowed; use a positive number")
    if dict_seconds == "none":
        seconds = None
    elif dict_seconds == "auto":
        from ksae_cupy.training.runs import RunFolder

        metrics = run.path / "metrics.jsonl"
        records = RunFolder(run.path).read_metrics()
        seconds = float(sum(r.get("seconds", 0.0) for r in records))
        if seconds <= 0:
            raise KsaeError(f"--dict-seconds auto: {metrics} records no training time; give a number of seconds")
    else:
        try:
            seconds = float(dict_seconds)
        except ValueError:
            raise KsaeError(f"--dict-seconds {dict_seconds!r}: use a number of seconds, auto or none") from None
        if seconds <= 0:
            raise KsaeError(f"--dict-seconds {dict_seconds}: use a positive number of seconds")
    say = progress_printer(quiet)
    dataset = load_run_dataset(run, data_dir, say, data_overrides(data))
    report = compare_encoders(run.params, run.k, dataset, alpha, l2_list, n_train, seconds, log=say)
    write_json(run.path / "compare.json", report)
    click.echo("| method | test error | test encoding rows/s |\n|---|---|---|")
    for name, m in report["methods"].items():
        click.echo(f"| {name} | {100 * m['test_error']:.2f}% | {m['rows_per_second']:.0f} |")
