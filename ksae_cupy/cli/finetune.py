"""``ksae-finetune``: supervised fine-tuning of one or two pretrained k-sparse autoencoders.

    ksae-finetune runs/mnist-h1000-k25-A --alpha 3 --epochs 200            # shallow (section 4.5)
    ksae-finetune runs/A runs/B --alpha 3 --epochs 200                      # deep, layer-wise (4.6)
    ksae-finetune --no-pretraining --hidden 1000 --k 25 --dataset mnist     # baseline, random init
    ksae-finetune --baseline dropout-ae --hidden 1000,1000 --dataset mnist  # baseline pretrained here
    ksae-finetune --resume runs/finetune-mnist-...

``--baseline rbm|dropout-ae|denoising-ae|dropout-denoising-ae`` pretrains that learner of
:mod:`ksae_cupy.supervised.baselines` (one layer per ``--hidden`` size, ``--pretrain-epochs`` each) on
the training set in this process, then fine-tunes its sigmoid layers with the same dropout
(section 4.5). The pretrained weights are the run's initial parameters; a resumed run
continues from its checkpoint and does not pretrain again.

``--step auto|dense|sparse`` picks the training step: sparse (only layer 1's ``X W1`` dense, every
later product through the kept units; :mod:`ksae_cupy.supervised.sparse_finetune`) for k-sparse
nets without dropout on the CPU, which ``auto`` takes; dense otherwise. The same math, so it may be
given on ``--resume``, as may ``--threads`` (BLAS and CPU kernel threads; a resumed run keeps the
count it was started with unless told, since BLAS results differ in their last bits between counts).

The run folder holds ``checkpoint.h5`` (a fine-tuning checkpoint), ``config.json`` (with each
pretrained run's epochs when it was read, a baseline's pretraining seconds per layer and the step
taken), ``metrics.jsonl`` and, at the end, ``finetune.json`` with the validation and test error.
Bad input is one line ``error: ...`` and exit status 2 (see :func:`ksae_cupy.cli.common.report_errors`).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np

from ksae_cupy.cli.common import (GivenPath, DATA_OPTION_NAMES, StopOnSignals, data_options, data_overrides, data_spec,
                                   report_errors)
from ksae_cupy.errors import KsaeError

RESULTS = "finetune.json"
# Options fixed by a run: on --resume, giving one is an error rather than silently ignored.
RUN_SHAPING = ("dataset", "alpha", "epochs", "phases", "lr_start", "lr_end", "rising_lr", "momentum", "batch_size", "sigma",
               "no_pretraining", "baseline", "pretrain_epochs", "hidden", "k", "seed", "dtype")
BASELINES = ("rbm", "dropout-ae", "denoising-ae", "dropout-denoising-ae")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("pretrained", nargs=-1, type=GivenPath(path_type=Path))
@click.option("--dataset", default=None,
              help="Labelled dataset: mnist, fashion-mnist, synthetic, or your file (see ksae-train). "
                   "[default: the pretrained run's, with its labels and splits]")
@click.option("--alpha", type=float, default=3.0, help="Keep alpha*k units per hidden layer (paper, MNIST: 3).")
@click.option("--epochs", type=int, default=200, help="Epochs per fine-tuning phase (paper: 200).")
@click.option("--phases", default=None,
              help="Comma-separated phases from softmax,top,all. [default: all (shallow); softmax,top,all (deep)]")
@click.option("--lr-start", type=float, default=1.0, help="First learning rate (paper, MNIST: 1; NORB: 0.01).")
@click.option("--lr-end", type=float, default=0.001, help="Last learning rate, reached linearly (paper: 0.001).")
@click.option("--rising-lr", is_flag=True, help="Allow --lr-end above --lr-start (a schedule that rises).")
@click.option("--momentum", type=float, default=0.25, help="Momentum (paper, MNIST: 0.25; NORB: 0.9).")
@click.option("--batch-size", type=int, default=128, help="Minibatch size of the fine-tuning (and of --baseline's pretraining).")
@click.option("--sigma", type=float, default=0.01, help="Std of the Gaussian initial softmax (and random) weights.")
@click.option("--no-pretraining", is_flag=True, help="Random initial weights instead of pretrained runs.")
@click.option("--baseline", type=click.Choice(BASELINES), default=None,
              help="Pretrain this baseline here and fine-tune its sigmoid layers with its dropout (section 4.5).")
@click.option("--pretrain-epochs", type=int, default=5000, help="With --baseline: epochs per layer (paper: 5000).")
@click.option("--hidden", default="1000",
              help="With --no-pretraining or --baseline: hidden units per layer, e.g. 1000 or 1000,1000.")
@click.option("--k", "k", type=int, default=25, help="With --no-pretraining: k of every layer (alpha*k are kept).")
@click.option("--seed", type=int, default=0, help="Seed of the new weights (the softmax; every layer with --no-pretraining), the batch "
                   "order and dropout masks.")
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32",
              help="Floating-point type of the parameters and the data on the device.")
@click.option("--device", default="auto", help="auto, cpu, gpu or gpu:N.")
@click.option("--step", default="auto",
              help="Training step: dense, sparse (only layer 1's X W1 dense; k-sparse layers, no dropout, CPU), or "
                   "auto (sparse where it applies, else dense). Allowed with --resume.")
@click.option("--threads", type=int, default=None,
              help="Threads on the CPU, for BLAS and the CPU kernels. [default: OMP_NUM_THREADS or its kin when "
                   "set, else one per free core (the load average counts the busy ones); on --resume, the run's]")
@click.option("--run-dir", type=GivenPath(path_type=Path), default=None,
              help="Folder for checkpoint.h5, config.json, metrics.jsonl and finetune.json. "
                   "[default: runs/finetune-<dataset>-<time>]")
@click.option("--checkpoint-every", type=int, default=10, help="Write a checkpoint every N epochs (and at the end).")
@click.option("--checkpoint-minutes", type=float, default=5.0,
              help="Also write one whenever this many minutes have passed (mid-epoch if need be; 0: by epochs only).")
@click.option("--resume", type=GivenPath(path_type=Path), default=None, help="Continue the fine-tuning run in this folder.")
@click.option("--data-dir", type=GivenPath(path_type=Path), default=None, help="Data root. [default: $KSAE_DATA_DIR or ./data]")
@click.option("--quiet", is_flag=True, help="Only the final line.")
@data_options
@click.pass_context
@report_errors
def finetune_command(ctx, pretrained, dataset, alpha, epochs, phases, lr_start, lr_end, rising_lr, momentum, batch_size, sigma,
                     no_pretraining, baseline, pretrain_epochs, hidden, k, seed, dtype, device, step, threads, run_dir,
                     checkpoint_every, checkpoint_minutes, resume, data_dir, quiet, **data_given):
    """Fine-tune a softmax network initialised from PRETRAINED_RUN_DIR [PRETRAINED_RUN_DIR_2] (ksae-train runs)."""
    from ksae_cupy.supervised import finetune
    from ksae_cupy.backend import resolve_device
    from ksae_cupy.training.threads import set_blas_threads
    from ksae_cupy.datasets import load_dataset
    from ksae_cupy.datasets.user_files import DataSpec
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint
    from ksae_cupy.training.runs import FINETUNE, RunFolder

    say = (lambda *a, **kw: None) if quiet else click.echo
    from ksae_cupy.training.checkpoint import CheckpointWriteError
    from ksae_cupy.training.checkpoint_policy import CheckpointPolicy

    policy = CheckpointPolicy(checkpoint_every, checkpoint_minutes)  # checks both before any work
    if step not in finetune.STEPS:
        raise KsaeError(f"--step {step!r} is not allowed; use one of {', '.join(finetune.STEPS)}")
    backend = resolve_device(device)
    if resume is not None:
        if pretrained:
            raise KsaeError("--resume takes no PRETRAINED_RUN_DIR; the run folder remembers its own")
        given = sorted(f"--{name.replace('_', '-')}" for name in (*RUN_SHAPING, *DATA_OPTION_NAMES)
                       if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE)
        if given:
            raise KsaeError(f"--resume: {', '.join(given)} cannot change a run in progress; leave them out")
        folder = RunFolder(resume, kind=FINETUNE)
        folder.check_resumable()
        folder.lock(log=lambda msg: say(msg, err=True))  # one writer: held until the command ends
        ctx.call_on_close(folder.release)
        resolved = folder.read_config()
        state = load_finetune_checkpoint(folder.checkpoint)
        folder.check_checkpoint(state.get("run_id"))  # this folder's run, not a copy
        if ctx.get_parameter_source("step") == click.core.ParameterSource.COMMANDLINE:
            state["config"]["step"] = step  # the same math: allowed on a run in progress
        if ctx.get_parameter_source("threads") != click.core.ParameterSource.COMMANDLINE:
            threads = resolved.get("threads")  # the run's count (runs started before --threads recorded none)
        threads_line, resolved["threads"] = set_blas_threads(threads)
        trainer = finetune.FinetuneTrainer.from_state(state, backend)
        resolved["finetune"] = trainer.config.to_dict()
        resolved["step_kind"] = trainer.step_kind  # this session's (--step may change it)
        folder.write_config(resolved)
        dataset = resolved["dataset"]
        spec = DataSpec.from_record(dataset, resolved.get("data"))
    else:
        if len(pretrained) > 2:
            raise KsaeError(f"{len(pretrained)} pretrained runs given; fine-tuning takes one (shallow) or two (deep)")
        if no_pretraining and pretrained:
            raise KsaeError("--no-pretraining contradicts the PRETRAINED_RUN_DIR arguments; give one or the other")
        if baseline and (pretrained or no_pretraining):
            raise KsaeError(f"--baseline {baseline} contradicts "
                            f"{'the PRETRAINED_RUN_DIR arguments' if pretrained else '--no-pretraining'}; give one")
        if not no_pretraining and not pretrained and not baseline:
            raise KsaeError("missing PRETRAINED_RUN_DIR; give one or two ksae-train run folders, --no-pretraining "
                            "or --baseline")
        if lr_end > lr_start and not rising_lr:  # NaN fails the comparison and is named by the config's check
            raise KsaeError(f"--lr-end {lr_end} is above --lr-start {lr_start}: the rate would rise over the run "
                            f"(the paper's falls from 1 to 0.001); swap them, or give --rising-lr if that is meant")
        typed = {name for name in ("hidden", "k") if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE}
        if pretrained and typed:
            raise KsaeError(f"{' and '.join('--' + name for name in sorted(typed))} only appl"
                            f"{'y' if len(typed) > 1 else 'ies'} with --no-pretraining or --baseline: the "
                            f"PRETRAINED_RUN_DIR runs set the layers' sizes and k; leave {'them' if len(typed) > 1 else 'it'} out")
        if baseline and "k" in typed:
            raise KsaeError(f"--k only applies with --no-pretraining: --baseline {baseline} gives sigmoid layers, which "
                            f"keep every unit; leave it out")
        if pretrain_epochs <= 0:
            raise KsaeError(f"--pretrain-epochs {pretrain_epochs} is not allowed; use a positive number of epochs")
        if baseline and step == "sparse":  # said before the pretraining, not after it
            raise KsaeError(f"--step sparse needs k-sparse layers without dropout; --baseline {baseline} gives "
                            f"sigmoid layers; use --step dense or auto")
        threads_line, threads_used = set_blas_threads(threads)  # before pretraining, which runs here too
        encoders, ks, sources, pretrain_seconds, network = [], [], [], [], {}
        for path in pretrained:
            from ksae_cupy.supervised.baseline_trainer import is_baseline_run
            from ksae_cupy.supervised.pretrain import encoder_of, load_pretrained_run

            if is_baseline_run(path):  # a ksae-baseline run: its sigmoid layer, fine-tuned with its dropout (4.5)
                network = _baseline_source(path, len(pretrained), encoders, ks, sources)
                continue
            model, run_config = load_pretrained_run(path, device="cpu")
            encoders.append(encoder_of(model))
            ks.append(model.k)
            # epochs_trained: the pretrained run's epochs when it was read (a run may go on training after)
            sources.append({"run_dir": str(path), "dataset": run_config.get("dataset"), "k": model.k,
                            "hidden": model.n_hidden, "data": run_config.get("data"),
                            "epochs_trained": model.trainer_.epoch})
        if dataset is None:
            dataset = sources[0]["dataset"] if sources else None
            if dataset is None:
                raise KsaeError("missing --dataset; name a labelled dataset such as mnist")
            # the pretrained run's data, with its splits (labels or a test set may be added)
            spec = DataSpec.from_record(dataset, sources[0]["data"]).for_run(**data_overrides(data_given))
        else:
            spec = data_spec(dataset, **data_given)
        folder = RunFolder(run_dir or _default_run_dir(dataset), kind=FINETUNE)
        folder.check_new()
        data = load_dataset(spec, root=data_dir, log=lambda msg: say(msg, err=True))
        if data.y_train is None:
            raise KsaeError(f"dataset {dataset!r} has no labels; fine-tuning needs labels: --labels, or an .npz "
                            f"holding y, or a labelled dataset such as mnist")
        rng = np.random.default_rng(seed)
        if no_pretraining:
            sizes = _parse_hidden(hidden)
            ks = [k] * len(sizes)
            host_params = finetune.init_random(data.dim, sizes, data.n_classes, sigma, rng, np.dtype(dtype))
        elif baseline:
            from ksae_cupy.supervised import baseline_fit, baselines

            sizes = _parse_hidden(hidden)
            ks = [None] * len(sizes)  # sigmoid layers keep every unit
            say(f"pretraining {baseline}: {len(sizes)} layer(s) of {hidden} units, {pretrain_epochs} epochs each")
            pretrain_seconds = [0.0] * len(sizes)  # per layer, the sum of its epochs' seconds (config.json)

            def pretrain_epoch(layer, r):
                pretrain_seconds[layer - 1] += r.seconds
                say(f"pretrain layer {layer} epoch {r.epoch}/{pretrain_epochs}  loss {r.train_loss:.4f}  "
                    f"{r.seconds:.1f} s")

            stack = baseline_fit.pretrain_baseline(baseline, data.X_train, sizes, pretrain_epochs, seed, backend,
                                                on_epoch=pretrain_epoch)
            host_params = finetune.init_from_encoders([baselines.encoder(p) for p in stack], data.n_classes, sigma,
                                                      rng, np.dtype(dtype))
        else:
            if encoders[0][0].shape[0] != data.dim:
                raise KsaeError(f"the pretrained run {pretrained[0]} takes {encoders[0][0].shape[0]} dimensions, "
                                f"{dataset} has {data.dim}")
            host_params = finetune.init_from_encoders(encoders, data.n_classes, sigma, rng, np.dtype(dtype))
        from ksae_cupy.model import alpha_k

        L = len(ks)
        sizes = [host_params[finetune.layer_names(l)[0]].shape[1] for l in range(1, L + 1)]
        kept = [None if k_l is None else alpha_k(k_l, alpha, H_l) for k_l, H_l in zip(ks, sizes)]
        phase_list = _parse_phases(phases, L)
        if baseline:
            from ksae_cupy.supervised.baselines import REGULARISATION

            network = dict(activations=["sigmoid"] * L, **REGULARISATION[baseline])  # section 4.5
        config = finetune.FinetuneConfig(kept=kept, phases=phase_list, epochs=epochs, batch_size=batch_size,
                                         lr_start=lr_start, lr_end=lr_end, momentum=momentum, sigma=sigma,
                                         seed=seed, dtype=dtype, step=step, **network)
        config.validate(n_train=len(data.X_train), hidden=sizes)
        trainer = finetune.FinetuneTrainer(config, backend, host_params, rng)
        resolved = {"dataset": spec.data, "data": spec.record(), "device": backend.name, "alpha": alpha,
                    "pretrained": sources,
                    "no_pretraining": bool(no_pretraining), "baseline": baseline,
                    "pretrain_epochs": pretrain_epochs if baseline else None,
                    "pretrain_seconds": pretrain_seconds if baseline else None, "finetune": config.to_dict(),
                    "step_kind": trainer.step_kind,
                    "checkpoint_every": checkpoint_every,
                    "checkpoint_minutes": checkpoint_minutes, "run_dir": str(folder.path),
                    # kept on --resume: BLAS products differ in their last bits on another thread count
                    "threads": threads_used}
        ctx.call_on_close(folder.release)
        folder.create(log=lambda msg: say(msg, err=True), new=True)
        folder.write_config(resolved)

    say(backend.description)
    say(threads_line)
    say(f"step: {trainer.step_kind} (--step {trainer.config.step})")
    if resume is not None:
        data = load_dataset(spec, root=data_dir, log=lambda msg: say(msg, err=True))
    say(data.summary())
    say("config: " + json.dumps(trainer.config.to_dict(), sort_keys=True))
    say(f"run folder: {folder.path}")
    X_train, y_train = (backend.asarray(a, dtype=t) for a, t in ((data.X_train, trainer.dtype), (data.y_train, np.int64)))
    X_valid, y_valid = (backend.asarray(a, dtype=t) for a, t in ((data.X_valid, trainer.dtype), (data.y_valid, np.int64)))
    save = _saver(folder, trainer)

    pace = PhasePace(trainer.config.phases, trainer.config.epochs)

    def on_epoch(report):
        folder.append_metrics(report)
        pace.add(report)
        eta = pace.eta(trainer)
        say(f"phase {report.phase} epoch {report.epoch}/{trainer.config.epochs}  lr {report.lr:.4g}  "
            f"loss {report.train_loss:.4f}  valid error {100 * report.valid_error:.2f}%  {report.seconds:.1f} s"
            + (f"  ETA {eta}" if eta else ""))
        if policy.after_epoch(report.epoch):
            save()

    def on_batch(done, total):
        if policy.after_batch(done, total):
            save()

    stop = StopOnSignals(SimpleNamespace(trainer_=trainer), say)
    started = time.perf_counter()
    try:
        try:
            policy.restart()  # the minutes count from the first step, not from loading
            trainer.fit(X_train, y_train, X_valid, y_valid, on_epoch=on_epoch, on_batch=on_batch)
        finally:
            stop.restore()
        save()
    except CheckpointWriteError as exc:  # what to do next depends on whether a checkpoint is there to resume
        raise exc.advise(f"continue the run with: ksae-finetune --resume {folder.path}" if exc.kept else
                         f"start it again in another --run-dir (or after removing {folder.path}: it holds no "
                         f"checkpoint)") from None
    if not trainer.finished:
        click.echo(f"interrupted in phase {trainer.phase}, epoch {trainer.epoch + 1}; checkpoint saved to "
                   f"{folder.checkpoint}; continue with: ksae-finetune --resume {folder.path}", err=True)
        sys.exit(stop.exit_status)
    with backend.use():
        results = {"dataset": dataset, "device": backend.name, "phases": trainer.config.phases,
                   "epochs_per_phase": trainer.config.epochs, "kept": trainer.config.kept,
                   "valid_error": trainer.error(X_valid, y_valid),
                   "test_error": (trainer.error(backend.asarray(data.X_test, dtype=trainer.dtype),
                                                backend.asarray(data.y_test, dtype=np.int64))
                                  if data.X_test is not None else None),
                   "wall_seconds_this_session": time.perf_counter() - started,
                   "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    tmp = folder.path / (RESULTS + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder.path / RESULTS)
    test = f", test error {100 * results['test_error']:.2f}%" if results["test_error"] is not None else ""
    click.echo(f"done: valid error {100 * results['valid_error']:.2f}%{test}; results {folder.path / RESULTS}")


class PhasePace:
    """The time a fine-tuning run still needs, from this session's epochs.

    Phases cost differently (``softmax`` trains only the top layer, ``all`` every layer), so each
    phase is timed on its own; a phase not yet seen in this session is not guessed at: the ETA
    then covers the current phase and says how many phases follow it.
    """

    def __init__(self, phases: list[str], epochs: int):
        self.phases, self.epochs = list(phases), epochs
        self.seconds: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def add(self, report) -> None:
        self.seconds[report.phase] = self.seconds.get(report.phase, 0.0) + report.seconds
        self.count[report.phase] = self.count.get(report.phase, 0) + 1

    def eta(self, trainer) -> str:
        """``3m 05s``, ``3m 05s for this phase, then 2 more phases``, or '' when nothing is timed yet."""
        from ksae_cupy.cli.progress import format_duration

        phase = None if trainer.finished else trainer.phase
        if phase not in self.count:
            return ""
        left = (self.epochs - trainer.epoch) * self.seconds[phase] / self.count[phase]
        later = len(self.phases) - trainer.phase_index - 1  # phases come in order: none of them timed yet
        if later:
            return f"{format_duration(left)} for this phase, then {later} more phase{'s' * (later > 1)}"
        return format_duration(left)


def _baseline_source(path, n_runs: int, encoders: list, ks: list, sources: list) -> dict:
    """Add a ``ksae-baseline`` run's sigmoid layer to ``encoders`` (no k: every unit is kept) and its
    record to ``sources``; return the network options that fine-tune it with its own dropout (section 4.5)."""
    from ksae_cupy.supervised.baselines import encoder
    from ksae_cupy.supervised.pretrain import load_baseline_run

    if n_runs > 1:
        raise KsaeError(f"{path} is a ksae-baseline run; it fine-tunes alone (shallow): give it as the only "
                        f"PRETRAINED_RUN_DIR")
    ckpt, run_config = load_baseline_run(path)
    encoders.append(encoder(ckpt.params))
    ks.append(None)
    sources.append({"run_dir": str(path), "dataset": run_config.get("dataset"), "model": ckpt.config.get("model"),
                    "hidden": int(ckpt.params["W_dh"].shape[1]), "data": run_config.get("data"),
                    "epochs_trained": ckpt.epoch})
    return {"activations": ["sigmoid"], "input_dropout": ckpt.config.get("input_dropout", 0.0),
            "hidden_dropout": ckpt.config.get("hidden_dropout", 0.0)}


def _saver(folder, trainer):
    from ksae_cupy.supervised.checkpoint import save_finetune_checkpoint

    return lambda: save_finetune_checkpoint(folder.checkpoint, {**trainer.state(), "run_id": folder.run_id})


def _default_run_dir(dataset: str, root: Path = Path("runs")) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return root / f"finetune-{Path(dataset).stem}-{stamp}"


def _parse_hidden(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or len(sizes) > 2 or any(h <= 0 for h in sizes):
        raise KsaeError(f"--hidden {text!r} is not allowed; use one or two positive sizes, e.g. 1000 or 1000,1000")
    return sizes


def _parse_phases(text: str | None, L: int) -> list[str]:
    from ksae_cupy.supervised.finetune import PHASES

    if text is None:
        return ["all"] if L == 1 else ["softmax", "top", "all"]
    phases = [p.strip() for p in text.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        raise KsaeError(f"--phases {text!r} is not allowed; use a comma-separated list from {', '.join(PHASES)}")
    return phases
