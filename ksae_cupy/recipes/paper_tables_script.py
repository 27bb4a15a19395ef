"""``bin/paper-tables``: its options, checked (one ``error:`` line and exit status 2 for a bad one), and its run:
the tables of :mod:`ksae_cupy.reports.paper_tables` written to ``--out``, with ``--run`` the commands still
missing run one after the other, then the commands left printed."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ksae_cupy.reports import paper_tables as tables
from ksae_cupy.reports.children import Children, Stopped, shown
from ksae_cupy.recipes.script import refuse_no_arguments

REPO = Path(__file__).resolve().parents[2]  # the clone: bin/ and the children's package live there
DESCRIPTION = "Tables err_mnist and fn_mnist of the paper (section 5) from run folders, ours beside the paper's."


def usage_error(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def parse(argv=None, repo: Path = REPO):
    default_root = repo / "results" / "runs"
    ap = argparse.ArgumentParser(description=DESCRIPTION)
    ap.error = usage_error  # one line, exit status 2
    ap.add_argument("--runs-root", type=Path, default=default_root, help=f"run folders [default: {default_root}]")
    ap.add_argument("--out", type=Path, default=None, help="the Markdown file [default: RUNS_ROOT/../paper-tables.md]")
    ap.add_argument("--run", action="store_true", help="run what is missing and resume what stopped")
    ap.add_argument("--rows", default=",".join(tables.ROW_NAMES),
                    help="comma-separated rows asked, from: " + ", ".join(tables.ROW_NAMES))
    ap.add_argument("--ksparse-epochs", type=int, default=tables.paper.EPOCHS, help=f"k-sparse training epochs (paper: {tables.paper.EPOCHS})")
    ap.add_argument("--baseline-epochs", type=int, default=500, help="baselines' training epochs")
    ap.add_argument("--finetune-epochs", type=int, default=tables.paper.FINETUNE_EPOCHS, help=f"fine-tuning epochs per phase (paper: {tables.paper.FINETUNE_EPOCHS})")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds of every asked row")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads of every command")
    ap.add_argument("--no-pack", action="store_true",
                    help="with --run, train the k-sparse rows one command at a time [default: those waiting train "
                         "together, one bin/train-pack launch: on a GPU as one stacked model]")
    refuse_no_arguments(ap, "give --out FILE to write the tables from --runs-root (e.g. --out results/paper-tables.md),"
                            " and --run to also run what is missing", argv)
    args = ap.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not rows or any(r not in tables.ROW_NAMES for r in rows):
        usage_error(f"--rows {args.rows!r} is not allowed; use a comma-separated list from {', '.join(tables.ROW_NAMES)}")
    args.rows = [tables.ROW_NAMES[r] for r in rows]
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
    except ValueError:
        seeds = ()
    if not seeds or min(seeds) < 0:
        usage_error(f"--seeds {args.seeds!r} is not allowed; use comma-separated whole numbers such as 0,1,2")
    for flag in ("ksparse_epochs", "baseline_epochs", "finetune_epochs", "threads"):
        if getattr(args, flag) <= 0:
            usage_error(f"--{flag.replace('_', '-')} {getattr(args, flag)} is not allowed; use a positive number")
    if args.runs_root.exists() and not args.runs_root.is_dir():
        usage_error(f"--runs-root {args.runs_root} is a file; give the folder of the run folders")
    if not args.runs_root.exists() and not args.run:
        usage_error(f"--runs-root {args.runs_root}: no such folder (with --run it is made)")
    args.settings = tables.Settings(args.ksparse_epochs, args.baseline_epochs, args.finetune_epochs, seeds, args.threads)
    args.out = args.out or args.runs_root.parent / "paper-tables.md"
    return args


def command_text(command, args, script: Path) -> str:
    """The command as typed from here: ``script`` (the deep k-sparse row's) and the folders relative to this
    folder when inside it."""
    here = Path.cwd()
    relative = [a.resolve().relative_to(here) if isinstance(a, Path) and a.resolve().is_relative_to(here) else a
                for a in args]
    return shown(Path(command).relative_to(here) if str(command) == str(script) and script.is_relative_to(here)
                 else command, *relative)


def main(argv=None, repo: Path = REPO) -> int:
    """The script: the tables (with ``--run``, the missing commands run first); returns the exit status."""
    args = parse(argv, repo)
    script = repo / "bin" / "reproduce-finetune"  # the deep k-sparse row: layer 2 trains on layer 1's codes
    pack = repo / "bin" / "train-pack"  # the k-sparse rows waiting to train, in one launch
    text = lambda command, arguments: command_text(command, arguments, script)  # noqa: E731
    children = Children(args.runs_root / "logs", pythonpath=repo) if args.run else None
    try:
        left = tables.build(args.runs_root, args.out, args.rows, args.settings, text, str(script), children,
                            pack_script=None if args.no_pack else str(pack))
    except Stopped as exc:
        print(f"stopped; the tables so far are in {args.out}; to continue, give the same command again")
        return exc.status
    except tables.MixedProtocols as exc:
        print(f"error: {exc}; {args.out} is left as it was", file=sys.stderr)
        return 1
    except tables.StepFailed as exc:
        print(f"error: {exc}; the tables so far are in {args.out}", file=sys.stderr)
        return exc.status
    steps = [step for target in left for step in target.steps]
    print(f"tables: {args.out}")
    for step in steps:
        print(f"left: {text(*step)}")
    return 0
