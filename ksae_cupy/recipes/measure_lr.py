"""``bin/measure-lr``: its options, then the measurements of :mod:`ksae_cupy.bench.learning_rates` (what is
measured and how: that module's docstring), one JSON line per case and the JSON file at ``--out``."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ksae_cupy.atomic import write_json_atomic
from ksae_cupy.bench import learning_rates
from ksae_cupy.recipes.script import refuse_no_arguments
from ksae_cupy import paper


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=learning_rates.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300, help="Steps per rate tried.")
    parser.add_argument("--rows", type=int, default=20_000, help="Training rows used per dataset.")
    parser.add_argument("--out", default="results/measurements/lr-auto-measurements.json")
    parser.add_argument("--all", action="store_true",
                        help="every dataset at the defaults; needed only when no other option is given")
    refuse_no_arguments(parser, "give --all to measure every dataset at the defaults (about 20 minutes) into "
                                "results/measurements/lr-auto-measurements.json, or --out FILE and the options", argv)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    """The script: every case of :func:`learning_rates.paper_cases`, measured one after the other."""
    args = parse_args(argv)
    rows = []
    for k, name, X_nd in learning_rates.paper_cases(args.rows):
        row = learning_rates.measure(k, name, X_nd, args.steps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_json_atomic(Path(args.out), {"steps": args.steps, "rows_per_dataset": args.rows, "hidden": paper.HIDDEN,
                                       "batch_size": paper.BATCH_SIZE, "momentum": paper.MOMENTUM, "sigma": paper.SIGMA, "grid": "auto_lr * 2^(i/2)",
                                       "results": rows}, sort_keys=False, indent=1)
