"""``ksae-eval``: logistic regression on a trained run's alpha*k-sparse features (section 5).

Alpha and the L2 strength are chosen on the validation set; the test set is read once.
Results go to stdout and the run folder; progress goes to stderr.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ksae_cupy.cli.version import version_option
from ksae_cupy.cli.common import (signals_interrupt, CONTEXT, DATA_DIR, DEVICE, EXIT_INTERRUPTED, QUIET, RUN_DIR, check_run_outputs,
                                   data_overrides, progress_printer, report_errors, run_data_options)
from ksae_cupy.evaluation.selection import REFIT_CHOICES
from ksae_cupy.errors import KsaeError


@click.command(context_settings=CONTEXT)
@version_option
@click.argument("run_dir", type=RUN_DIR)
@click.option("--alphas", default="1,2,3,4", help="Comma-separated alpha values; features keep the alpha*k largest units.")
@click.option("--l2", "l2_text", default="1e-3,1e-4,1e-5",
              help="Comma-separated L2 strengths of the classifier: each alpha starts at the middle one and walks "
                   "towards lower validation error.")
@click.option("--l2-extend", type=int, default=3, show_default=True,
              help="Decades the walk may go beyond the grid's weakest (or strongest) L2 while its best lies there "
                   "(0: within the grid).")
@click.option("--refit", type=click.Choice(REFIT_CHOICES), default="train+valid",
              help="Data the classifier is refit on once alpha and L2 are chosen on the validation set.")
@click.option("--raw-baseline", is_flag=True, help="Also run the raw-pixel baseline through the same classifier.")
@click.option("--max-iter", type=int, default=500, show_default=True,
              help="L-BFGS iterations per classifier fit (at most).")
@click.option("--linear-svm", is_flag=True,
              help="Also bracket the classifier: a linear SVM (C chosen on validation) at the chosen alpha, fit on "
                   "the training set and refit on training + validation (needs scikit-learn).")
@click.option("--threads", type=int, default=None,
              help="Classifier fits run side by side on the CPU, one BLAS thread each. "
                   "[default: one per free core (the load average counts the busy ones)]")
@run_data_options
@DEVICE
@DATA_DIR
@QUIET
@report_errors
def eval_command(run_dir, alphas, l2_text, l2_extend, refit, raw_baseline, max_iter, linear_svm, threads, device, data_dir,
                 quiet, **data):
    """Classify with logistic regression on supp_{alpha k}(W^T x + b) features (paper, section 4.5).

    For each alpha the classifier is fit on the training set at the --l2 grid's middle value
    and judged on the validation set, then at the next value beyond that alpha's best, until
    the best has a worse value on both sides (or one that cannot win if the validation error
    is convex in log L2). The best pair is refit and the test error is measured once. Writes
    RUN_DIR/eval.json and RUN_DIR/eval.md and prints the Markdown summary; the last line is
    the test error.

    Each finished fit is kept in RUN_DIR/eval-fits.npz until the report is written: after
    Ctrl-C, the same command continues from the fits already made.

    The data is the run's own, with the labels and splits it was trained with; --labels,
    --test and --test-labels add what a run on your own file lacks (the splits cannot change).

    \b
    Examples:
      ksae-eval runs/mnist-h1000-k25-20261121-101500
      ksae-eval RUN_DIR --alphas 1,3 --l2 1e-4 --raw-baseline --device gpu
      ksae-eval runs/mydata-h1000-k25-... --labels labels.npy --test test.npz
    """
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.threads import set_blas_threads, usable_cores
    from ksae_cupy.evaluation.eval_report import final_line, markdown_report
    from ksae_cupy.evaluation.grid import FITS_FILE, EvaluationInterrupted, interruption_words
    from ksae_cupy.evaluation.run_evaluation import evaluate_run
    from ksae_cupy.evaluation.selection import parse_alphas, parse_l2
    from ksae_cupy.supervised import baseline_eval

    alpha_list, l2_list = parse_alphas(alphas), parse_l2(l2_text)
    if linear_svm:
        from ksae_cupy.evaluation.compare import require_sklearn
        require_sklearn()  # before any work
    if max_iter < 1:
        raise KsaeError(f"--max-iter {max_iter} is not allowed; use a positive number")
    if l2_extend < 0:
        raise KsaeError(f"--l2-extend {l2_extend} is not allowed; use 0 (the grid as given) or a positive number")
    check_run_outputs(run_dir, "eval.json", "eval.md", FITS_FILE)
    backend = resolve_device(device)
    log = progress_printer(quiet)
    baseline = baseline_eval.is_baseline_run(run_dir)
    if baseline and click.get_current_context().get_parameter_source("alphas").name != "DEFAULT":
        raise KsaeError(f"--alphas {alphas} has no effect on {run_dir}, a ksae-baseline run folder: its features "
                        f"are all its hidden units (there is no k); leave --alphas out")
    if not baseline and Path(run_dir).is_dir():  # another command's folder, in ksae-eval's words
        from ksae_cupy.session.runs import RunFolder

        RunFolder(Path(run_dir)).check_kind("run folder", "ksae-eval reads ksae-train and ksae-baseline run folders "
                                                          "(a {kind} run writes its test error to its finetune.json)")
    threads_line, threads_used = set_blas_threads(threads)
    workers = 1 if baseline else threads_used or usable_cores()  # a baseline's fits run one at a time
    if not backend.is_gpu:
        log(f"classifier fits: up to {workers} side by side; {threads_line}")
    received = []  # SIGTERM and SIGHUP stop the evaluation as Ctrl-C does (the finished fits are kept)
    with signals_interrupt(("SIGTERM", "SIGHUP"), received.append):
        try:
            if baseline:  # a ksae-baseline run: its own features, the same classifier
                result = baseline_eval.evaluate_baseline_run(run_dir, l2_list, refit, raw_baseline, backend, None,
                                                             data_dir, max_iter, linear_svm, log, data_overrides(data),
                                                             l2_extend=l2_extend)
            else:
                result = evaluate_run(run_dir, alpha_list, l2_list, refit=refit, raw_baseline=raw_baseline,
                                      backend=backend, data_root=data_dir, max_iter=max_iter, linear_svm=linear_svm,
                                      log=log, data_overrides=data_overrides(data), workers=workers,
                                      l2_extend=l2_extend, max_iter_name="--max-iter")
        except (EvaluationInterrupted, KeyboardInterrupt) as exc:
            click.echo(f"\n{interruption_words(exc, run_dir)}", err=True)
            sys.exit(128 + received[0] if received else EXIT_INTERRUPTED)
    report = baseline_eval.markdown_report if "model" in result else markdown_report
    click.echo(report(result), nl=False)
    click.echo(f"wrote {Path(run_dir) / 'eval.json'} and {Path(run_dir) / 'eval.md'}", err=True)
    click.echo(final_line(result), err=True)  # the last line: what the evaluation is for

