"""Reproduce Table fn_mnist (Makhzani & Frey 2014, sections 4.5/4.6) beside the paper's numbers,
in resumable steps: a stopped run (Ctrl-C, SIGTERM, kill -9, a session's end) goes on where it stopped.

    bin/reproduce-finetune --out results/fn               # every row at the paper's length (5000 + 200 epochs)
    bin/reproduce-finetune --out results/fn               # the same command again: continues, skips what is done
    bin/reproduce-finetune --out results/fn --rows no_pretraining,ksparse,deep_ksparse \\
        --ksparse1 runs/mnist-h1000-k25-A --threads 2      # fine-tune a finished 5000-epoch ksae-train run
    bin/reproduce-finetune --out results/fn --collect-only   # only rewrite the table from the run folders
    bin/reproduce-finetune --out /tmp/fn --dataset synthetic --hidden 16 --k 3 --pretrain-epochs 2 --epochs 2

The rows, each a network of --hidden units per layer fine-tuned with momentum 0.25 and a learning
rate decaying linearly from 1 to 0.001 over each phase (section 4.3.2), regularised in fine-tuning
as its unsupervised learner was (section 4.5):

* ``no_pretraining``: the alpha*k-sparse net (k=25, alpha=3) from Gaussian weights;
* ``rbm``, ``dropout`` (50% hidden), ``denoising`` (20% input), ``deep_dropout`` (two layers,
  phases softmax / top / all): sigmoid layers of a baseline of ``ksae_cupy/supervised/baselines.py``;
* ``ksparse``: one k-sparse autoencoder, fine-tuned keeping alpha*k units;
* ``deep_ksparse``: two, layer 2 trained on layer 1's alpha*k-sparse codes, phases softmax / top / all.

How: every row is a sequence of steps, each one of the project's own commands in a child process
(as a user would type it), each in its own folder under --out:

    OUT/pretrain/ksparse1           ksae-train DATASET --hidden H --k K --epochs PRETRAIN_EPOCHS
                                    (or an existing run folder: --ksparse1 RUN_DIR)
    OUT/pretrain/ksparse1-codes.npy layer 1's alpha*k-sparse codes of the training rows
                                    (ksae_cupy.supervised.pretrain.write_codes, in this process; with .json)
    OUT/pretrain/ksparse2           ksae-train OUT/pretrain/ksparse1-codes.npy --hidden H --k K ...
                                    (--lr auto, ksae-train's default for a file; or --ksparse2 RUN_DIR)
    OUT/finetune/ROW                ksae-finetune [RUN1 [RUN2]] | --no-pretraining | --baseline B ...
    OUT/logs/STEP.log               every step's output, each session appended
    OUT/table_fn_mnist.md, .json    the table, rewritten after every row, from the run folders alone

A step whose folder holds a finished result is skipped (ksae-train: its checkpoint has the epochs
asked; ksae-finetune: finetune.json exists); a folder with a checkpoint is continued with --resume;
otherwise the step starts new (a folder a run left before its first checkpoint is emptied first).
A finished row is not looked at again, and a row in fine-tuning does not need its pretraining again.
Rows ``ksparse`` and ``deep_ksparse`` share layer 1.

To continue a stopped run, give the same command again. Ctrl-C, SIGTERM or SIGHUP are passed on
to the running child, which saves a checkpoint and stops; this script then writes the table and
exits with the child's status (130, 143, 129). The same signal again stops the child at once,
without saving (as the commands do). A kill -9 of this script sends SIGTERM to the child (Linux),
which saves. A step's folder still locked by a stopping child is waited for.

A row whose step diverges (the child exits 1 with its one ``error:`` line, e.g. "the cross-entropy
became nan ...") is recorded as diverged (``diverged.json`` in that step's folder, kept: remove the
folder to try again) and the other rows still run; any other failure stops the script with the
child's status.

Changed from the single-process version of this script: ``--train-limit`` is gone (the commands
train on whole datasets; for a smaller run give a smaller labelled file as --dataset, e.g. an .npz
with X, y, X_test, y_test), and so are ``--ae-lr`` and ``--rbm-lr`` (ksae-finetune --baseline takes
the baselines' default rates, those the validation grid chose: docs/baselines-grid.md); a baseline's
pretraining happens inside its fine-tuning step, without checkpoints (a stop during it pretrains
again), and ``deep_dropout`` pretrains its first layer itself rather than sharing ``dropout``'s.
Short runs are *not* comparable to the paper.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from ksae_cupy import paper
from ksae_cupy.atomic import write_text_atomic as atomic_write
from ksae_cupy.backend import DEVICES
from ksae_cupy.reports import folders
from ksae_cupy.reports.children import Children, Stopped, exit_meaning
from ksae_cupy.recipes.finetune_table import (BASELINE_OF_ROW, DIVERGED, KSPARSE_OF_ROW, ROWS, Diverged, Failed,
                                              Plan, checkpoint_epochs, write_tables)
from ksae_cupy.reports.folders import read_json
from ksae_cupy.recipes.script import refuse_no_arguments
from ksae_cupy.sparse_step import STEPS

REPO = Path(__file__).resolve().parents[2]  # the clone: the children import this package from it


def main(argv=None, repo: Path = REPO) -> int:
    """The script: every asked row, then the table; returns the exit status."""
    args = parse_args(argv)
    plan = Plan(args)
    if args.collect_only:
        print(write_tables(args, plan), end="")
        return 0
    children = Children(args.out / "logs", pythonpath=repo)
    for key in args.rows:
        name = dict((k, n) for k, n, _ in ROWS)[key]
        print(f"row {key}: {name}", flush=True)
        try:
            run_row(key, args, plan, children)
        except Diverged as exc:  # recorded in the step's folder; the other rows still run
            print(f"row {key}: diverged: {exc}", flush=True)
        except Stopped as exc:
            write_tables(args, plan)
            print(f"stopped; the table so far is in {args.out / 'table_fn_mnist.md'}; to continue, give the same "
                  f"command again", flush=True)
            return exc.status
        except Failed as exc:
            write_tables(args, plan)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return exc.status
        write_tables(args, plan)  # after every row
    print(write_tables(args, plan), end="")
    return 0


def parse_args(argv):
    keys = [key for key, *_ in ROWS]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("results/finetune"), help="where the steps' folders and the "
                    "table go; the same --out continues a stopped run")
    ap.add_argument("--rows", default=",".join(keys), help="comma-separated rows, from: " + ", ".join(keys))
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--hidden", type=int, default=paper.HIDDEN)
    ap.add_argument("--k", type=int, default=paper.K)
    ap.add_argument("--alpha", type=float, default=paper.ALPHA, help="alpha*k units kept in fine-tuning and in "
                    "layer 1's codes for layer 2")
    ap.add_argument("--pretrain-epochs", type=int, default=paper.EPOCHS,
                    help=f"per pretrained model (paper: {paper.EPOCHS})")
    ap.add_argument("--epochs", type=int, default=paper.FINETUNE_EPOCHS,
                    help=f"per fine-tuning phase (paper: {paper.FINETUNE_EPOCHS})")
    ap.add_argument("--lr-start", type=float, default=paper.FINETUNE_LR_START)
    ap.add_argument("--lr-end", type=float, default=paper.FINETUNE_LR_END)
    ap.add_argument("--momentum", type=float, default=paper.FINETUNE_MOMENTUM)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step", choices=STEPS, default=None,
                    help="ksae-finetune's training step [default: its own, auto]")
    ap.add_argument("--device", default=None, help=f"{DEVICES}, for every child [default: auto; a "
                    "resumed step keeps its own]")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of every child [default: theirs: one "
                    "per free core; a resumed step keeps its own]")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--ksparse1", type=Path, default=None, help="use this ksae-train run folder as layer 1 "
                    "(as it stands: never trained here) instead of OUT/pretrain/ksparse1")
    ap.add_argument("--ksparse2", type=Path, default=None, help="use this ksae-train run folder (trained on "
                    "layer 1's alpha*k-sparse codes) as layer 2 instead of OUT/pretrain/ksparse2")
    ap.add_argument("--collect-only", action="store_true", help="write the table from the run folders; train nothing")
    ap.add_argument("--all", action="store_true", help="every row at the defaults (days on a CPU); needed only when "
                    "no other option is given")
    refuse_no_arguments(ap, "give --all for every row at the paper's length into results/finetune (days on a CPU), "
                            "or --out DIR and the options that narrow it", argv)
    args = ap.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if not args.rows or any(r not in keys for r in args.rows):
        ap.error(f"--rows {','.join(args.rows)!r} is not allowed; use a comma-separated list from {', '.join(keys)}")
    for flag in ("hidden", "k", "pretrain_epochs", "epochs"):
        if getattr(args, flag) <= 0:
            ap.error(f"--{flag.replace('_', '-')} {getattr(args, flag)} is not allowed; use a positive number")
    if args.threads is not None and args.threads <= 0:
        ap.error(f"--threads {args.threads} is not allowed; use a positive number")
    if args.ksparse2 is not None and args.ksparse1 is None:
        ap.error("--ksparse2 needs --ksparse1: the layer whose codes it was trained on")
    for flag in ("ksparse1", "ksparse2"):
        given = getattr(args, flag)
        if given is not None and not (given / "checkpoint.h5").is_file():
            ap.error(f"--{flag} {given}: not a ksae-train run folder (no checkpoint.h5 in it)")
    args.command = "bin/reproduce-finetune " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None
                                                                                  else argv))
    return args


# -- the steps of a row --------------------------------------------------------------------------

def run_row(key: str, args, plan: Plan, children: "Children") -> None:
    folder = plan.finetune(key)
    state = finetune_state(folder, args, children)
    if state == "done":
        print(f"  fine-tuning: done, in {folder}", flush=True)
        return
    if state == "resume":  # the pretrained weights are in its checkpoint: no pretraining needed
        return finetune(key, folder, ["--resume", folder, *session_options(args, resume=True)], args, children)
    if key == "no_pretraining":
        how = ["--no-pretraining", "--hidden", args.hidden, "--k", args.k, "--dataset", args.dataset]
    elif key in BASELINE_OF_ROW:
        baseline, layers = BASELINE_OF_ROW[key]
        how = ["--baseline", baseline, "--hidden", ",".join([str(args.hidden)] * layers),
               "--pretrain-epochs", args.pretrain_epochs, "--dataset", args.dataset]
    else:
        how = [pretrain_ksparse(name, args, plan, children) for name in KSPARSE_OF_ROW[key]]
    alpha = [] if key in BASELINE_OF_ROW else ["--alpha", args.alpha]  # a baseline's sigmoid layers keep every unit
    options = [*how, *alpha, "--epochs", args.epochs, "--lr-start", args.lr_start,
               "--lr-end", args.lr_end, "--momentum", args.momentum, "--seed", args.seed, "--run-dir", folder,
               *session_options(args, resume=False)]
    finetune(key, folder, options, args, children)


def finetune(key: str, folder: Path, options: list, args, children: "Children") -> None:
    step = ["--step", args.step] if args.step else []  # allowed on --resume too (the same math)
    status, tail = children.run(f"finetune-{key}", "ksae-finetune", [*options, *step])
    check_status(status, tail, folder, children)


def pretrain_ksparse(name: str, args, plan: Plan, children: "Children") -> Path:
    """The run folder of k-sparse layer ``name`` (ksparse1 or ksparse2), trained or continued if need be."""
    folder = plan.ksparse[name]
    if name in plan.reused:
        epochs, configured = checkpoint_epochs(folder)
        print(f"  {name}: {folder} as it stands ({epochs} of {configured} epochs; --{name})", flush=True)
        if name == "ksparse1":
            check_dataset(folder, args.dataset)
        return folder
    state, epochs = train_state(folder, args, children)
    if state == "done":
        print(f"  {name}: done ({epochs} epochs), in {folder}", flush=True)
        return folder
    if state == "resume":
        # Layer 2's codes named again (an --out folder moved elsewhere has them at another path), and written
        # again if deleted to save space; ksae-train's --resume checks they are the same bytes.
        data = [write_codes(args, plan, children)] if name == "ksparse2" else []
        options = [*data, "--resume", folder, "--epochs", args.pretrain_epochs, *session_options(args, resume=True)]
    else:
        data = args.dataset if name == "ksparse1" else write_codes(args, plan, children)
        options = [data, "--hidden", args.hidden, "--k", args.k, "--epochs", args.pretrain_epochs,
                   "--seed", args.seed, "--run-dir", folder, *session_options(args, resume=False)]
    status, tail = children.run(f"pretrain-{name}", "ksae-train", options)
    check_status(status, tail, folder, children)
    return folder


def write_codes(args, plan: Plan, children: "Children") -> Path:
    """Layer 1's alpha*k-sparse codes of the training rows, for layer 2 (kept once written; written again
    if deleted before layer 2 finished)."""
    if plan.codes.is_file():
        print(f"  codes: {plan.codes} (written before)", flush=True)
        return plan.codes
    children.check_stop()
    from ksae_cupy.threads import set_blas_threads
    from ksae_cupy.supervised.pretrain import write_codes as write

    set_blas_threads(args.threads)
    print(f"  codes: writing layer 1's alpha*k-sparse codes (alpha {args.alpha:g}) of the training rows to "
          f"{plan.codes}", flush=True)
    plan.codes.parent.mkdir(parents=True, exist_ok=True)
    info = write(plan.ksparse["ksparse1"], plan.codes, alpha=args.alpha, data_dir=args.data_dir)
    atomic_write(plan.codes.with_suffix(".json"), json.dumps(info, indent=2) + "\n")
    print(f"  codes: {info['shape'][0]} x {info['shape'][1]} in {info['seconds']:.1f} s", flush=True)
    children.check_stop()  # a signal during the codes stops here
    return plan.codes


def session_options(args, resume: bool) -> list:
    """Options every child takes; on --resume only those given (a resumed step keeps its own)."""
    options = []
    if args.device is not None or not resume:
        options += ["--device", args.device or "auto"]
    if args.threads is not None:
        options += ["--threads", args.threads]
    if args.data_dir is not None:
        options += ["--data-dir", args.data_dir]
    return options


def check_status(status: int, tail: list[str], folder: Path, children: "Children") -> None:
    """0: go on. Stopped by a signal: stop here too. Diverged: record it. Else: fail
    (:func:`ksae_cupy.reports.children.exit_meaning`)."""
    meaning, detail = exit_meaning(status, tail, children.received)
    if meaning == "ok":
        return
    if meaning == "stopped":
        raise Stopped(detail)
    if meaning == "diverged":
        folders.record_diverged(folder, detail)
        raise Diverged(detail)
    raise Failed(f"{folder}: {detail}", status)


# -- the state of a step's folder ------------------------------------------------------------------

def train_state(folder: Path, args, children: "Children") -> tuple[str, int]:
    """("done" | "resume" | "new", epochs trained) of a ksae-train step under OUT."""
    check_not_diverged(folder)
    wait_unlocked(folder, children)
    if not (folder / "checkpoint.h5").is_file():
        clear_unstarted(folder)
        return "new", 0
    epochs, _ = checkpoint_epochs(folder)
    config = read_json(folder / "config.json") or {}
    train = config.get("train", {})
    check_same(folder, [("--hidden", train.get("hidden"), args.hidden), ("--k", train.get("k"), args.k),
                        ("--seed", train.get("seed"), args.seed)])
    return ("done" if epochs >= args.pretrain_epochs else "resume"), epochs


def finetune_state(folder: Path, args, children: "Children") -> str:
    """"done" | "resume" | "new" of a ksae-finetune step (a diverged one raises Diverged)."""
    if (folder / "finetune.json").is_file():
        return "done"
    check_not_diverged(folder)
    wait_unlocked(folder, children)
    if not (folder / "checkpoint.h5").is_file():
        clear_unstarted(folder)
        return "new"
    config = read_json(folder / "config.json") or {}
    ft = config.get("finetune", {})
    check_same(folder, [("--epochs", ft.get("epochs"), args.epochs), ("--lr-start", ft.get("lr_start"), args.lr_start),
                        ("--lr-end", ft.get("lr_end"), args.lr_end), ("--momentum", ft.get("momentum"), args.momentum),
                        ("--seed", ft.get("seed"), args.seed), ("--alpha", config.get("alpha"), args.alpha)])
    return "resume"


def check_not_diverged(folder: Path) -> None:
    record = read_json(folder / DIVERGED)
    if record is not None:
        raise Diverged(f"{record['message']} (earlier; remove {folder} to try again)")


def check_same(folder: Path, pairs: list) -> None:
    differ = [f"{flag} {ours} (the run has {theirs})" for flag, theirs, ours in pairs
              if theirs is not None and theirs != ours]
    if differ:
        raise Failed(f"{folder} holds a run started with other settings: {', '.join(differ)}; give another --out, "
                     f"the run's settings, or remove that folder to start it again")


def check_dataset(folder: Path, dataset: str) -> None:
    from ksae_cupy.session.runs import dataset_record

    theirs = (read_json(folder / "config.json") or {}).get("dataset")
    if theirs is not None and dataset_record(theirs, False) != dataset_record(dataset, False):
        raise Failed(f"{folder} was trained on {theirs}; --dataset is {dataset}")


def wait_unlocked(folder: Path, children: "Children") -> None:
    """Wait while another process holds the folder (a child of a killed session, saving)."""
    def on_wait(message):
        if message is not None:
            print(f"  waiting: {message}", flush=True)
        children.check_stop()

    folders.wait_unlocked(folder, on_wait)


def clear_unstarted(folder: Path) -> None:
    """Remove the run files of a run stopped before its first checkpoint: nothing to resume there."""
    folders.clear_unstarted(folder, log=lambda message: print(message, flush=True))
