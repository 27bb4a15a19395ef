"""``ksae-analyze variants`` and ``ksae-analyze compare``: the feature evaluation under the choices
the paper leaves open, and the k-sparse encoder beside sparse coding (OMP, dictionary learning).
Subcommands of :mod:`ksae_cupy.cli.analyze`'s group."""
from __future__ import annotations

import click

from ksae_cupy.cli.common import (CONTEXT, DATA_DIR, DEVICE, QUIET, RUN_DIR, check_run_outputs, data_overrides,
                                  progress_printer, report_errors, run_data_options, write_json)
from ksae_cupy.errors import KsaeError


@click.command("variants", context_settings=CONTEXT)
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
    from ksae_cupy.evaluation.trained_run import load_run_dataset, open_run
    from ksae_cupy.evaluation.selection import parse_alphas, parse_l2
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

@click.command("compare", context_settings=CONTEXT)
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
    from ksae_cupy.evaluation.trained_run import load_run_dataset, open_run
    from ksae_cupy.evaluation.selection import parse_l2

    require_sklearn()
    run = open_run(run_dir)
    check_run_outputs(run_dir, "compare.json")
    l2_list = parse_l2(l2_text)
    if n_train < 1:
        raise KsaeError(f"--n-train {n_train} is not allowed; use a positive number")
    if dict_seconds == "none":
        seconds = None
    elif dict_seconds == "auto":
        from ksae_cupy.session.runs import RunFolder

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
