"""The GPU campaign's stages, in order: env, tests, step, epoch, packed, grid, mnist, finetune, collect
(``bin/gpu-campaign``; settings, clock and records in :mod:`ksae_cupy.recipes.campaign`).

Each stage returns ``(status, reason)`` and writes ``<stage>.json`` / ``<stage>.md``;
:func:`run_campaign` runs the ones asked for and not done yet, within the budget.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ksae_cupy.bench.environment import device_check
from ksae_cupy.bench.metadata import git_commit, import_torch
from ksae_cupy.paper import err_mnist_error, ksparse_key
from ksae_cupy.recipes.campaign import EXIT_INTERRUPTED, MNIST_FILES, OF_THE_CODE, REPO, STAGE_MAX_S, STAGES, Campaign
from ksae_cupy.reports.children import python_argv
from ksae_cupy.reports.folders import evaluation_is_current, progress, read_json
from ksae_cupy.reports.markdown import percent, table as md_table


def stage_env(c: Campaign):
    """Device, driver, CUDA, CuPy, PyTorch; every kernel instantiation compiled by NVRTC."""
    info = device_check(c.device, c.out / "logs" / "env.log")
    rows = []
    meta = c.meta()
    for key in ("device", "cuda_driver", "cuda_runtime", "cupy", "torch", "numpy", "python", "commit"):
        rows.append(f"| {key} | {meta.get(key, '-')} |")
    for key, value in info.items():
        rows.append(f"| {key} | {value} |")
    c.write("env", info, "| what | value |\n|---|---|\n" + "\n".join(rows))
    if info.get("nvrtc_failed"):
        return "failed", f"NVRTC failed on {len(info['nvrtc_failed'])} kernel(s)"
    return "done", ""


# --tiny: three quick GPU tests (without a GPU they run against the tests' CuPy stand-in, slowly).
TINY_GPU_TESTS = ("tests/gpu/test_cuda_topk.py", "empty_batch or dispatch_from_topk or rejects_bad_arguments")


def stage_tests(c: Campaign):
    """``pytest -m gpu`` over the whole suite (tiny: three tests of tests/gpu/test_cuda_topk.py)."""
    where, select = (TINY_GPU_TESTS[0], ["-k", TINY_GPU_TESTS[1]]) if c.tiny else ("tests", [])
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", *select, "-q", "-rs", "-p", "no:cacheprovider",
            str(REPO / where)]
    run = c.call("tests", argv, min(c.left(), 420.0))  # a hang must not eat the budget
    log = (c.out / run["log"]).read_text()
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", log)}
    c.write("tests", {"command": "pytest -m gpu " + where, **run, "counts": counts},
            f"`pytest -m gpu {where}`: exit status {run['status']}, "
            + ", ".join(f"{n} {w}" for w, n in counts.items()) + f"; log `{run['log']}`")
    if run["timed_out"]:
        return "failed", "ran out of budget"
    # pytest: 0 all passed, 1 some failed, 5 none collected/selected.
    return ("done", "") if run["status"] in (0, 5) else ("failed", f"pytest exit status {run['status']}")


def _child_result(c: Campaign, stage: str, argv: list, pattern: str):
    """Run a benchmark's child for at most the stage's share of the budget; ``(run, payload or None)``:
    its newest ``pattern`` JSON under ``OUT_DIR/<stage>/``, read back."""
    run = c.call(stage, [str(a) for a in argv], min(c.left(), STAGE_MAX_S[stage]))
    results = sorted((c.out / stage).glob(pattern))
    if run["status"] != 0 or not results:
        return run, None
    return {**run, "result_file": str(results[-1].relative_to(c.out))}, json.loads(results[-1].read_text())


def _failed_child(c: Campaign, stage: str, argv: list, run: dict):
    c.write(stage, {"command": [str(a) for a in argv], **run}, f"failed: exit status {run['status']}; log `{run['log']}`")
    return "failed", f"exit status {run['status']}" + (" (out of budget)" if run["timed_out"] else "")


def stage_step(c: Campaign):
    """Our step against PyTorch's, validated then timed (:mod:`ksae_cupy.bench.step_compare`)."""
    argv = [sys.executable, "-m", "ksae_cupy.bench.step_compare", "--out", c.out / "step", "--device", c.device,
            *(["--tiny"] if c.tiny else []), *c.data_args]
    run, payload = _child_result(c, "step", argv, "step-compare-*.json")
    if payload is None:
        return _failed_child(c, "step", argv, run)
    c.write("step", {"command": [str(a) for a in argv[3:]], **run, "bench_meta": payload["meta"]}, _step_table(payload))
    refused = [name for name, r in payload["results"].items() if "refused" in r]
    return "done", f"no time for {', '.join(refused)} (refused; reasons in the JSON)" if refused else ""


# --tiny: ksae-bench train on tiny shapes (random rows, 8 batches an epoch), a model trained 2 epochs, 1 timed.
TINY_EPOCH_OPTIONS = ("--dim", "16", "--hidden", "32", "--k", "4", "--batch-size", "8", "--rows", "64",
                      "--trained-epochs", "2", "--epoch-repeats", "1")


def stage_epoch(c: Campaign):
    """``ksae-bench train --device gpu``: the trainer's epochs as ``ksae-train`` runs them on the GPU, and
    PyTorch's, on a fresh and on a trained model side by side (:mod:`ksae_cupy.bench.train_gpu`)."""
    argv = python_argv("ksae-bench", "train", "--device", c.device, "--out", c.out / "epoch",
                       *(TINY_EPOCH_OPTIONS if c.tiny else ()))
    command = ["ksae-bench", *argv[3:]]  # as a user types it
    if c.device == "cpu":  # the CPU's figures are ksae-bench train --device cpu's, not a campaign's
        reason = "needs a GPU (on a CPU: ksae-bench train --device cpu)"
        c.write("epoch", {"command": command}, f"not run: {reason}")
        return "skipped", reason
    run, payload = _child_result(c, "epoch", argv, "train-gpu-*.json")
    if payload is None:
        return _failed_child(c, "epoch", argv, run)
    c.write("epoch", {"command": command, **run, "bench_meta": payload["meta"],
                      "starts": payload["starts"]}, _epoch_table(payload))
    failed = sorted({name for records in payload["results"].values() for name, r in records.items()
                     if "seconds_per_epoch" not in r})
    return "done", f"no time for {', '.join(failed)} (diverged, refused or failed; reasons in the JSON)" if failed else ""


def stage_packed(c: Campaign):
    """One run against 16 in one launch (:mod:`ksae_cupy.bench.packed`), validated then timed."""
    argv = [sys.executable, "-m", "ksae_cupy.bench.packed", "--out", c.out / "packed", "--device", c.device,
            *(["--tiny"] if c.tiny else []), *c.data_args]
    run, payload = _child_result(c, "packed", argv, "packed-*.json")
    if payload is None:
        return _failed_child(c, "packed", argv, run)
    packs = payload.get("packs", [])  # none where a run was refused (its reason says why)
    table = md_table(["runs in one launch", "s/epoch", "over one run alone", "how"],
                     [[r["runs"], f"{r['epoch_s']:.4f}", f"{r['over_one_run']:.2f}",
                       "stacked" if r["stacked"] else "one after another"] for r in packs])
    alone = f"one run alone: {payload['alone_epoch_s']:.4f} s/epoch" if packs else ""
    c.write("packed", {"command": [str(a) for a in argv[3:]], **run, "bench_meta": payload["meta"],
                       "status": payload["status"], "reason": payload["reason"]},
            "\n\n".join(part for part in (payload["reason"], alone, table if packs else "") if part))
    return payload["status"], payload["reason"]


def stage_grid(c: Campaign):
    """The top-k kernel grid (``bin/gpu-campaign --kernel-grid``): its checks, then every shape that fits."""
    minutes = min(c.left(), STAGE_MAX_S["grid"]) / 60.0
    tiny = ["--tiny"] if c.tiny else []
    argv = [sys.executable, REPO / "bin" / "gpu-campaign", c.out / "grid", "--kernel-grid", "--budget-minutes",
            f"{minutes:.2f}", "--device", c.device, *tiny, *([] if import_torch(cuda=True)[0] else ["--no-torch"])]
    run, payload = _child_result(c, "grid", argv, "topk-gpu-*.json")
    if c.device == "cpu":  # the grid refuses the CPU, as it must: its command line was parsed and checked
        ok = run["status"] == 2 and "use --device gpu" in (c.out / run["log"]).read_text()
        c.write("grid", {"command": [str(a) for a in argv[2:]], **run}, f"not run: needs a GPU (command line checked: {ok})")
        return ("skipped", "needs a GPU; command line checked") if ok else ("failed", "command line rejected")
    if payload is None:
        return _failed_child(c, "grid", argv, run)
    c.write("grid", {"command": [str(a) for a in argv[2:]], **run, "bench_meta": payload["meta"],
                     "absent": payload.get("absent")}, _topk_table(payload))
    return "done", f"{len(payload['skipped'])} shape(s) x k not started in the budget" if payload["skipped"] else ""


def stage_mnist(c: Campaign):
    """ksae-train then ksae-eval for each run, resuming checkpoints, ``--side-by-side`` runs at once on the
    one GPU (the step is launch-bound: two go at about 0.135 s/epoch each where one alone goes at 0.10
    on an H200); stops at the budget's end."""
    dataset = "synthetic" if c.tiny else "mnist"
    hidden = 32 if c.tiny else 1000
    if not c.tiny:
        missing = [name for name in MNIST_FILES if not any((c.data_dir / "mnist" / (name + ext)).is_file()
                                                           for ext in ("", ".gz"))]
        if missing:  # the machine has no network: say so now rather than after a failed fetch
            reason = f"{c.data_dir / 'mnist'} lacks {', '.join(missing)} (.gz or plain); carry data/mnist"
            c.write("mnist", {"rows": [], "status": "failed", "reason": reason}, f"not run: {reason}")
            return "failed", reason
    if c.side_by_side > 1:
        c.say(f"mnist: {len(c.runs)} runs, {c.side_by_side} side by side")
    # Threads only wait on the children; results come back in the runs' order whatever order they end in.
    with ThreadPoolExecutor(max_workers=c.side_by_side) as pool:
        outcomes = list(pool.map(lambda run: _mnist_run(c, *run, dataset=dataset, hidden=hidden), c.runs))
    rows = [row for row, _, _ in outcomes if row is not None]
    failed = [reason for _, status, reason in outcomes if status == "failed"]
    partial = [reason for _, status, reason in outcomes if status == "partial"]
    status, reason = ("failed", "; ".join(failed)) if failed else ("partial", "; ".join(partial)) if partial \
        else ("done", "")
    lines = md_table(["run", "epochs", "train time", "alpha", "L2", "test error", "paper (k alone)"],
                     [[r["name"], f"{r['epochs']}/{r['target']}", f"{r['train_seconds'] / 60:.1f} min",
                       "-" if r["alpha"] is None else r["alpha"], "-" if r["l2"] is None else r["l2"],
                       percent(r["test_error"]), f"{r['paper']:.2f}%" if r["paper"] and not c.tiny else "-"]
                      for r in rows]).splitlines()
    c.write("mnist", {"dataset": dataset, "hidden": hidden, "side_by_side": c.side_by_side, "rows": rows,
                      "status": status, "reason": reason},
            f"{dataset}, {hidden} hidden units, {c.side_by_side} run(s) at once; alpha and L2 chosen on the validation "
            "set, test set once.\n\n" + "\n".join(lines) + (f"\n\n{reason}" if reason else ""))
    return status, reason


def _mnist_run(c: Campaign, name: str, k: int, extra: list, *, dataset: str, hidden: int):
    """One run of the mnist stage: train (or resume) to the campaign's epochs, then evaluate.
    Returns ``(row or None, status, reason)``; a run not started for want of budget has no row."""
    run_dir = c.out / "mnist" / name
    done_epochs, _ = progress(run_dir)
    if done_epochs < c.epochs:
        if c.left() < c.needs("mnist"):
            return None, "partial", f"{name}: {done_epochs}/{c.epochs} epochs; out of budget"
        if (run_dir / "checkpoint.h5").exists():
            argv = python_argv("ksae-train", "--resume", run_dir, "--device", c.device, *c.data_args)
        else:
            # No checkpoint: whatever a run that died before its first one left is discarded.
            argv = python_argv("ksae-train", dataset, "--hidden", hidden, "--k", k, "--epochs", c.epochs, "--device",
                               c.device, "--run-dir", run_dir, "--overwrite", "--checkpoint-every",
                               1 if c.tiny else 100, *extra, *c.data_args)
        c.say(f"mnist {name}: training from epoch {done_epochs} to {c.epochs}")
        printed = [done_epochs]
        block = 1 if c.tiny else 100

        def say_progress():
            """Say how far training is; True (stop now) once --stop-after-epochs are logged."""
            epoch, seconds = progress(run_dir)
            if epoch >= printed[0] + block:
                printed[0] = epoch
                per = seconds / max(epoch, 1)
                c.say(f"mnist {name}: epoch {epoch}/{c.epochs}, {per:.2f} s/epoch, "
                      f"about {per * (c.epochs - epoch) / 60:.0f} min to go")
            return c.stop_after_epochs is not None and epoch >= c.stop_after_epochs

        run = c.call(f"mnist-{name}-train", argv, c.left(), interrupt=True, poll=say_progress)
        done_epochs, _ = progress(run_dir)
        if run["status"] == EXIT_INTERRUPTED or run["timed_out"]:
            reason = f"{name}: stopped at epoch {done_epochs}/{c.epochs}; checkpoint saved"
            c.say(f"mnist {reason}; call again with the same OUT_DIR to resume")
            return _mnist_row(name, k, run_dir, c.epochs), "partial", reason
        if run["status"] != 0:
            return None, "failed", f"{name}: ksae-train exit status {run['status']} (log {run['log']})"
        if done_epochs < c.epochs:  # e.g. --epochs changed between calls: a resume keeps the run's own
            return None, "failed", f"{name}: the run stopped at {done_epochs} epochs, not {c.epochs}"
    if not evaluation_is_current(run_dir):
        if c.left() < (1.0 if c.tiny else 120.0):
            return _mnist_row(name, k, run_dir, c.epochs), "partial", f"{name}: trained; evaluation waits for the next call"
        grids = ["--alphas", "1,2", "--l2", "1e-3", "--max-iter", "50"] if c.tiny else []
        c.say(f"mnist {name}: ksae-eval")
        run = c.call(f"mnist-{name}-eval", python_argv("ksae-eval", run_dir, "--device", c.device, *grids, *c.data_args),
                     c.left())
        if run["status"] != 0:
            return None, "failed", f"{name}: ksae-eval exit status {run['status']} (log {run['log']})"
    return _mnist_row(name, k, run_dir, c.epochs), "done", ""


def stage_finetune(c: Campaign):
    """bin/reproduce-finetune for the k-sparse rows at the campaign's epochs. Layer 1 is the mnist stage's
    first run when it is finished and the paper's recipe at the row's k (--ksparse1), so only layer 2 and
    the fine-tunings are left. A call that ends first stops it with SIGINT (every step saves); the next
    call continues it."""
    out = c.out / "finetune"
    name, k, extra = c.runs[0]
    layer1 = c.out / "mnist" / name
    epochs, seconds = progress(layer1)
    if not c.tiny:
        if epochs == 0:
            return "skipped", "no measured epoch time yet (the mnist stage comes first)"
        if c.left() < c.needs("finetune"):
            reason = f"{c.left() / 60:.1f} min left in this call; this stage starts with {c.needs('finetune') / 60:.0f}"
            c.write("finetune", {"waiting": reason}, f"not run: {reason}")
            return "waiting", reason
        layer2_epochs, _ = progress(out / "pretrain" / "ksparse2")
        left = 2 * c.epochs - min(epochs, c.epochs) - min(layer2_epochs, c.epochs)
        c.say(f"finetune: {left} pretraining epochs left (about {left * seconds / epochs / 60:.0f} min at "
              f"{seconds / epochs:.2f} s/epoch), then the fine-tunings; a call that ends first is continued by the next")
    row_k = 4 if c.tiny else 25
    reuse = epochs >= c.epochs and k == row_k and not extra  # the paper's recipe, finished
    args = [*(["--dataset", "synthetic", "--hidden", "32", "--k", "4"] if c.tiny else []),
            "--pretrain-epochs", str(c.epochs), "--epochs", "1" if c.tiny else "200", *c.data_args,
            *(["--ksparse1", str(layer1)] if reuse else [])]
    argv = [sys.executable, str(REPO / "bin" / "reproduce-finetune"), "--rows", "ksparse,deep_ksparse",
            "--device", c.device, "--out", str(out), *args]
    run = c.call("finetune", argv, c.left(), interrupt=True)
    table = out / "table_fn_mnist.md"
    c.write("finetune", {"command": argv[1:], **run},
            (table.read_text() if table.exists() else "no table written") + f"\n\nexit status {run['status']}")
    if run["status"] != 0:
        if run["timed_out"]:
            return "partial", "out of this call's budget; the next call continues it"
        return "failed", f"exit status {run['status']}"
    return "done", ""


def stage_collect(c: Campaign):
    """summary.md: one table of every stage, then each stage's own table."""
    lines = ["| stage | status | note |", "|---|---|---|"]
    for stage in STAGES[:-1]:
        entry = c.state["stages"].get(stage, {"status": "not run", "reason": ""})
        lines.append(f"| {stage} | {entry['status']} | {entry.get('reason', '')} |")
    parts = ["\n".join(lines)]
    for stage in STAGES[:-1]:
        md = c.out / f"{stage}.md"
        if md.exists():
            body = md.read_text().split("\n\n", 2)
            parts.append(f"### {stage}\n\n{body[2] if len(body) > 2 else ''}".rstrip())
    c.write("collect", {"stages": c.state["stages"]}, "\n\n".join(parts))
    shutil.copyfile(c.out / "collect.md", c.out / "summary.md")
    return "done", ""


# ------------------------------------------------------------------------------------------------
# Helpers.

def _topk_table(payload: dict) -> str:
    copy = payload.get("copy", {}).get("GBps")
    rows = [[r["N"], r["H"], r["k"], r["candidate"], r.get("valid"),
             f"{r['median_ms']:.4f}" if "median_ms" in r else r.get("error", "-"),
             f"{r['GBps']:.0f}" if "GBps" in r else "-",
             percent(r["fraction_of_copy"], 0) if "fraction_of_copy" in r else "-"] for r in payload.get("results", [])]
    return (f"device-to-device copy: {copy:.0f} GB/s" if copy else "") + "\n\n" + md_table(
        ["N", "H", "k", "candidate", "valid", "median ms", "GB/s", "of copy"], rows)


def _step_table(payload: dict) -> str:
    """One row per variant: its median epoch, or why it has none."""
    setup = payload["setup"]
    rows = [[name, r.get("path", ""), f"{r['validation_max_rel_diff']:.1e}" if "validation_max_rel_diff" in r else "-",
             f"{r['seconds_per_epoch']:.4f}" if "seconds_per_epoch" in r else "refused: " + r.get("refused", "?")]
            for name, r in payload["results"].items()]
    rows += [[name, "absent", "-", why] for name, why in payload.get("absent", {}).items()]
    speedups = ", ".join(f"{name} {x:.2f}x" for name, x in payload.get("speedup_vs_torch_graph", {}).items())
    return (f"{setup['data']}; {setup['rows']} rows, {setup['batches_per_epoch']} batches of {setup['batch']}, "
            f"{setup['D']} x {setup['H']}, k = {setup['k']}, lr {setup['lr']}, momentum {setup['momentum']}, float32; "
            f"median of {setup['epochs']} epochs after a warm-up\n\n"
            + md_table(["variant", "path", "validation (max rel. diff)", "s/epoch"], rows)
            + (f"\n\nfaster than PyTorch's captured step: {speedups}" if speedups else ""))


def _epoch_table(payload: dict) -> str:
    """One row per contender: its seconds per epoch on the fresh and on the trained model, or why it has none."""
    config, starts, results = payload["config"], payload["starts"], payload["results"]

    def cell(record: dict | None) -> str:
        if record is None:
            return "-"
        if "seconds_per_epoch" in record:
            return f"{record['seconds_per_epoch']:.4f}"
        for key in ("diverged", "refused", "error"):
            if key in record:
                return f"{key}: {record[key]}"
        return "?"

    names = list(dict.fromkeys(name for records in results.values() for name in records))
    rows = [[name, *(cell(results.get(which, {}).get(name)) for which in ("fresh", "trained")),
             f"{payload['trained_over_fresh'][name]:.2f}" if name in payload["trained_over_fresh"] else "-"]
            for name in names]
    rows += [[name, "absent", "absent", why] for name, why in payload.get("absent", {}).items()]
    said = "; ".join(f"{which} model: {s['made']} (epoch {s['epoch']}, lr {s['lr']}, loss {s['start_loss']:.4g})"
                     for which, s in starts.items())
    return (f"{config['inputs']}; {config['D']} x {config['H']}, k = {config['k']}, batch {config['batch']}, float32; "
            f"median of {config['epochs_timed']} epochs after a warm-up that checks the loss\n\n{said}\n\n"
            + md_table(["contender", "fresh s/epoch", "trained s/epoch", "trained / fresh"], rows))


def _mnist_row(name: str, k: int, run_dir: Path, target: int) -> dict:
    epochs, seconds = progress(run_dir)
    paper = err_mnist_error(ksparse_key(k), "mnist", 1000)
    row = {"name": name, "k": k, "epochs": epochs, "target": target, "train_seconds": round(seconds, 1), "alpha": None, "l2": None,
           "test_error": None, "paper": None if paper is None else round(100 * paper, 2), "run_dir": f"mnist/{name}"}
    if evaluation_is_current(run_dir):
        feats = read_json(run_dir / "eval.json")["features"]
        row.update(alpha=feats["selected"]["alpha"], l2=feats["selected"]["l2"], test_error=feats["test_error"])
    return row


STAGE_FUNCTIONS = {"env": stage_env, "tests": stage_tests, "step": stage_step, "epoch": stage_epoch,
                   "packed": stage_packed, "grid": stage_grid, "mnist": stage_mnist, "finetune": stage_finetune, "collect": stage_collect}


def run_campaign(args) -> int:
    """Every stage of ``args.stage`` (default: all) not done yet in OUT_DIR, each only if the budget left
    covers it; one stage's failure is recorded and the next one runs."""
    c = Campaign(args)
    wanted = args.stage or list(STAGES)
    c.say(f"results in {c.out}; {args.budget_minutes:g} min budget; stages {', '.join(wanted)}")
    for stage in STAGES:
        if stage not in wanted:
            continue
        earlier = c.state["stages"].get(stage, {})
        before = earlier.get("status")
        # The checks and benchmarks are of the code: done at another commit, they run again.
        stale = stage in OF_THE_CODE and earlier.get("commit") != git_commit()
        if before in ("done", "skipped", "failed") and stage != "collect" and not args.stage and not stale:
            c.say(f"{stage}: {before} in an earlier call")
            continue
        if stage != "collect" and c.left() < c.needs(stage):
            reason = f"needs about {c.needs(stage):.0f} s, {max(c.left(), 0):.0f} s left"
            c.record(stage, "waiting", reason)
            c.say(f"{stage}: not started ({reason}); call again with the same OUT_DIR")
            continue
        c.say(f"{stage}: start ({max(c.left(), 0) / 60:.1f} min left)")
        t0 = time.monotonic()
        try:
            status, reason = STAGE_FUNCTIONS[stage](c)
        except Exception as exc:  # noqa: BLE001 -- one stage's failure must not cost the others
            status, reason = "failed", f"{type(exc).__name__}: {exc}".splitlines()[0]
        c.record(stage, status, reason, time.monotonic() - t0)
        c.say(f"{stage}: {status}{' (' + reason + ')' if reason else ''} in {time.monotonic() - t0:.0f} s")
    c.say(f"done; summary in {c.out / 'summary.md'}")
    return 0

