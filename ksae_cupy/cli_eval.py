"""Command-line entry points for trained runs: ``ksae-eval``, ``ksae-plot``, ``ksae-analyze``.

Thin: parse, open the run folder, call :mod:`evaluate`, :mod:`plots` or :mod:`analysis`.
Results go to stdout (and files in the run folder); progress goes to stderr. A user
mistake -- missing or corrupt checkpoint, unknown run folder, alpha < 1, alpha*k > H -- is
one line ``error: ...`` on stderr and exit status 2, never a traceback.
"""
from __future__ import annotations

import json
from pathlib import Path

import click

from .cli import report_errors
from .errors import KsaeError

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


def _progress(quiet: bool):
    """Progress lines go to stderr so stdout stays the result."""
    return (lambda *a, **k: None) if quiet else (lambda msg: click.echo(msg, err=True))


RUN_DIR = click.Path(path_type=Path)  # existence is checked by open_run, with a one-line error
DEVICE = click.option("--device", default="auto", help="auto (a GPU when one answers, else the CPU), cpu, gpu or gpu:N.")
DATA_DIR = click.option("--data-dir", type=click.Path(path_type=Path), default=None,
                        help="Data root. [default: $KSAE_DATA_DIR or ./data]")
QUIET = click.option("--quiet", is_flag=True, help="No progress lines on stderr.")


# -- ksae-eval -----------------------------------------------------------------------------

@click.command(context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--alphas", default="1,2,3,4", help="Comma-separated alpha values; features keep the alpha*k largest units.")
@click.option("--l2", "l2_text", default="1e-3,1e-4,1e-5", help="Comma-separated L2 strengths of the classifier.")
@click.option("--refit", type=click.Choice(["train+valid", "train"]), default="train+valid",
              help="Data the classifier is refit on once alpha and L2 are chosen on the validation set.")
@click.option("--raw-baseline", is_flag=True, help="Also run the raw-pixel baseline through the same classifier.")
@click.option("--max-iter", type=int, default=500, help="L-BFGS iterations per classifier fit (at most).")
@DEVICE
@DATA_DIR
@QUIET
@report_errors
def eval_command(run_dir, alphas, l2_text, refit, raw_baseline, max_iter, device, data_dir, quiet):
    """Classify with logistic regression on supp_{alpha k}(W^T x + b) features (paper, section 4.5).

    For every alpha and L2 the classifier is fit on the training set and judged on the
    validation set; the best pair is refit and the test error is measured once. Writes
    RUN_DIR/eval.json and RUN_DIR/eval.md and prints the Markdown summary.

    \b
    Examples:
      ksae-eval runs/mnist-h1000-k25-20261121-101500
      ksae-eval RUN_DIR --alphas 1,3 --l2 1e-4 --raw-baseline --device gpu
    """
    from .backend import resolve_device
    from .evaluate import evaluate_run, markdown_report, parse_alphas, parse_l2

    alpha_list, l2_list = parse_alphas(alphas), parse_l2(l2_text)
    if max_iter < 1:
        raise KsaeError(f"--max-iter {max_iter} is not allowed; use a positive number")
    backend = resolve_device(device)
    result = evaluate_run(run_dir, alpha_list, l2_list, refit=refit, raw_baseline=raw_baseline, backend=backend,
                          data_root=data_dir, max_iter=max_iter, log=_progress(quiet))
    click.echo(markdown_report(result), nl=False)
    click.echo(f"wrote {Path(run_dir) / 'eval.json'} and {Path(run_dir) / 'eval.md'}", err=True)


# -- ksae-plot -----------------------------------------------------------------------------

@click.group(context_settings=CONTEXT)
def plot_command():
    """Draw the paper's figures from trained runs (needs: pip install ksae-cupy[plot])."""


def _parse_shape(text):
    if text is None:
        return None
    try:
        h, w = (int(p) for p in text.lower().split("x"))
    except ValueError:
        raise KsaeError(f"--shape {text!r}: use HxW, e.g. 28x28") from None
    if h < 1 or w < 1:
        raise KsaeError(f"--shape {text!r}: sides must be positive")
    return h, w


@plot_command.command("filters", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="PNG file. [default: RUN_DIR/filters.png]")
@click.option("--n", "n_filters", type=int, default=None, help="Draw the first N filters. [default: all]")
@click.option("--cols", type=int, default=None, help="Filters per row. [default: square grid]")
@click.option("--shape", default=None,
              help="Filter image shape HxW. [default: the run's dataset's, else square, sqrt(D / channels)]")
@click.option("--channels", type=click.Choice(["1", "3"]), default=None,
              help="1: grey; 3: colour patches. [default: the run's dataset's, else 1]")
@click.option("--layout", type=click.Choice(["hwc", "chw"]), default="hwc", help="Order of a colour filter's values.")
@click.option("--scale", type=int, default=2, help="Pixels per filter pixel.")
@report_errors
def plot_filters(run_dir, output, n_filters, cols, shape, channels, layout, scale):
    """Each column of W as an image, in a grid (the paper's Figures 1-3)."""
    from .evaluate import open_run
    from .plots import require_matplotlib, save_filter_grid

    require_matplotlib()
    run = open_run(run_dir)
    output = output or run.path / "filters.png"
    image_shape, channels = _parse_shape(shape), None if channels is None else int(channels)
    if image_shape is None and channels is None:  # draw the run's dataset as it is laid out
        from .datasets.catalog import IMAGE_SHAPES

        known = IMAGE_SHAPES.get(run.dataset)
        if known is not None and known[0] * known[1] * (known[2] if len(known) == 3 else 1) == run.params["W_dh"].shape[0]:
            image_shape, channels = known[:2], (known[2] if len(known) == 3 else 1)
    width, height = save_filter_grid(run.params["W_dh"], output, image_shape, channels or 1, layout,
                                     n_filters, cols, scale)
    click.echo(f"wrote {output} ({width}x{height} pixels, k={run.k}, {run.H} filters)")


@plot_command.command("hist", context_settings=CONTEXT)
@click.argument("run_dirs", type=RUN_DIR, nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("activity-histogram.png"), help="PNG file.")
@click.option("--n-samples", type=int, default=1000, help="Rows of the split to encode per run.")
@click.option("--split", type=click.Choice(["test", "valid", "train"]), default="test")
@click.option("--alpha", type=float, default=1.0, help="Encode with the alpha*k largest units.")
@click.option("--bins", type=int, default=100)
@DATA_DIR
@QUIET
@report_errors
def plot_hist(run_dirs, output, n_samples, split, alpha, bins, data_dir, quiet):
    """Histogram of hidden activities for one or more runs (the paper's Figure 6).

    Compare sparsity levels by passing several runs, e.g. k=70, k=15 and a dense linear
    autoencoder (the same trainer with --k equal to --hidden).
    """
    from .evaluate import load_run_dataset, open_run
    from .model import encode
    from .plots import require_matplotlib, save_activity_histograms

    require_matplotlib()
    if n_samples < 1 or bins < 1:
        raise KsaeError("--n-samples and --bins must be positive")
    say = _progress(quiet)
    activities, datasets = {}, {}
    for run_dir in run_dirs:
        run = open_run(run_dir)
        if run.dataset not in datasets:
            datasets[run.dataset] = load_run_dataset(run, data_dir, say)
        X_nd = _split(datasets[run.dataset], split)[0][:n_samples]
        label = f"k={run.k}" + (" (dense)" if run.k == run.H else "") + f" [{run.path.name}]"
        activities[label] = encode(run.params, X_nd.astype(run.params["W_dh"].dtype), run.k, alpha,
                                   activation=run.ckpt.config.get("activation", "linear"))
        say(f"encoded {len(X_nd)} {split} rows with {label}")
    save_activity_histograms(activities, output, bins=bins)
    click.echo(f"wrote {output}")


def _split(dataset, split):
    X, y = getattr(dataset, f"X_{split}"), getattr(dataset, f"y_{split}")
    if X is None:
        raise KsaeError(f"dataset {dataset.name} has no {split} split; use --split valid")
    return X, y


# -- ksae-analyze --------------------------------------------------------------------------

@click.group(context_settings=CONTEXT)
def analyze_command():
    """Section 3 of the paper on trained runs: coherence, ITI sparse recovery, Theorem 3.1."""


@analyze_command.command("coherence", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@report_errors
def analyze_coherence(run_dir):
    """Mutual coherence mu(W) of the learnt dictionary (unit-norm columns), with the Welch
    bound and the largest k for which Theorem 3.1's condition can hold. Writes RUN_DIR/coherence.json."""
    from .analysis import coherence_report
    from .evaluate import open_run

    run = open_run(run_dir)
    report = coherence_report(run.params["W_dh"])
    report["k"] = run.k
    _write_json(run.path / "coherence.json", report)
    click.echo(f"mu(W) = {report['mu']:.4f} (Welch bound {report['welch_bound']:.4f}; mean |<w_i,w_j>| "
               f"{report['mean_abs_inner']:.4f}, 99th percentile {report['p99_abs_inner']:.4f}); "
               f"{report['dead_columns']} dead columns of {report['H']}")
    click.echo(f"Theorem 3.1 can hold only for k <= {report['theorem_max_k']} (k mu <= 1/2); this run has k={run.k}")


@analyze_command.command("iti", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--n-samples", type=int, default=1000, help="Rows of the split to analyse.")
@click.option("--split", type=click.Choice(["test", "valid", "train"]), default="test")
@click.option("--k", "k", type=int, default=None, help="Sparsity of ITI and of the encoder. [default: the run's k]")
@click.option("--max-iter", type=int, default=100, help="ITI iterations at most.")
@DEVICE
@DATA_DIR
@QUIET
@report_errors
def analyze_iti(run_dir, n_samples, split, k, max_iter, device, data_dir, quiet):
    """How often the encoder's one-step support supp_k(W^T x + b) equals the support ITI
    converges to (section 3.1-3.2). Writes RUN_DIR/iti.json."""
    from .analysis import encoder_vs_iti
    from .backend import resolve_device
    from .evaluate import load_run_dataset, open_run

    run = open_run(run_dir)
    k = run.k if k is None else k
    if not 1 <= k <= min(run.params["W_dh"].shape):
        raise KsaeError(f"--k {k} is not allowed; use 1 <= k <= min(D, H) = {min(run.params['W_dh'].shape)}")
    if n_samples < 1 or max_iter < 1:
        raise KsaeError("--n-samples and --max-iter must be positive")
    backend = resolve_device(device)
    say = _progress(quiet)
    X_nd = _split(load_run_dataset(run, data_dir, say), split)[0][:n_samples]
    say(f"ITI on {len(X_nd)} {split} rows, k={k}, at most {max_iter} iterations; {backend.description}")
    params = {name: backend.asarray(value) for name, value in run.params.items()}
    report = encoder_vs_iti(params, backend.asarray(X_nd), k, max_iter)
    _write_json(run.path / "iti.json", report)
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
@click.option("--seed", type=int, default=0)
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None, help="Also write the report as JSON.")
@report_errors
def analyze_theorem(dictionary, D, H, k, n, seed, output):
    """Theorem 3.1: x = W z with k-sparse z drawn to satisfy and to violate k mu <= z_k / (2 z_1);
    how often supp_k(W^T x) finds the support of z in each case."""
    import numpy as np

    from .analysis import gaussian_dictionary, incoherent_dictionary, theorem_experiment

    if n < 1 or D < 1 or H < 1:
        raise KsaeError("--n, --dim and --atoms must be positive")
    if dictionary == "incoherent":
        W_dh = incoherent_dictionary(D)
    elif dictionary == "gaussian":
        W_dh = gaussian_dictionary(D, H, np.random.default_rng(seed))
    else:
        from .evaluate import open_run

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
        _write_json(output, report)


def _write_json(path: Path, payload: dict) -> None:
    import os

    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


@analyze_command.command("variants", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--variants", "variants_text", default="sparse,relu,standardized,early-stop-50,early-stop-150",
              help="Comma-separated: sparse (the ksae-eval protocol), relu, standardized, early-stop-N.")
@click.option("--alphas", default="1,2,3,4", help="Comma-separated alpha grid of every variant.")
@click.option("--l2", "l2_text", default="1e-3,1e-4,1e-5", help="Comma-separated L2 grid (not for early-stop-N).")
@click.option("--max-iter", type=int, default=500, help="L-BFGS iterations at most (variants without early stopping).")
@DEVICE
@DATA_DIR
@QUIET
@report_errors
def analyze_variants(run_dir, variants_text, alphas, l2_text, max_iter, device, data_dir, quiet):
    """The feature evaluation under each choice the paper leaves open (ReLU at encoding,
    standardised features, early stopping instead of L2), every one chosen on validation and
    tested once. Writes RUN_DIR/variants.json and variants.md."""
    from .backend import resolve_device
    from .evaluate import parse_alphas, parse_l2
    from .variants import markdown, parse_variants, run_variants

    variants, alpha_list, l2_list = parse_variants(variants_text), parse_alphas(alphas), parse_l2(l2_text)
    if max_iter < 1:
        raise KsaeError(f"--max-iter {max_iter} is not allowed; use a positive number of iterations")
    result = run_variants(run_dir, variants, alpha_list, l2_list, max_iter, resolve_device(device), data_dir,
                          log=_progress(quiet))
    click.echo(markdown(result))

@analyze_command.command("compare", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR)
@click.option("--alpha", type=float, default=1.0, help="Non-zeros per row: alpha*k, for every method.")
@click.option("--l2", "l2_text", default="1e-3,1e-4", help="Comma-separated L2 grid of the classifier.")
@click.option("--n-train", type=int, default=10000, help="Training rows for the classifiers (OMP is slow).")
@click.option("--dict-seconds", default="none",
              help="Also learn a dictionary by sparse coding (scikit-learn) for this many seconds; "
                   "'auto' = the run's own training time; 'none' = skip.")
@DATA_DIR
@QUIET
@report_errors
def analyze_compare(run_dir, alpha, l2_text, n_train, dict_seconds, data_dir, quiet):
    """k-sparse encoder vs OMP on the same dictionary (same number of non-zeros), and vs a
    dictionary learnt by MiniBatchDictionaryLearning in the same wall time: test error and
    encoding speed (needs: pip install ksae-cupy[compare]). Writes RUN_DIR/compare.json."""
    from .compare import compare_encoders, require_sklearn
    from .evaluate import load_run_dataset, open_run, parse_l2

    require_sklearn()
    run = open_run(run_dir)
    l2_list = parse_l2(l2_text)
    if n_train < 1:
        raise KsaeError(f"--n-train {n_train} is not allowed; use a positive number")
    if dict_seconds == "none":
        seconds = None
    elif dict_seconds == "auto":
        metrics = run.path / "metrics.jsonl"
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
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
    say = _progress(quiet)
    dataset = load_run_dataset(run, data_dir, say)
    report = compare_encoders(run.params, run.k, dataset, alpha, l2_list, n_train, seconds, log=say)
    _write_json(run.path / "compare.json", report)
    click.echo(f"| method | test error | test encoding rows/s |\n|---|---|---|")
    for name, m in report["methods"].items():
        click.echo(f"| {name} | {100 * m['test_error']:.2f}% | {m['rows_per_second']:.0f} |")
