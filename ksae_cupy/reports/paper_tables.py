"""Tables err_mnist and fn_mnist from run folders, beside the paper's figures.

Each run folder under a root is read (config.json, metrics.jsonl, eval.json / finetune.json,
never the checkpoint) and placed in the table row it is, by what its config.json says:

* err_mnist: a ``ksae-train`` run on MNIST with 1000 units, the paper's recipe (linear units, no
  AuxK, inputs not centred) and k = 10, 25 or 40; a ``ksae-baseline`` run (RBM, dropout, denoising,
  dropout + denoising AE) on MNIST with 1000 units; raw pixels from a ksae-eval ``--raw-baseline``;
* fn_mnist: a ``ksae-finetune`` run on MNIST: ``--no-pretraining``; ``--baseline`` (one layer, or two
  for the deep dropout AE); a ``ksae-baseline`` run fine-tuned; one or two k-sparse runs (k = 25).

Runs of one row at one length (epochs; for fine-tuning, pretraining + fine-tuning) are one line,
their seeds as mean ± standard deviation. :func:`plan` says, for each row at the asked length and
seeds, what is left to run (a new run, a resume, an evaluation), as the commands that do it.

Over 400 lines: every table of the paper this package reproduces, each row with the run folders it reads and
the plan that fills it; one file, so a row and its plan are changed together.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

from ksae_cupy import paper
from ksae_cupy.reports.children import exit_meaning
from ksae_cupy.reports.folders import (BASELINE, DIVERGED, RunState, broken_reason, clear_unstarted, find_runs,
                                      read_json, record_diverged)
from ksae_cupy.reports.markdown import percent, percent_spread, table
from ksae_cupy.supervised.baseline_trainer import config_for
from ksae_cupy.supervised.baselines import BASELINES, REGULARISATION
from ksae_cupy.supervised.commands import FINETUNE_PAPER as PAPER_FINETUNE  # momentum 0.25 throughout
from ksae_cupy.session.runs import FINETUNE, TRAIN

ERR, FN = "err_mnist", "fn_mnist"
TABLES = {ERR: paper.ERR_MNIST, FN: paper.FN_MNIST}
# Our choice of the baselines' learning rate and weight decay: the validation grid of bin/baseline-grid
# (5 epochs a point; the paper gives none; docs/baselines-grid.md), which the config classes hold as their
# defaults; the commands still spell them out, so that a row's command keeps its meaning.
BASELINE_SETTINGS = {model: (f"{config.lr:g}", f"{config.weight_decay:g}")
                     for model, config in ((m, config_for(m)) for m in REGULARISATION)}
FN_OF_BASELINE_RUN = tuple(name for name, b in BASELINES.items() if b.fine_tuned)  # fn_mnist rows of a baseline run


@dataclass(frozen=True)
class Length:
    """How long a row's runs trained: ``pretrain`` epochs (of the first layer, for a fine-tuning
    row; None without pretraining), ``finetune`` epochs per phase times ``phases``, and ``layer2``:
    a deep row's second layer's epochs where they differ from the first's (else None)."""

    pretrain: int | None
    finetune: int | None = None
    phases: int = 1
    layer2: int | None = None

    def __str__(self) -> str:
        if self.finetune is None:
            return str(self.pretrain)
        tuned = f"{self.finetune}" + (f" x {self.phases}" if self.phases > 1 else "")
        pretrain = f"{self.pretrain}" + (f" (layer 2: {self.layer2})" if self.layer2 is not None else "")
        return tuned if self.pretrain is None else f"{pretrain} + {tuned}"


@dataclass
class Found:
    """One run folder that is a row of a table."""

    table: str
    key: str
    length: Length
    seed: int | None
    state: RunState

    @cached_property  # reads the pretrained runs' config.json: once per folder, not per use
    def on_gpu(self) -> bool:
        """Trained, or for a fine-tuning pretrained, on a GPU: its own line beside the CPU runs' (a GPU run
        of seed 0 is not another seed, and float32 on another device takes another path)."""
        configs = [self.state.config, *(_source_config(source, self.state.path)
                                        for source in self.state.config.get("pretrained") or [])]
        return any(str(config.get("device") or "cpu").startswith("gpu") for config in configs)

    @cached_property
    def device_note(self) -> str | None:
        """Where a GPU did the work, as the label says it: "trained on a GPU" (err_mnist); for a fine-tuning, the
        layers pretrained on one ("pretrained on a GPU" when all were, else "layer 2 pretrained on a GPU") and
        the phases fine-tuned on one (finetune.json's phase_devices; before it, config.json's device)."""
        def gpu(device) -> bool:
            return str(device or "cpu").startswith("gpu")

        if self.table != FN:
            return "trained on a GPU" if self.on_gpu else None
        layers = [gpu(_source_config(source, self.state.path).get("device"))
                  for source in self.state.config.get("pretrained") or []]
        parts = []
        if layers and all(layers):
            parts.append("pretrained on a GPU")
        elif any(layers):
            on = [str(i + 1) for i, on_gpu in enumerate(layers) if on_gpu]
            parts.append(f"layer{'s' if len(on) > 1 else ''} {' and '.join(on)} pretrained on a GPU")
        phases = (self.state.results or {}).get("phase_devices") or {
            phase: [self.state.config.get("device")] for phase in (self.state.config.get("finetune") or {}).get("phases") or ["all"]}
        tuned_on_gpu = [phase for phase, devices in phases.items() if any(gpu(d) for d in devices)]
        if tuned_on_gpu:
            whole = len(tuned_on_gpu) == len(phases) and all(gpu(d) for devices in phases.values() for d in devices)
            parts.append("fine-tuned on a GPU" if whole else
                         f"fine-tuned partly on a GPU (phase{'s' if len(tuned_on_gpu) > 1 else ''} "
                         f"{', '.join(tuned_on_gpu)})")
        return ", ".join(parts) or None

    @cached_property
    def notes(self) -> tuple[str, ...]:
        """What sets this run apart from the paper's recipe while still being its row: a GPU, a fine-tuning's
        own softmax-phase rate or rows. Runs with the same notes share a line; the notes follow the row's label."""
        tuned = self.state.config.get("finetune") or {}
        gpu = self.device_note
        softmax = tuned.get("softmax_lr_start")
        if softmax is not None and softmax == tuned.get("lr_start"):
            softmax = None  # the paper's schedule, typed out: the recipe's own row
        rows = tuned.get("train_on", "train")
        config = self.state.config
        # ksae-finetune --baseline before its upper autoencoder layers had their own start (sigma 0.1):
        # at sigma 0.01 layer 2 learnt only the mean, so its command no longer makes that run
        mean_only = (config.get("baseline") not in (None, "rbm") and len(tuned.get("kept") or []) > 1
                     and config.get("pretrain_layers") is None)
        return tuple(note for note in (gpu, _rate_note(tuned) if self.table == FN else None,
                                       None if softmax is None else f"softmax phase from lr {softmax:g}",
                                       _momentum_note(tuned) if self.table == FN else None,
                                       _dropout_note(self.key, tuned) if self.table == FN else None,
                                       None if rows == "train" else f"fine-tuned on {rows}",
                                       "layer 2 pretrained at sigma 0.01" if mean_only else None) if note)

    @property
    def test_error(self):
        return _errors(self)[0]

    @property
    def valid_error(self):
        return _errors(self)[1]


def _rate_note(tuned: dict) -> str | None:
    """A fine-tuning's learning-rate schedule where it is not the paper's (1 -> 0.001 on MNIST)."""
    start = tuned.get("lr_start", PAPER_FINETUNE.lr_start)
    end = tuned.get("lr_end", PAPER_FINETUNE.lr_end)
    if (start, end) == (PAPER_FINETUNE.lr_start, PAPER_FINETUNE.lr_end):
        return None
    return f"lr {start:g} -> {end:g}"


def _rate_options(tuned: dict) -> list:
    """ksae-finetune's --lr-start / --lr-end that made ``tuned`` where they are not the paper's."""
    return [option for name in ("lr_start", "lr_end")
            if tuned.get(name, getattr(PAPER_FINETUNE, name)) != getattr(PAPER_FINETUNE, name)
            for option in ("--" + name.replace("_", "-"), f"{tuned[name]:g}")]


def _momentum_note(tuned: dict) -> str | None:
    """A fine-tuning's momentum where it is not the paper's 0.25 throughout: a rising one, or another constant."""
    start, end = tuned.get("momentum", PAPER_FINETUNE.momentum), tuned.get("momentum_end")
    if end is not None:
        return f"momentum {start:g} -> {end:g}" + (f" over {tuned['momentum_epochs']} epochs"
                                                   if tuned.get("momentum_epochs") is not None else "")
    return None if start == PAPER_FINETUNE.momentum else f"momentum {start:g}"


def _momentum_options(tuned: dict) -> list:
    """ksae-finetune's momentum options that made ``tuned`` where they are not the paper's."""
    options = []
    if tuned.get("momentum", PAPER_FINETUNE.momentum) != PAPER_FINETUNE.momentum:
        options += ["--momentum", f"{tuned['momentum']:g}"]
    if tuned.get("momentum_end") is not None:
        options += ["--momentum-end", f"{tuned['momentum_end']:g}"]
    if tuned.get("momentum_epochs") is not None:
        options += ["--momentum-epochs", tuned["momentum_epochs"]]
    return options


def _changed_dropout(key: str, tuned: dict) -> dict:
    """A fine-tuning's dropout rates where they are not its row's own (the baseline's, section 4.5; none for
    the k-sparse and random rows): ``ksae-finetune --input-dropout / --hidden-dropout``."""
    own = REGULARISATION.get(key.removeprefix("deep-"), {})
    rates = {name: tuned.get(name, own.get(name, 0.0)) for name in ("input_dropout", "hidden_dropout")}
    return {name: rate for name, rate in rates.items() if rate != own.get(name, 0.0)}


def _dropout_note(key: str, tuned: dict) -> str | None:
    changed = _changed_dropout(key, tuned)
    return ", ".join(f"{name.replace('_', ' ')} {rate:g}" for name, rate in changed.items()) or None


def _dropout_options(key: str, tuned: dict) -> list:
    return [option for name, rate in _changed_dropout(key, tuned).items()
            for option in ("--" + name.replace("_", "-"), f"{rate:g}")]


def _errors(found: Found):
    results = found.state.results or {}
    if not found.state.done:
        return None, None
    if found.table == FN:
        return results.get("test_error"), results.get("valid_error")
    features = results.get("features") or {}
    return features.get("test_error"), (features.get("selected") or {}).get("valid_error")


# -- which row a folder is -----------------------------------------------------------------------

def classify(state: RunState) -> Found | None:
    """The table row ``state``'s folder is, or None (another dataset, size or recipe)."""
    config = state.config
    if config.get("dataset") != paper.DATASET:
        return None
    if state.kind == TRAIN:
        train = config.get("train") or {}
        if train.get("hidden") != paper.HIDDEN or not _paper_recipe(train) or train.get("k") not in paper.KSPARSE_KS:
            return None
        return Found(ERR, paper.ksparse_key(train["k"]), Length(train.get("epochs")), train.get("seed"), state)
    if state.kind == BASELINE:
        baseline = config.get("baseline") or {}
        model = config.get("model") or baseline.get("model")
        if baseline.get("hidden") != paper.HIDDEN or model not in paper.errors(paper.ERR_MNIST):
            return None
        return Found(ERR, model, Length(baseline.get("epochs")), baseline.get("seed"), state)
    if state.kind == FINETUNE:
        return _classify_finetune(state)
    return None


def _classify_finetune(state: RunState) -> Found | None:
    config = state.config
    tuned = config.get("finetune") or {}
    layers = len(tuned.get("kept") or [])
    sources = config.get("pretrained") or []
    pretrain = None
    if config.get("no_pretraining"):
        plain = config.get("units") == "relu"  # ksae-finetune --units relu (folders before it: k-sparse units)
        key = ("no-pretraining-relu" if plain else "no-pretraining") if layers == 1 else None
    elif config.get("baseline"):
        baseline, pretrain = config["baseline"], config.get("pretrain_epochs")
        key = {**{(1, name): name for name in FN_OF_BASELINE_RUN},  # a Table fn_mnist row of each, one layer
               (2, "dropout-ae"): "deep-dropout-ae"}.get((layers, baseline))
    elif sources and all(source.get("model") for source in sources):  # a ksae-baseline run, fine-tuned
        model = sources[0]["model"] if len({source["model"] for source in sources}) == 1 else None
        key = (model if model in FN_OF_BASELINE_RUN else None) if len(sources) == 1 else \
            ("deep-dropout-ae" if (len(sources), model) == (2, "dropout-ae") else None)
        pretrain = _source_epochs(sources[0], state.path)
    elif sources and all(source.get("k") == 25 and source.get("hidden") == paper.HIDDEN and
                         _paper_recipe(_source_train(source, state.path)) for source in sources):
        key = {1: "ksparse", 2: "deep-ksparse"}.get(len(sources))
        pretrain = _source_epochs(sources[0], state.path)
    else:
        key = None
    if key is None:
        return None
    phases = len(tuned.get("phases") or ["all"])
    layer2 = _source_epochs(sources[1], state.path) if len(sources) > 1 else None
    layer2 = None if layer2 == pretrain else layer2  # the row's length says it once
    return Found(FN, key, Length(pretrain, tuned.get("epochs"), phases, layer2), tuned.get("seed"), state)


def _paper_recipe(train: dict) -> bool:
    """Whether a k-sparse run's ``train`` settings are the paper's: linear units, no AuxK, no centring."""
    return train.get("activation", "linear") == "linear" and not train.get("aux_k") and not train.get("center_input")


def _source_train(source: dict, folder: Path) -> dict:
    """A pretrained k-sparse run's settings as the fine-tuning recorded them, or for a folder written before
    that was recorded, as the run's own config.json says (:func:`_source_folder`; none found: {}, the paper's,
    as runs then were)."""
    return source if "center_input" in source else (_source_config(source, folder).get("train") or {})


def _source_folder(source: dict, folder: Path) -> Path:
    """The pretrained run's folder: the run beside ``folder`` (run folders are moved together, e.g. into
    results/runs) of that name, or a copy of the run recorded (its config.json keeps the folder it ran in)
    in ``folder``'s parent or below one of the two above it (a fine-tuning's layers sit in its own
    pretrain/ folder, its first layer among the runs beside it); else the path recorded."""
    recorded = Path(source.get("run_dir", ""))
    beside = folder.parent / recorded.name
    if (beside / "config.json").is_file():
        return beside
    for parent in list(folder.parents)[:3]:
        copy = _copies_below(parent).get(str(recorded))
        if copy is not None:
            return copy
    return recorded


@lru_cache(maxsize=8)
def _copies_below(parent: Path) -> dict[str, Path]:
    """``{the folder a run ran in: where it is now}`` for the run folders below ``parent`` (read once per report)."""
    copies = {}
    for config_path in sorted(parent.rglob("config.json")):
        ran_in = (read_json(config_path) or {}).get("run_dir")
        if ran_in and Path(ran_in) != config_path.parent:
            copies.setdefault(str(ran_in), config_path.parent)
    return copies


def _source_config(source: dict, folder: Path) -> dict:
    """The pretrained run's config.json (:func:`_source_folder`); {} when it is not there."""
    return read_json(_source_folder(source, folder) / "config.json") or {}


def _source_epochs(source: dict, folder: Path) -> int | None:
    """The epochs of a pretrained run when the fine-tuning read it; for a folder written before
    that was recorded, the epochs its own config.json asks for: the run of that name beside
    ``folder`` (run folders are moved together), else at the path recorded."""
    if source.get("epochs_trained") is not None:
        return source["epochs_trained"]
    config = _source_config(source, folder)
    return (config.get("train") or config.get("baseline") or {}).get("epochs")


def collect(root: Path) -> list[Found]:
    """Every run folder under ``root`` that is a row of Table err_mnist or fn_mnist and whose command can run
    again from a clone (:func:`inputs_gone`; the others are :func:`gone_rows`)."""
    return [found for found in classify_all(root) if inputs_gone(found, root) is None]


def gone_rows(root: Path) -> list[tuple[Found, str]]:
    """``(found, why)`` of every row whose printed command could not run again from a clone: not in the tables."""
    return [(found, why) for found in classify_all(root) if (why := inputs_gone(found, root)) is not None]


def classify_all(root: Path) -> list[Found]:
    return [found for found in map(classify, find_runs(root)) if found is not None]


# -- what a row's command needs from a clone -------------------------------------------------------------

def input_folders(found: Found) -> list[Path]:
    """The run folders whose checkpoints the row's printed command reads: ksae-eval's run (err_mnist), the
    pretrained runs ksae-finetune starts from (fn_mnist; none for --no-pretraining and --baseline rows)."""
    state = found.state
    if found.table == ERR:
        return [state.path]
    if state.config.get("no_pretraining") or state.config.get("baseline"):
        return []
    return [_source_folder(source, state.path) for source in state.config.get("pretrained") or []]


def inputs_gone(found: Found, root: Path) -> str | None:
    """Why the row's printed command cannot run again from a clone of the repository holding ``root``, or None:
    a folder it reads lies outside the repository, or holds no checkpoint (none in the tree, none that
    results/checkpoints.json lists for ``ksae-data restore-checkpoint``). A row with no results yet is kept while
    its run can go on (still training, or its checkpoint at hand for ksae-eval). Run folders outside a repository
    with results/checkpoints.json (a user's own) are all kept: their inputs may lie anywhere on that machine."""
    from ksae_cupy.reports.kept_checkpoints import kept_checkpoint

    repository = _repository(root)
    if repository is None:
        return None
    state = found.state
    if state.results is None and state.diverged is None:
        if found.table == ERR and state.trained and not state.resumable:
            return "trained, but its checkpoint is gone (none in the tree, none in results/checkpoints.json): " \
                   "ksae-eval cannot read it"
        return None
    for folder in input_folders(found):
        resolved = Path(folder).resolve()
        if not resolved.is_relative_to(repository):
            return f"it reads {folder}, a folder outside the repository"
        if not (resolved / "checkpoint.h5").is_file() and kept_checkpoint(resolved / "checkpoint.h5") is None:
            return (f"it reads {resolved.relative_to(repository)}, which holds no checkpoint.h5 (none in the tree, "
                    f"none in results/checkpoints.json)")
    return None


def _repository(root: Path) -> Path | None:
    """The repository holding ``root``: the nearest folder at or above it with results/checkpoints.json, else None."""
    from ksae_cupy.reports.kept_checkpoints import MANIFEST

    root = Path(root).resolve()
    return next((folder for folder in (root, *root.parents) if (folder / MANIFEST).is_file()), None)


def raw_pixels(root: Path) -> RunState | None:
    """A k-sparse MNIST run whose evaluation has the raw-pixel baseline (the err_mnist row); in a repository, one
    whose checkpoint is there or kept in history (the row's ksae-eval runs again from a clone)."""
    from ksae_cupy.reports.kept_checkpoints import kept_checkpoint

    in_repository = _repository(root) is not None
    for state in find_runs(root):
        if state.kind == TRAIN and state.config.get("dataset") == paper.DATASET and \
                (state.results or {}).get("raw_baseline") and \
                (not in_repository or state.has_checkpoint or kept_checkpoint(state.path / "checkpoint.h5") is not None):
            return state
    return None


class MixedProtocols(Exception):
    """The err_mnist rows' eval.json files were written under more than one evaluation protocol."""


def check_one_protocol(root: Path, found: list[Found]) -> int | None:
    """The evaluation protocol (eval.json's ``protocol``; None before it was recorded) every err_mnist figure was
    measured under; :class:`MixedProtocols`, naming a folder of each, when they differ: one table, one protocol
    (a changed protocol means evaluating again, not a footnote)."""
    states = [f.state for f in found if f.table == ERR and f.state.results is not None]
    raw = raw_pixels(root)
    states += [raw] if raw is not None else []
    by_protocol: dict = {}
    for state in states:
        by_protocol.setdefault(state.results.get("protocol"), state.path)
    if len(by_protocol) > 1:
        listed = "; ".join(f"protocol {protocol}: {_relative(root, path)}" for protocol, path in by_protocol.items())
        raise MixedProtocols(f"the err_mnist figures come from more than one evaluation protocol ({listed}); "
                             f"evaluate them again with this ksae-eval (or move the old folders out of {root})")
    return next(iter(by_protocol), None)


# -- what is left to run -----------------------------------------------------------------------------

@dataclass
class Target:
    """One run the tables ask for: a row at a length and seed, its folder (found or to make) and
    the commands still to run, each ``(command, args)``; none when it is done."""

    table: str
    key: str
    length: Length
    seed: int
    folder: Path
    found: Found | None
    steps: list = field(default_factory=list)
    blocked: str | None = None  # why nothing can run: the run it starts from is broken


@dataclass
class Settings:
    """The lengths and seeds the tables ask for, and the threads of every command."""

    ksparse_epochs: int = paper.EPOCHS
    baseline_epochs: int = 500
    finetune_epochs: int = paper.FINETUNE_EPOCHS
    seeds: tuple = (0,)
    threads: int = 1


def plan(root: Path, rows: list[tuple[str, str]], settings: Settings, found: list[Found] | None = None,
         deep_ksparse_script: str = "bin/reproduce-finetune") -> list[Target]:
    """The targets of ``rows`` (``(table, key)`` pairs) at the lengths and seeds of ``settings``, in
    the order they can run (a fine-tuning row after the run it starts from, which it adds when
    ``rows`` lacks it)."""
    found = collect(root) if found is None else found
    targets: dict[tuple, Target] = {}
    raw = raw_pixels(root) is None  # the raw-pixel row is missing: k = 25's evaluation (seed 0) adds it

    def add(table_name, key, seed):
        length = _length(table_name, key, settings)
        if (table_name, key, str(length), seed) in targets:
            return targets[(table_name, key, str(length), seed)]
        if table_name == FN and key in (*FN_OF_BASELINE_RUN, "ksparse", "deep-ksparse"):
            add(ERR, "k25" if "ksparse" in key else key, 0)  # the run it starts from: seed 0
        match = _match(found, table_name, key, length, seed)
        folder = match.state.path if match else Path(root) / _folder_name(table_name, key, length, seed)
        if match is None and key == "deep-ksparse":  # where the script that makes it puts the fine-tuning
            folder = folder / "finetune" / "deep_ksparse"
        target = Target(table_name, key, length, seed, folder, match)
        target.steps = _steps(target, root, settings, found, deep_ksparse_script, raw)
        targets[(table_name, key, str(length), seed)] = target
        return target

    for table_name, key in rows:
        for seed in settings.seeds:
            add(table_name, key, seed)
    return list(targets.values())


def _length(table_name: str, key: str, s: Settings) -> Length:
    if table_name == ERR:
        return Length(s.ksparse_epochs if key.startswith("k") else s.baseline_epochs)
    phases = 3 if key.startswith("deep") else 1
    pretrain = None if key.startswith("no-pretraining") else s.ksparse_epochs if "ksparse" in key else s.baseline_epochs
    return Length(pretrain, s.finetune_epochs, phases)


def _match(found: list[Found], table_name, key, length, seed) -> Found | None:
    matches = [f for f in found if (f.table, f.key, f.length, f.seed) == (table_name, key, length, seed)]
    return max(matches, key=lambda f: (not f.on_gpu, f.state.done, f.state.epochs_done), default=None)


def _folder_name(table_name: str, key: str, length: Length, seed: int) -> str:
    suffix = f"-seed{seed}" if seed else ""
    if table_name == ERR:
        return f"mnist-{key}-{length.pretrain}{suffix}"
    pretrain = f"-{length.pretrain}" if length.pretrain is not None else ""
    return f"fn-{key}{pretrain}-{length.finetune}{suffix}"


def _steps(t: Target, root: Path, s: Settings, found: list[Found], script: str, raw: bool) -> list:
    threads = ["--threads", s.threads]
    state = t.found.state if t.found else None
    if state is not None and (state.done or state.locked or state.diverged):  # nothing to run here now
        return []
    if state is None and (t.folder / DIVERGED).is_file():  # diverged before it wrote its config.json
        return []
    if (state is not None and state.broken) or broken_reason(t.folder):  # every command would refuse it
        return []
    if t.table == ERR:
        evaluate = ("ksae-eval", [t.folder, *threads, *(["--raw-baseline"] if raw and t.key == "k25" and t.seed == 0
                                                       else ["--max-iter", 1000] if not t.key.startswith("k") else [])])
        if state is not None and state.trained:
            return [evaluate]
        if state is not None and state.resumable:
            command = "ksae-train" if t.key.startswith("k") else "ksae-baseline"
            return [*_restore(state), (command, ["--resume", t.folder]), evaluate]
        if t.key.startswith("k"):
            train = ("ksae-train", [paper.DATASET, "--hidden", paper.HIDDEN, "--k", t.key[1:], "--epochs",
                                    t.length.pretrain, "--seed", t.seed, *threads, "--run-dir", t.folder])
        else:
            lr, decay = BASELINE_SETTINGS[t.key]
            train = ("ksae-baseline", [paper.DATASET, "--model", t.key, "--hidden", paper.HIDDEN, "--lr", lr,
                                       "--weight-decay", decay, "--epochs", t.length.pretrain, "--seed", t.seed,
                                       *threads, "--run-dir", t.folder])
        return [train, evaluate]
    if state is not None and (state.resumable or state.pretraining):
        return [*_restore(state), ("ksae-finetune", ["--resume", t.folder])]
    tune = ["--epochs", t.length.finetune, "--seed", t.seed, *threads]
    if t.key.startswith("no-pretraining"):
        return [("ksae-finetune", [*_random_net(t.key), *tune, "--run-dir", t.folder])]
    if t.key == "deep-dropout-ae":
        return [("ksae-finetune", ["--baseline", "dropout-ae", "--hidden", f"{paper.HIDDEN},{paper.HIDDEN}",
                                   "--pretrain-epochs", t.length.pretrain, "--dataset", paper.DATASET, *tune,
                                   "--run-dir", t.folder])]
    first = _match(found, ERR, "k25" if "ksparse" in t.key else t.key, Length(t.length.pretrain), 0)
    first_folder = first.state.path if first else Path(root) / _folder_name(
        ERR, "k25" if "ksparse" in t.key else t.key, Length(t.length.pretrain), 0)
    broken = broken_reason(first_folder)
    if broken:  # it would be refused there: say what it waits for instead
        t.blocked = f"waits for {_relative(root, first_folder)} (broken: {broken})"
        return []
    if t.key == "deep-ksparse":  # layer 2 trains on layer 1's codes: the script that writes them does it all
        return [(script, ["--rows", "deep_ksparse", "--ksparse1", first_folder, "--pretrain-epochs",
                          t.length.pretrain, "--epochs", t.length.finetune, "--seed", t.seed, *threads,
                          "--out", t.folder.parents[1]])]
    return [("ksae-finetune", [first_folder, *(["--alpha", 3] if t.key == "ksparse" else []), *tune,
                               "--run-dir", t.folder])]


def _restore(state: RunState) -> list:
    """The step that puts a checkpoint kept in git history back into its folder, before a resume."""
    return [("ksae-data", ["restore-checkpoint", state.path])] if state.checkpoint_kept else []


# -- the markdown ------------------------------------------------------------------------------------

HEADER = ["Row", "Paper", "Ours (test)", "Ours (valid)", "Gap (points)", "Epochs", "Seeds", "Command", "Folder"]
ALIGN = "lrrrrllll"


def render(root: Path, found: list[Found], targets: list[Target], command_text) -> str:
    """Both tables and the list of what is left, as Markdown. ``command_text(command, args)`` shows
    a command (paths relative to where the reader runs it)."""
    parts = []
    for table_name, rows in TABLES.items():
        lines = []
        for row in rows:
            lines += _row_lines(root, table_name, row, found, targets, command_text)
        title = {ERR: "Table err_mnist: logistic regression on the features, 1000 hidden units",
                 FN: "Table fn_mnist: pretrained and fine-tuned"}[table_name]
        parts.append(f"## {title}\n\n" + table(HEADER, lines, ALIGN))
    left = [(t, step) for t in targets for step in t.steps]
    todo = "\n".join(f"- {t.table} {t.key} ({t.length} epochs, seed {t.seed}): `{command_text(*step)}`"
                     for t, step in left) or "Nothing: every asked row is done."
    parts.append("## Left to run, in this order\n\n" + todo)
    return "\n\n".join(parts) + "\n"


def _row_lines(root, table_name, row, found, targets, command_text) -> list[list]:
    if table_name == ERR and row.key == "raw":
        state = raw_pixels(root)
        if state is None:  # the raw-pixel classifier comes with a k-sparse run's evaluation
            k25 = next((f.state.path for f in found if (f.table, f.key) == (ERR, "k25") and f.state.trained), None)
            command = command_text("ksae-eval", [k25 or "K25_RUN", "--raw-baseline"])
            return [[row.label, percent(row.error), "missing", "", "", "-", "-", f"`{command}`", ""]]
        raw = state.results["raw_baseline"]
        return [[row.label, percent(row.error), percent(raw["test_error"]),
                 percent(raw["selected"]["valid_error"]), _gap([raw["test_error"]], row.error), "-", "-",
                 f"`{command_text('ksae-eval', [state.path, '--raw-baseline'])}`", _relative(root, state.path)]]
    mine = [f for f in found if (f.table, f.key) == (table_name, row.key)]
    # the longest first, then the plainest (no notes); every field counts, so that equal lengths keep one order
    lengths = sorted({(f.length, f.notes) for f in mine},
                     key=lambda pair: (pair[0].pretrain or 0, pair[0].finetune or 0, pair[0].phases,
                                       pair[0].layer2 or 0, not pair[1], pair[1]), reverse=True)
    lines = []
    for length, notes in lengths:
        group = sorted((f for f in mine if (f.length, f.notes) == (length, notes)),
                       key=lambda f: (f.seed is None, f.seed))
        done = [f for f in group if f.test_error is not None]
        tests = [f.test_error for f in done]
        valids = [f.valid_error for f in done if f.valid_error is not None]
        waiting = [f for f in group if f not in done]
        ours = percent_spread(tests) if tests else waiting[0].state.describe()
        seeds = ", ".join(str(f.seed) for f in done) or "-"
        if waiting and done:
            seeds += "; " + ", ".join(f"{f.seed}: {f.state.describe()}" for f in waiting)
        target = next((t for t in targets if t.found is not None and t.found.state.path == group[0].state.path), None)
        broken = group[0].state.broken
        command = f"fix or move aside {_relative(root, group[0].state.path)}" if broken else \
            _made_by(group[0], command_text, target)
        lines.append([row.label + "".join(", " + note for note in notes), percent(row.error), ours, percent_spread(valids) if valids else "",
                      _gap(tests, row.error) if tests else "", str(length), seeds, command,
                      ", ".join(_relative(root, f.state.path) for f in group)])
    if not lines:
        asked = [t for t in targets if (t.table, t.key) == (table_name, row.key)]
        broken = broken_reason(asked[0].folder) if asked else None  # its own folder, unreadable: not missing
        command = f"`{command_text(*asked[0].steps[0])}`" if asked and asked[0].steps else "not asked (--rows)"
        if broken:
            command = f"fix or move aside {_relative(root, asked[0].folder)}"
        elif asked and asked[0].blocked:
            command = asked[0].blocked
        lines.append([row.label, percent(row.error), f"broken: {broken}" if broken else "missing", "", "",
                      str(asked[0].length) if asked else "-", "-", command,
                      _relative(root, asked[0].folder) if broken else ""])
    return lines


def _made_by(found: Found, command_text, target: Target | None) -> str:
    """What is left to run for the line's first run, or the command that made it (from its config.json)."""
    if target is not None and target.steps:
        return "left: " + ", then ".join(f"`{command_text(*step)}`" for step in target.steps)
    state, config = found.state, found.state.config
    if state.kind == TRAIN:
        train = config["train"]
        made = ("ksae-train", [paper.DATASET, "--hidden", train["hidden"], "--k", train["k"], "--epochs",
                               train["epochs"], "--seed", train.get("seed", 0),
                               *(["--device", "gpu"] if found.on_gpu else []), "--run-dir", state.path])
    elif state.kind == BASELINE:
        baseline = config["baseline"]
        made = ("ksae-baseline", [paper.DATASET, "--model", found.key, "--lr", baseline.get("lr"), "--weight-decay",
                                  baseline.get("weight_decay"), "--epochs", baseline["epochs"], "--seed",
                                  baseline.get("seed", 0), "--run-dir", state.path])
    else:
        tuned = config["finetune"]
        if config.get("no_pretraining"):
            how = _random_net(found.key)
        elif config.get("baseline"):
            how = ["--baseline", config["baseline"], "--hidden", ",".join([str(paper.HIDDEN)] * len(tuned["kept"])),
                   "--pretrain-epochs", config.get("pretrain_epochs"), "--dataset", paper.DATASET]
        else:
            how = [_source_folder(source, state.path) for source in config.get("pretrained") or []]
            if tuned.get("softmax_lr_start") is not None:
                how += ["--softmax-lr-start", f"{tuned['softmax_lr_start']:g}"]
            default_phases = ["all"] if len(how) < 2 else ["softmax", "top", "all"]
            if tuned.get("phases") and list(tuned["phases"]) != default_phases:  # e.g. a deep net fine-tuned jointly
                how += ["--phases", ",".join(tuned["phases"])]
        if tuned.get("train_on", "train") != "train":
            how += ["--train-on", tuned["train_on"]]
        how += _rate_options(tuned) + _momentum_options(tuned) + _dropout_options(found.key, tuned)
        made = ("ksae-finetune", [*how, "--epochs", tuned["epochs"], "--seed", tuned.get("seed", 0), "--run-dir",
                                  state.path])
        return f"`{command_text(*made)}`"
    return f"`{command_text(*made)}`, then `{command_text('ksae-eval', [state.path, *_eval_options(state.results)])}`"


def _eval_options(results: dict | None) -> list:
    """ksae-eval's options that made ``results`` (eval.json) where they are not its defaults: the L2 grid, the
    grid's extension, the iterations per fit."""
    from ksae_cupy.evaluation.selection import DEFAULT_L2, DEFAULT_L2_EXTEND

    results = results or {}
    grid, options = results.get("l2_grid"), []
    if grid and sorted(grid) != sorted(DEFAULT_L2):
        options += ["--l2", ",".join(f"{value:g}" for value in sorted(grid, reverse=True))]
    if results.get("l2_extend", 0) != DEFAULT_L2_EXTEND:  # before the option existed: the grid as given
        options += ["--l2-extend", results.get("l2_extend", 0)]
    if results.get("max_iter") not in (None, 500):
        options += ["--max-iter", results["max_iter"]]
    return options


def _random_net(key: str) -> list:
    """ksae-finetune's options of the "without pre-training" rows: k-sparse units, or a plain ReLU net."""
    units = ["--units", "relu"] if key == "no-pretraining-relu" else ["--k", 25]
    return ["--no-pretraining", "--hidden", paper.HIDDEN, *units, "--dataset", paper.DATASET]


def _gap(tests: list[float], paper_error: float) -> str:
    gap = round(100 * (sum(tests) / len(tests) - paper_error), 2)
    return f"{gap + 0.0:+.2f}"  # + 0.0: a gap that rounds to zero reads +0.00, never -0.00


def _relative(root: Path, path: Path) -> str:
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


# -- the command: report, and with run=True, run what is left ------------------------------------------

ROW_NAMES = {**{key: (ERR, key) for key in paper.errors(paper.ERR_MNIST) if key != "raw"},
             **{f"fn-{key}": (FN, key) for key in paper.errors(paper.FN_MNIST)}}


class StepFailed(Exception):
    """A command of the plan ended with a status other than 0 (the tables so far are written)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def write_tables(root: Path, out: Path, rows, settings: Settings, command_text, script: str) -> list[Target]:
    """Read the run folders under ``root``, write the tables to ``out`` (atomically); return the plan."""
    from ksae_cupy.atomic import write_text_atomic
    from ksae_cupy.reports.folders import utc_now

    _copies_below.cache_clear()  # folders come and go between two writes (bin/paper-tables --run)
    found = collect(root)
    protocol = check_one_protocol(root, found)
    targets = plan(root, rows, settings, found, script)
    intro = (f"# The paper's MNIST tables beside ours\n\nWritten {utc_now()} from the run folders under `{root}`. "
             f"Ours: the test error (mean ± standard deviation over seeds, in points, where there are several) and "
             f"the validation error; gap: ours minus the paper's, in points. Epochs: a fine-tuning row's "
             f"pretraining + fine-tuning epochs (per phase x phases). Every err_mnist figure: ksae-eval's "
             f"protocol {protocol}. Every row's command runs again from a clone, after "
             f"`ksae-data restore-checkpoint --all` puts the checkpoints it reads back in place.\n\n")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(out), intro + render(root, found, targets, command_text) + _gone_section(root, command_text))
    return targets


def _gone_section(root: Path, command_text) -> str:
    """The runs left out of the tables because their commands cannot run again from a clone, and why."""
    gone = gone_rows(root)
    if not gone:
        return ""
    lines = [f"- {_relative(root, found.state.path)} ({found.table}, {found.key}): {why}" for found, why in gone]
    return ("\n## Left out: commands that cannot run again from a clone\n\n"
            "Their figures and why they left the tables: docs/results/history.md.\n\n" + "\n".join(lines) + "\n")


def packed_training(targets: list[Target], settings: Settings, pack_script: str):
    """``(command, args, targets)``: the k-sparse rows whose next step is a ksae-train (a new run or a resume),
    as one ``bin/train-pack`` step that trains them in one launch (on a GPU as one stacked model; each run
    gives the numbers of its ksae-train alone); None when fewer than two are waiting."""
    waiting = [t for t in targets if t.steps and t.steps[0][0] == "ksae-train"]
    if len(waiting) < 2:
        return None
    runs = []
    for target in waiting:
        args = [str(a) for a in target.steps[0][1]]
        if "--resume" in args:
            runs.append(f"dir={target.folder}")
        else:
            value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
            runs.append(f"dir={value('--run-dir')},k={value('--k')},seed={value('--seed')},"
                        f"epochs={value('--epochs')}")
    args = [paper.DATASET, "--hidden", paper.HIDDEN, "--threads", settings.threads]
    for run in runs:
        args += ["--run", run]
    return pack_script, args, waiting


def build(root: Path, out: Path, rows, settings: Settings, command_text, script: str, children=None,
          pack_script: str | None = None) -> list[Target]:
    """Write the tables; with ``children`` (a :class:`~ksae_cupy.reports.children.Children`), run
    what is left one step at a time, rewriting the tables after each. With ``pack_script``
    (``bin/train-pack``), the k-sparse trainings waiting run as one step (:func:`packed_training`).
    Returns the plan left."""
    targets = write_tables(root, out, rows, settings, command_text, script)
    if children is None:
        return targets
    while True:
        packed = packed_training(targets, settings, pack_script) if pack_script else None
        if packed is not None:
            command, args, members = packed
            for target in members:
                if "--run-dir" in target.steps[0][1]:  # a new run: what a run stopped before its checkpoint left goes
                    clear_unstarted(target.folder)
            status, tail = children.run("err_mnist-ksparse-pack", command, args)
            meaning, detail = exit_meaning(status, tail, children.received)
            targets = write_tables(root, out, rows, settings, command_text, script)
            children.check_stop()
            if meaning != "ok":  # train-pack records a run that diverged itself and exits 0
                raise StepFailed(f"{command_text(command, args)} exited with status {status}: {detail}", status)
            if any(t.steps and t.steps[0] in [m.steps[0] for m in members] for t in targets):  # would loop forever
                raise StepFailed(f"{command_text(command, args)} ended (status 0) but its runs are still not done", 1)
            continue
        step = next(((t, s) for t in targets for s in t.steps), None)
        if step is None:
            return targets
        target, (command, args) = step
        if "--run-dir" in args:  # a new run: what a run stopped before its first checkpoint left goes
            clear_unstarted(args[args.index("--run-dir") + 1])
        name = f"{target.table}-{target.key}-seed{target.seed}-{Path(str(command)).name}"
        status, tail = children.run(name, command, args)
        meaning, detail = exit_meaning(status, tail, children.received)
        if meaning == "diverged":  # recorded in its folder, left alone from now on; the other rows still run
            record_diverged(target.folder, detail)
        targets = write_tables(root, out, rows, settings, command_text, script)
        children.check_stop()
        if meaning == "failed":
            raise StepFailed(f"{command_text(command, args)} exited with status {status}: {detail}", status)
        if any(t.steps and t.steps[0] == (command, args) for t in targets):  # would loop forever
            raise StepFailed(f"{command_text(command, args)} ended (status 0) but its run is still not done", 1)
