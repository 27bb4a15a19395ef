"""``ksae-analyze theorem``: Theorem 3.1 (section 3) on a synthetic or a trained dictionary.
A subcommand of :mod:`ksae_cupy.cli.analyze`'s group."""
from __future__ import annotations

from pathlib import Path

import click

from ksae_cupy.session.outputs import OVERWRITE_HELP
from ksae_cupy.cli.common import CONTEXT, RUN_DIR, GivenPath, report_errors, write_json
from ksae_cupy.errors import KsaeError


@click.command("theorem", context_settings=CONTEXT)
@click.argument("run_dir", type=RUN_DIR, required=False)
@click.option("--dictionary", default=None,
              help="incoherent ([I | Hadamard], mu = 1/sqrt(D)), gaussian, or a RUN_DIR (its trained W), the same "
                   "as giving RUN_DIR first.  [default: incoherent, or RUN_DIR when given]")
@click.option("--dim", "D", type=int, default=256, help="D, the signal dimension (synthetic dictionaries).")
@click.option("--atoms", "H", type=int, default=512, help="H, the number of atoms (gaussian only; incoherent has 2D).")
@click.option("--k", "k", type=int, default=4, help="Non-zeros per code.")
@click.option("--n", "n", type=int, default=1000, help="Codes drawn per case.")
@click.option("--seed", type=int, default=0, help="Seed of the drawn codes (and of a gaussian dictionary).")
@click.option("-o", "--output", type=GivenPath(path_type=Path), default=None, help="Also write the report as JSON.")
@click.option("--overwrite", is_flag=True, help=OVERWRITE_HELP)
@report_errors
def analyze_theorem(run_dir, dictionary, D, H, k, n, seed, output, overwrite):
    """Theorem 3.1: x = W z with k-sparse z drawn to satisfy and to violate k mu <= z_k / (2 z_1);
    how often supp_k(W^T x) finds the support of z in each case: on a run's trained W (RUN_DIR)
    or on a synthetic dictionary (--dictionary)."""
    import numpy as np

    from ksae_cupy.evaluation.analysis import gaussian_dictionary, incoherent_dictionary, theorem_experiment
    from ksae_cupy.session.outputs import check_output

    if run_dir is not None and dictionary is not None:
        raise KsaeError(f"RUN_DIR {run_dir} and --dictionary {dictionary} both name the dictionary; give one")
    dictionary = str(run_dir) if run_dir is not None else dictionary or "incoherent"
    if output:
        check_output(output, "-o", runs=[run_dir], overwrite=overwrite)  # before the experiment, not after it
    if n < 1 or D < 1 or H < 1:
        raise KsaeError("--n, --dim and --atoms must be positive")
    from ksae_cupy.training.options import check_seed

    check_seed("--seed", seed)
    if dictionary == "incoherent":
        W_dh = incoherent_dictionary(D)
    elif dictionary == "gaussian":
        W_dh = gaussian_dictionary(D, H, np.random.default_rng(seed))
    else:
        from ksae_cupy.evaluation.trained_run import open_run

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
