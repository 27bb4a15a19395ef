"""``bin/bench-auxk``: its options, then the AuxK step's timing of :mod:`ksae_cupy.bench.auxk` (what it times and
how: that module's docstring), printed row by row and written as JSON with ``--out``."""
from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from ksae_cupy.atomic import write_json_atomic
from ksae_cupy.bench import auxk
from ksae_cupy.recipes.script import positive_int, refuse_no_arguments
from ksae_cupy import paper


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=auxk.__doc__.split("\n")[0])
    parser.add_argument("--aux-k", type=int, default=256)
    parser.add_argument("--k", type=int, default=paper.K)
    parser.add_argument("--dead", default="0,0.01,0.05,0.135,0.45", help="dead fractions, comma-separated")
    parser.add_argument("--rounds", type=positive_int, default=15, help="interleaved rounds (each: 5 steps of each, median)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checkpoint", default=None, help="a run's checkpoint.h5 for the parameters")
    parser.add_argument("--clock", choices=["process", "wall"], default="process",
                        help="process: this process's CPU time (what other jobs on the cores change least); wall")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--all", action="store_true",
                        help="every dead fraction at the defaults; needed only when no other option is given")
    refuse_no_arguments(parser, "give --all to time every dead fraction at the defaults, "
                                "or the options that change it (e.g. --dead 0,0.45 --rounds 3 --out FILE)", argv)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    """The script: one line per dead fraction, then the JSON file with ``--out``."""
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.threads import set_blas_threads

    args = parse_args(argv)
    set_blas_threads(args.threads)
    X_nd = load_dataset("mnist").X_train[:128]
    trainer = auxk.auxk_trainer(X_nd, args.k, args.aux_k, checkpoint=args.checkpoint)
    results = auxk.time_dead_fractions(trainer, X_nd, args.k, [float(f) for f in args.dead.split(",")], args.rounds,
                                       clock=auxk.CLOCKS[args.clock], log=partial(print, flush=True))
    if args.out:
        write_json_atomic(Path(args.out), {"aux_k": args.aux_k, "k": args.k, "hidden": paper.HIDDEN, "batch": paper.BATCH_SIZE,
                                           "threads": args.threads, "clock": args.clock, "checkpoint": args.checkpoint,
                                           "rounds": args.rounds, "results": results}, sort_keys=False, indent=1)
