"""The trainer of a ``ksae-finetune`` session: a new run's, from one or two pretrained run folders,
a baseline pretrained here, or random weights; or a resumed run's, from its checkpoint with the
options given applied or refused as :data:`~ksae_cupy.supervised.commands.FINETUNE` declares them.
Also the positional arguments' meaning and the results file (the progress: finetune_progress.py).

Over 400 lines: a new run's and a resumed run's trainer are made from the same options, checks and records
(the results file with each phase's devices), which must not drift apart."""
from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

import numpy as np

from ksae_cupy.atomic import write_json_atomic
from ksae_cupy.errors import KsaeError, note
from ksae_cupy.supervised import finetune
from ksae_cupy.supervised.commands import FINETUNE
from ksae_cupy.supervised.finetune_config import parse_hidden, parse_phases
from ksae_cupy.supervised.units import check_dropout_rate
from ksae_cupy.session import trained_on
from ksae_cupy.session.fields import APPLIED, DATA, KEPT, REFUSED, named
from ksae_cupy.session.lifecycle import RunJob
from ksae_cupy.training.options import check_positive_finite

RESULTS = "finetune.json"
# Fixed by a run and recorded in another form (--hidden 1000,1000, alpha*k kept): on --resume, giving
# one at all is refused, whatever its value.
RUN_SHAPING = tuple(n for n in named(FINETUNE, REFUSED) + named(FINETUNE, KEPT) + DATA
                    if n not in ("overwrite", "run_dir", "resume"))
IN_CHECKPOINT = tuple(n for n in named(FINETUNE, APPLIED) if n in ("step", "topk"))


def split_arguments(arguments, dataset_option: str | None):
    """``(pretrained run folders, DATASET)`` of the positional arguments: a built-in dataset's name or a
    data file (.npz, .npy, .h5) is DATASET, anything else a run folder. ``--dataset`` is its old spelling."""
    from ksae_cupy.datasets.registry import DATASETS
    from ksae_cupy.datasets.user_files import is_user_file

    datasets = [a for a in arguments if not Path(a).is_dir() and (str(a) in DATASETS or is_user_file(str(a)))]
    runs = [Path(a) for a in arguments if a not in datasets]
    if len(datasets) + (dataset_option is not None) > 1:
        raise KsaeError(f"{len(datasets) + (dataset_option is not None)} datasets given "
                        f"({', '.join(map(str, datasets + [dataset_option] * (dataset_option is not None)))}); "
                        f"fine-tuning takes one")
    return runs, (str(datasets[0]) if datasets else dataset_option)


def check_step(step: str) -> None:
    """``--step`` checked by its rule (training/config.py: RULES), before anything is read."""
    from ksae_cupy.training.config import check_by_rule

    check_by_rule("step", step)


def refuse_on_resume(options, pretrained) -> None:
    if pretrained:
        raise KsaeError("--resume takes no PRETRAINED_RUN_DIR; the run folder remembers its own")
    typed = sorted("DATASET" if name == "dataset" else "--" + name.replace("_", "-")
                   for name in options.given & set(RUN_SHAPING))
    if typed:
        raise KsaeError(f"--resume: {', '.join(typed)} cannot change a run in progress; leave them out")


def resumed_trainer(folder, backend, options):
    """The run's trainer from its checkpoint, --step and --topk applied when given (the same math)."""
    from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint

    state = load_finetune_checkpoint(folder.checkpoint)
    folder.check_checkpoint(state.get("run_id"))  # this folder's run, not a copy
    state["config"].update(applied(options))
    return finetune.FinetuneTrainer.from_state(state, backend)


def applied(options) -> dict:
    """The options applied to a resumed run's configuration, as given (--step, --topk: the same math)."""
    return {name: getattr(options, name) for name in IN_CHECKPOINT if name in options.given}


def dropouts(options) -> dict:
    """--input-dropout and --hidden-dropout where given (None: the baseline's own rates, or none)."""
    rates = {"input_dropout": options.input_dropout, "hidden_dropout": options.hidden_dropout}
    return {name: rate for name, rate in rates.items() if rate is not None}


def check_new(options, pretrained) -> None:
    """The ``options`` of a new run that contradict each other, before any work."""
    baseline, no_pretraining, given = options.baseline, options.no_pretraining, options.given
    if len(pretrained) > 2:
        raise KsaeError(f"{len(pretrained)} pretrained runs given; fine-tuning takes one (shallow) or two (deep)")
    if no_pretraining and pretrained:
        raise KsaeError("--no-pretraining contradicts the PRETRAINED_RUN_DIR arguments; give one or the other")
    if baseline and (pretrained or no_pretraining):
        raise KsaeError(f"--baseline {baseline} contradicts "
                        f"{'the PRETRAINED_RUN_DIR arguments' if pretrained else '--no-pretraining'}; give one")
    if not no_pretraining and not pretrained and not baseline:
        raise KsaeError("missing PRETRAINED_RUN_DIR; give one or two ksae-train or ksae-baseline run folders, "
                        "--no-pretraining or --baseline")
    rates = {"--lr-start": options.lr_start, "--lr-end": options.lr_end, "--softmax-lr-start": options.softmax_lr_start}
    for flag, rate in rates.items():  # a rate that is no rate first: not as a rising schedule
        if rate is not None:
            check_positive_finite(flag, rate, "learning rate")
    if options.lr_end > options.lr_start and not options.rising_lr:  # NaN is named by the config's check
        raise KsaeError(f"--lr-end {options.lr_end} is above --lr-start {options.lr_start}: the rate would rise "
                        f"over the run (the paper's falls from 1 to 0.001); swap them, or give --rising-lr if that is "
                        f"meant")
    softmax_start = options.softmax_lr_start
    if softmax_start is not None and options.lr_end > softmax_start and not options.rising_lr:
        raise KsaeError(f"--lr-end {options.lr_end} is above --softmax-lr-start {softmax_start}: the softmax "
                        f"phase's rate would rise; give a smaller --lr-end, or --rising-lr if that is meant")
    typed = {name for name in ("hidden", "k") if name in given}
    if pretrained and typed:
        many = len(typed) > 1
        raise KsaeError(f"{' and '.join('--' + name for name in sorted(typed))} only appl{'y' if many else 'ies'} "
                        f"with --no-pretraining or --baseline: the PRETRAINED_RUN_DIR runs set the layers' sizes and "
                        f"k; leave {'them' if many else 'it'} out")
    if options.units != "ksparse" and not no_pretraining:
        raise KsaeError(f"--units {options.units} only applies with --no-pretraining (the pretrained or baseline "
                        f"layers set the units); leave it out")
    if options.units == "relu" and "k" in given:
        raise KsaeError("--k does not apply with --units relu: a plain network keeps every unit; leave it out")
    if baseline and "k" in typed:
        raise KsaeError(f"--k only applies with --no-pretraining: --baseline {baseline} gives sigmoid layers, which "
                        f"keep every unit; leave it out")
    for name, rate in dropouts(options).items():  # before --baseline's pretraining, not after it
        check_dropout_rate(name, rate)
    phases = [phase.strip() for phase in (options.phases or "").split(",") if phase.strip()]
    repeated = sorted({phase for phase in phases if phases.count(phase) > 1}, key=phases.index)
    if repeated:  # allowed (more epochs of a phase), but not the continuation it may look like
        note(f"--phases {options.phases}: phase {' and '.join(repeated)} comes more than once; each time it runs "
             f"its --epochs again with its rate schedule restarted from the start (--lr-start"
             f"{' or --softmax-lr-start' if 'softmax' in repeated else ''}), not continued")
    if "pretrain_epochs" in given and not baseline:
        raise KsaeError(f"--pretrain-epochs {options.pretrain_epochs} only applies with --baseline (which pretrains "
                        f"its layers here); the other runs' layers are trained already; leave it out")
    if "alpha" in given and (baseline or options.units == "relu"):
        raise KsaeError(f"--alpha {options.alpha} has no effect with "
                        f"{'--baseline ' + baseline if baseline else '--units relu'}: its layers keep every unit; "
                        f"leave it out")
    if options.pretrain_epochs <= 0:
        raise KsaeError(f"--pretrain-epochs {options.pretrain_epochs} is not allowed; use a positive number of "
                        f"epochs")
    if baseline and options.step == "sparse":  # said before the pretraining, not after it
        raise KsaeError(f"--step sparse needs k-sparse layers without dropout; --baseline {baseline} gives "
                        f"sigmoid layers; use --step dense or auto")


def read_pretrained(pretrained, alpha: float | None = None) -> tuple[list, list, list, dict]:
    """``(encoders, ks, sources, network)`` of the pretrained run folders; ``alpha``: the fine-tuning's, checked
    against the alpha layer 2's codes were written with
    (:func:`~ksae_cupy.session.trained_on.check_codes_alpha`)."""
    from ksae_cupy.supervised.baseline_trainer import is_baseline_run
    from ksae_cupy.supervised.pretrain import encoder_of, load_pretrained_run

    encoders, ks, sources, network = [], [], [], {}
    baseline = [is_baseline_run(path) for path in pretrained]
    if any(baseline) and not all(baseline):
        kinds = ", ".join(f"{path} ({'ksae-baseline' if b else 'ksae-train'})" for path, b in zip(pretrained, baseline))
        raise KsaeError(f"the pretrained runs mix k-sparse and baseline layers ({kinds}); give ksae-train runs only "
                        f"or ksae-baseline runs only")
    for path, is_baseline in zip(pretrained, baseline):
        if is_baseline:  # a ksae-baseline run: its sigmoid layer, fine-tuned with its dropout (4.5)
            network = _baseline_source(path, encoders, ks, sources)
            continue
        model, run_config = load_pretrained_run(path, device="cpu")
        encoders.append(encoder_of(model))
        ks.append(model.k)
        # epochs_trained: the pretrained run's epochs when it was read (a run may go on training after);
        # its units and the options beyond the paper, so a report can tell the paper's recipe from the others
        sources.append({"run_dir": str(path), "dataset": run_config.get("dataset"), "k": model.k,
                        "hidden": model.n_hidden, "data": run_config.get("data"),
                        "epochs_trained": model.trainer_.epoch, "activation": model.activation,
                        "aux_k": int(model.aux_k), "center_input": bool(model.center_input),
                        **_provenance(run_config, model.run_id_)})
    if len(encoders) == 2:  # the shapes first: two layers in the wrong order are named as such
        check_stacking(pretrained, [W_dh.shape for W_dh, _ in encoders])
    if len(sources) == 2:  # layer 2 must have been trained on the codes of layer 1 as it is now
        trained_on.check_chain(pretrained[0], sources[0]["run_id"], sources[0]["epochs_trained"], pretrained[1],
                               sources[1]["config"])
        trained_on.check_codes_alpha(alpha, pretrained, sources[1]["config"])
    for source in sources:
        del source["config"]  # config.json keeps what it records of each layer, not its whole config
    return encoders, ks, sources, network


def _provenance(run_config: dict, run_id: str | None) -> dict:
    """A pretrained layer's record for :func:`read_pretrained`: its data's SHA-256 and run id (kept in
    config.json) and its config.json (for the chain check, then dropped)."""
    return {"dataset_sha256": run_config.get("dataset_sha256"), "run_id": run_config.get("run_id") or run_id,
            "config": run_config}


def check_stacking(pretrained, shapes) -> None:
    """Refuse two layers whose widths do not chain (layer 2 takes layer 1's codes as input), naming the
    cause: the two given in the wrong order, or layer 2 trained on other data."""
    (D_1, H_1), (D_2, H_2) = shapes
    if D_2 == H_1:
        return
    first, second = pretrained
    if D_1 == H_2:
        raise KsaeError(f"the pretrained runs are in the wrong order: {second} has {H_2} units, the {D_1} inputs "
                        f"{first} takes, so {second} is layer 1; give layer 1 first: ksae-finetune {second} {first}")
    raise KsaeError(f"layer 2 takes {D_2} inputs but layer 1 has {H_1} hidden units; the pretrained runs do not "
                    f"stack ({first}, then {second}); train layer 2 on layer 1's codes (ksae-data codes {first} "
                    f"codes.npz, then ksae-train codes.npz)")


def check_alpha_applies(options, ks: list) -> None:
    """Refuse --alpha for pretrained layers that keep every unit (ksae-baseline runs: no k to multiply)."""
    if "alpha" in options.given and ks and all(k is None for k in ks):
        raise KsaeError(f"--alpha {options.alpha} has no effect on ksae-baseline layers: their sigmoid units are "
                        f"all kept; leave it out")


def data_of(dataset, sources, options):
    """The run's DataSpec: DATASET's, else the pretrained run's data with its splits (labels or a test set
    may be added by the data ``options``)."""
    from ksae_cupy.datasets.user_files import DataSpec

    from ksae_cupy.session.runs import dataset_record

    given = {key: getattr(options, key) for key in DATA[1:] if getattr(options, key) is not None}
    layer1 = sources[0] if sources else {}
    if dataset is not None:
        if layer1.get("dataset") and dataset_record(dataset, False)["dataset"] == layer1["dataset"]:
            trained_on.check_data(layer1["dataset"], layer1.get("dataset_sha256"), layer1["run_dir"])
        return DataSpec(dataset, **given).validate().resolved()
    if layer1.get("dataset") is None:
        raise KsaeError("missing DATASET; name a labelled dataset such as mnist")
    trained_on.check_data(layer1["dataset"], layer1.get("dataset_sha256"), layer1["run_dir"])  # the rows it learnt
    trained_on.check_data_files(layer1["data"], layer1["run_dir"], given)  # its labels and test set, unless replaced
    return DataSpec.from_record(layer1["dataset"], layer1["data"]).for_run(**given)


def new_trainer(options, pretrained, read, data, backend):
    """The network of a new run (pretrained, or random) and its trainer; returns it and config.json's record
    of where its weights came from. With ``--baseline`` the trainer is None: its layers are pretrained once
    the run folder exists (:func:`baseline_trainer`), and the record holds their settings."""
    from ksae_cupy.model import alpha_k
    from ksae_cupy.training.options import check_batch_size

    encoders, ks, sources, network = read
    if data.y_train is None:
        raise KsaeError(f"dataset {data.name!r} has no labels; fine-tuning needs labels: --labels, or an .npz "
                        f"holding y, or a labelled dataset such as mnist")
    rng, dtype, baseline = np.random.default_rng(options.seed), np.dtype(options.dtype), options.baseline
    host_params, pretrain_layers = None, None
    if options.no_pretraining:
        sizes = parse_hidden(options.hidden)
        plain = options.units == "relu"  # every unit kept: Table fn_mnist's row read as a plain ReLU network
        ks = [None if plain else options.k] * len(sizes)
        host_params = finetune.init_random(data.dim, sizes, data.n_classes, options.sigma, rng, dtype)
        if plain:
            network = dict(activations=["relu"] * len(sizes))
    elif baseline:
        from ksae_cupy.supervised import baseline_fit, baselines
        from ksae_cupy.supervised.baseline_trainer import config_to_dict

        sizes = parse_hidden(options.hidden)
        ks = [None] * len(sizes)  # sigmoid layers keep every unit
        configs = baseline_fit.stack_configs(baseline, sizes, options.pretrain_epochs, options.seed)
        for config in configs:  # before the folder is made: a bad input writes nothing
            config.validate(n_train=len(data.X_train))
        baselines.BASELINES[baseline].check_input(data.X_train)  # layer 1's (the RBM's visible units: in [0, 1])
        pretrain_layers = [config_to_dict(layer) for layer in configs]  # config.json: each layer's settings
        network = dict(activations=["sigmoid"] * len(sizes), **baselines.REGULARISATION[baseline])  # section 4.5
    else:
        if encoders[0][0].shape[0] != data.dim:
            raise KsaeError(f"the pretrained run {pretrained[0]} takes {encoders[0][0].shape[0]} dimensions, "
                            f"{data.name} has {data.dim}")
        host_params = finetune.init_from_encoders(encoders, data.n_classes, options.sigma, rng, dtype)
    network = {**network, **dropouts(options)}  # in place of the baseline's own rates (or of none)
    sizes = ([host_params[finetune.layer_names(l)[0]].shape[1] for l in range(1, len(ks) + 1)]
             if host_params is not None else sizes)
    kept = [None if k_l is None else alpha_k(k_l, options.alpha, H_l) for k_l, H_l in zip(ks, sizes)]
    config = finetune.FinetuneConfig(
        kept=kept, phases=parse_phases(options.phases, len(ks)), **network, epochs=options.epochs,
        batch_size=options.batch_size, lr_start=options.lr_start, lr_end=options.lr_end,
        softmax_lr_start=options.softmax_lr_start, momentum=options.momentum, momentum_end=options.momentum_end,
        momentum_epochs=options.momentum_epochs, sigma=options.sigma, seed=options.seed, dtype=options.dtype,
        step=options.step, topk=options.topk, train_on=options.train_on)
    check_batch_size("--batch-size", config.batch_size, len(data.X_train))  # the rest: the trainer validates
    record = {"alpha": options.alpha, "pretrained": sources, "no_pretraining": bool(options.no_pretraining),
              "units": options.units,
              "baseline": baseline, "pretrain_epochs": options.pretrain_epochs if baseline else None,
              "pretrain_seconds": None,  # --baseline: each layer's seconds, once pretrained
              # reports tell runs from before upper layers had their own start by its absence
              "pretrain_layers": pretrain_layers, "finetune": config.to_dict()}
    if baseline:
        return None, record
    return finetune.FinetuneTrainer(config, backend, host_params, rng), record


def baseline_trainer(run, record: dict, spec, data, say):
    """``--baseline``: pretrain its layers, each a ``ksae-baseline`` run folder inside the run's
    (:mod:`~ksae_cupy.supervised.baseline_pretrain`; a resume goes on where a stop left them), then the
    fine-tuning trainer they initialise, seeded as ``--seed`` says; config.json gets each layer's
    pretraining seconds. Ends the session with the resume line when a stop signal came first."""
    from ksae_cupy.supervised import baseline_pretrain, baselines
    from ksae_cupy.supervised.baseline_trainer import config_from_dict

    config = finetune.FinetuneConfig.from_dict(record["finetune"])
    configs = [config_from_dict(layer) for layer in record["pretrain_layers"]]
    stack = baseline_pretrain.pretrain_layers(run, configs, spec, data, say)
    seconds = [sum(r["seconds"] for r in baseline_pretrain.layer_folder(run.folder.path, l).read_metrics())
               for l in range(1, len(configs) + 1)]  # every epoch's, whichever session trained it
    run.config["pretrain_seconds"] = record["pretrain_seconds"] = seconds
    run.folder.write_config(run.config)
    rng = np.random.default_rng(config.seed)  # as a run that was never stopped: the pretraining draws from its own
    host_params = finetune.init_from_encoders([baselines.encoder(p) for p in stack], data.n_classes, config.sigma,
                                              rng, np.dtype(config.dtype))
    return finetune.FinetuneTrainer(config, run.backend, host_params, rng)


def training_rows(data, config):
    """``(X_nd, y_n, X_valid_nd, y_valid_n)`` fine-tuned on and reported (host arrays): the training rows,
    and for ``train+valid`` the validation rows with them (then nothing is reported as validation)."""
    if config.fits_valid_rows:
        return (np.concatenate([data.X_train, data.X_valid]), np.concatenate([data.y_train, data.y_valid]),
                None, None)
    return data.X_train, data.y_train, data.X_valid, data.y_valid


def write_results(folder, trainer, data, dataset: str, backend, started: float) -> dict:
    """finetune.json: the validation and test error of the fine-tuned net (atomically); no validation
    error when the validation rows were fine-tuned on (``--train-on train+valid``)."""
    with backend.use():
        def error(X, y):
            return trainer.error(backend.asarray(X, dtype=trainer.dtype), backend.asarray(y, dtype=np.int64))

        valid_rows_tuned = trainer.config.fits_valid_rows
        results = {"dataset": dataset, "device": backend.name, "phase_devices": phase_devices(folder.read_metrics()),
                   "phases": trainer.config.phases,
                   "epochs_per_phase": trainer.config.epochs, "kept": trainer.config.kept,
                   "train_on": trainer.config.train_on,
                   "valid_error": None if valid_rows_tuned else error(data.X_valid, data.y_valid),
                   "test_error": error(data.X_test, data.y_test) if data.X_test is not None else None,
                   "wall_seconds_this_session": time.perf_counter() - started,
                   "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    write_json_atomic(folder.path / RESULTS, results)
    return results


def phase_devices(records: list[dict]) -> dict:
    """``{phase: [devices its epochs ran on]}`` from metrics.jsonl's records, in the order first met ("device"
    in finetune.json is only the last session's: a run resumed elsewhere ran its phases on two devices).
    Epochs logged before the records said it count as "unknown"."""
    devices: dict = {}
    for record in records:
        seen = devices.setdefault(record.get("phase"), [])
        device = record.get("device") or "unknown"
        if device not in seen:
            seen.append(device)
    return devices


def _baseline_source(path, encoders: list, ks: list, sources: list) -> dict:
    """Add a ``ksae-baseline`` run's sigmoid layer to ``encoders`` (no k: every unit is kept) and its
    record to ``sources``; return the network options that fine-tune it with its own dropout (section 4.5).

    A stack (section 4.6: layer l+1 a ``ksae-baseline`` run on layer l's features, written by
    :func:`~ksae_cupy.supervised.pretrain.write_codes`) is one baseline throughout, so that one
    dropout setting fine-tunes every layer as each was pretrained.
    """
    from ksae_cupy.supervised.baselines import encoder
    from ksae_cupy.supervised.pretrain import load_baseline_run

    ckpt, run_config = load_baseline_run(path)
    model = ckpt.config.get("model")
    if sources and model != sources[0]["model"]:
        raise KsaeError(f"{path} is a {model} run but layer 1 ({sources[0]['run_dir']}) is a {sources[0]['model']} "
                        f"run; a stack of baseline layers is one baseline throughout (its dropout is fine-tuned "
                        f"in every layer)")
    encoders.append(encoder(ckpt.params))
    ks.append(None)
    sources.append({"run_dir": str(path), "dataset": run_config.get("dataset"), "model": model,
                    "hidden": int(ckpt.params["W_dh"].shape[1]), "data": run_config.get("data"),
                    "epochs_trained": ckpt.epoch, **_provenance(run_config, ckpt.run_id)})
    return {"activations": ["sigmoid"] * len(encoders), "input_dropout": ckpt.config.get("input_dropout", 0.0),
            "hidden_dropout": ckpt.config.get("hidden_dropout", 0.0)}


class FinetuneJob(RunJob):
    """What :meth:`~ksae_cupy.session.lifecycle.RunLifecycle.fit` trains for ``ksae-finetune``: the phases of
    ``trainer`` on ``rows`` (train and valid inputs and labels, on the device), its checkpoint in ``folder``,
    a line per epoch by ``pace`` and the bar by ``progress``."""

    def __init__(self, trainer, rows, folder, pace, progress):
        self.network, self.rows, self.folder, self.pace, self.progress = trainer, rows, folder, pace, progress

    def trainer(self):
        return self.network

    def fit(self, on_epoch, on_batch) -> None:
        X_train, y_train, X_valid, y_valid = self.rows
        self.network.fit(X_train, y_train, X_valid, y_valid, on_epoch=on_epoch, on_batch=on_batch)

    def save(self) -> None:
        from ksae_cupy.supervised.checkpoint import save_finetune_checkpoint

        save_finetune_checkpoint(self.folder.checkpoint, {**self.network.state(), "run_id": self.folder.run_id})

    def epoch_lines(self, report) -> list[str]:
        self.progress.clear()
        return [self.pace.line(report, self.network)]

    def on_batch(self, done: int, total: int) -> None:
        self.progress.on_batch(done, total)

    def on_end(self) -> None:
        self.progress.clear()


def default_run_dir(dataset: str, root: Path = Path("runs")) -> Path:
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return root / f"finetune-{Path(dataset).stem}-{stamp}"
