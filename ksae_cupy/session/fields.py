"""The options of the training commands, declared once: flag, help, default, type and resume policy.

``ksae-train``, ``ksae-baseline`` and ``ksae-finetune`` build their command lines from these
declarations (``cli/options.py`` turns them into click options), ``--resume`` treats each option
as its policy says, and :func:`resume_table` writes the table of every option of every command.
The options every command shares are declared here once (:data:`SHARED`); each command's own
live beside its configuration (:data:`TRAIN` here, the supervised commands' in
:mod:`ksae_cupy.supervised.commands`). The paper's defaults are read from
:class:`~ksae_cupy.training.config.TrainConfig`, never typed again, and so are the figures the help
texts quote; each choice set is its source constant (``TOPK_METHODS``, ``STEPS``, ``DTYPES``, ``ACTIVATIONS``).

What ``--resume`` does with an option (:attr:`Option.resume`):

* ``applied``: a value given changes the run from this session on and is recorded (config.json
  or the checkpoint); not given, the run's value is kept, never the default.
* ``refused``: it shapes the model or its sequence of batches: a value other than the run's is
  refused by name, in one line; not given, the run's value is kept. (ksae-finetune refuses these
  whenever they are given: its run records them in another form, alpha*k kept for --alpha and --k.)
* ``kept``: it names the run or its data (``--run-dir``, DATASET, ``--labels``, ...): given
  again it must name the run's own, else it is refused; not given, the run's is kept (ksae-finetune:
  DATASET and the data options are refused whenever given, as its refused options are).
* ``session``: how this one invocation behaves (``--quiet``); never recorded, never inherited.

A command's values travel as one frozen object of its options class (:func:`options_class`: ``TrainOptions``
here), read by attribute from the command line to the configuration (``options.k`` -> ``TrainConfig(k=...)``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ksae_cupy.datasets.registry import names as dataset_names, spelled
from ksae_cupy import optimizers
from ksae_cupy.backend import DEVICES
from ksae_cupy.model import ACTIVATIONS
from ksae_cupy.sparse_step import STEPS
from ksae_cupy.topk import TOPK_METHODS
from ksae_cupy.training.config import DEFAULTS, TrainConfig
from ksae_cupy.training.options import DTYPES

APPLIED, REFUSED, KEPT, SESSION = "applied", "refused", "kept", "session"
POLICIES = (APPLIED, REFUSED, KEPT, SESSION)
PATH = "path"  # the type of an option that names a file or folder
TEXT_PATH = "text path"  # one kept as typed, a str (the MPI trainer's: its lines quote it as given)


@dataclass(frozen=True)
class Option:
    """One command-line option: ``name`` is its Python name (the configuration field it sets,
    where there is one), ``type`` is int, float, str, bool (a flag), :data:`PATH`, a tuple of
    choices or a registry (a dict: its names are the choices, read when the command runs); ``flag`` is how the command line spells it (default: ``--`` + name with dashes)."""

    name: str
    help: str
    default: object = None
    type: object = str
    resume: str = REFUSED
    flag: str | None = None

    def __post_init__(self):
        if self.resume not in POLICIES or not self.help.strip():
            raise ValueError(f"option {self.name}: a resume policy from {POLICIES} and a help text are required")

    @property
    def spelled(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    def but(self, **changes) -> "Option":
        """The same option with some of its declaration changed (e.g. a command's own help)."""
        return dataclasses.replace(self, **changes)


PAPER = DEFAULTS  # the options' defaults (training/config.py): the paper's settings, as ksae_cupy/paper.py types them
THREADS_DEFAULT = ("[default: OMP_NUM_THREADS or its kin when set, else one per free core (the load average "
                   "counts the busy ones); on --resume, the run's]")

# -- shared by every training command --------------------------------------------------------
SHARED = {option.name: option for option in (
    Option("device", f"{DEVICES}.", "auto", resume=APPLIED),
    Option("threads", f"Threads on the CPU, for BLAS and the CPU kernels. {THREADS_DEFAULT}", None, int, APPLIED),
    Option("topk", "Top-k algorithm: selection by sorting, or iterative threshold (the same units either way).",
           PAPER.topk, TOPK_METHODS, APPLIED),
    Option("step", "Training step: dense products, or only the first layer's product dense (sparse); auto picks.",
           PAPER.step, STEPS, APPLIED),
    Option("seed", "Seed of the initial weights and of the batch order.", PAPER.seed, int),
    Option("dtype", "Floating-point type of the parameters and the data on the device.", PAPER.dtype, DTYPES),
    Option("run_dir", "Folder for checkpoint.h5, config.json, metrics.jsonl.", None, PATH, KEPT),
    Option("checkpoint_every", "Write a checkpoint every N epochs (and at the end).", 10, int, APPLIED),
    Option("checkpoint_minutes", "Also write one whenever this many minutes have passed, mid-epoch if need be "
           "(0: by epochs only).", 5.0, float, APPLIED),
    Option("overwrite", "Start afresh in a --run-dir that holds another run: its checkpoint, config, metrics and "
           "results are removed.", False, bool, REFUSED),
    Option("resume", "Continue the run in this folder; options given are applied or, if they would change the "
           "model, refused by name (see the resume table).", None, PATH, KEPT),
    Option("data_dir", "Data root. [default: $KSAE_DATA_DIR or ./data]", None, PATH, APPLIED),
    Option("progress_seconds", "When stderr is not a terminal, a progress line this often (a terminal gets a bar).",
           30.0, float, APPLIED),
    Option("quiet", "Only the final line.", False, bool, SESSION),
)}


def shared(*names: str, **helps: str) -> list[Option]:
    """The shared options ``names``, in that order; ``helps`` gives a command's own help to some."""
    return [SHARED[name].but(help=helps[name]) if name in helps else SHARED[name] for name in names]


# DATASET and the options that choose its rows (cli/common.py's data_options), by type: the run's own on --resume.
DATA_TYPES = {"dataset": str, "labels": str, "test": str, "test_labels": str, "valid_fraction": float,
              "test_fraction": float, "split_seed": int}
DATA = tuple(DATA_TYPES)
# Shared options kept in config.json (not in the checkpoint): on --resume, one not given takes the run's value.
RUN_LEVEL = ("checkpoint_every", "checkpoint_minutes", "threads", "device", "data_dir", "progress_seconds")

# -- ksae-train --------------------------------------------------------------------------------
TRAIN = [
    Option("hidden", f"Hidden units H (paper: {PAPER.hidden} on MNIST).", PAPER.hidden, int),
    Option("k", "Units kept per example during training.", PAPER.k, int, flag="--k"),
    Option("k_start", f"First k of the sparsity schedule (section 4.3.1). [default: {PAPER.k_start}, or k if larger, "
           f"at most hidden]", None, int),
    Option("no_k_schedule", "Train with k from the first epoch.", False, bool),
    Option("epochs", f"Epochs (paper: {PAPER.epochs}).", PAPER.epochs, int, APPLIED),
    Option("batch_size", f"Minibatch size (authors' code: {PAPER.batch_size}).", PAPER.batch_size, int),
    Option("lr", f"Learning rate eta, or auto: derived from the data's scale ({PAPER.lr} on MNIST). [default: "
           f"auto for {spelled(dataset_names(auto_lr=True))} and for your own files; {PAPER.lr} (the paper's) for "
           f"the other built-in datasets]", None,
           str),
    Option("momentum", f"Momentum m (paper: {PAPER.momentum}).", PAPER.momentum, float),
    Option("sigma", f"Std of the Gaussian initial weights (paper: {PAPER.sigma}).", PAPER.sigma, float),
    SHARED["topk"],
    SHARED["seed"],
    SHARED["dtype"],
    Option("activation", "Hidden units: linear (the paper) or relu (negative survivors of the top-k set to zero).",
           PAPER.activation, ACTIVATIONS),
    SHARED["step"].but(help="Training step: dense products, or only the encoder dense (sparse); auto picks by k/H."),
    Option("aux_k", "Beyond the paper: the auxiliary loss of Gao et al. 2024 on this many dead units per example "
           "(0: off).", PAPER.aux_k, int),
    Option("aux_coef", "Weight of the --aux-k loss (Gao et al.'s 1/32).", PAPER.aux_coef, float),
    Option("dead_window", "A unit kept in none of the last N examples is dead (--aux-k, and the dead-window metric).",
           PAPER.dead_window, int),
    Option("center_input", "Beyond the paper: subtract the training mean from every input (kept with the model).",
           PAPER.center_input, bool),
    Option("optimizer", f"The update: {optimizers.described()}.", PAPER.optimizer, optimizers.OPTIMIZERS),
    *shared("device", "run_dir", "checkpoint_every", "checkpoint_minutes", "overwrite", "resume", "data_dir", "threads",
            "progress_seconds", "quiet",
            run_dir="Folder for checkpoint.h5, config.json, metrics.jsonl. [default: runs/<dataset>-h<H>-k<k>-<time>]",
            resume="Continue the run in this folder; options given are applied (--epochs, --topk, --device, "
                   "--checkpoint-*, --threads) or, if they would change the model, refused by name. DATASET may name the "
                   "run's data file at a new path (its SHA-256 is checked)."),
]


def options_class(name: str, declarations: list[Option]) -> type:
    """The frozen dataclass of a command's values: a field per declared option (its name, its type: a path a
    Path, a choice its name, ``| None`` where it defaults to None; its default), DATASET and the data options it
    does not declare (None: not given), and ``given``: the names typed (what --resume applies or refuses)."""
    def kind_of(option):
        kind = Path if option.type == PATH else option.type if isinstance(option.type, type) else str
        return kind | None if option.default is None else kind

    data = [(n, kind | None, None) for n, kind in DATA_TYPES.items() if n not in {o.name for o in declarations}]
    fields = data + [(o.name, kind_of(o), o.default) for o in declarations] + [("given", frozenset, frozenset())]
    return dataclasses.make_dataclass(name, [(n, kind, dataclasses.field(default=d)) for n, kind, d in fields],
                                      namespace={"declarations": declarations}, frozen=True)


TrainOptions = options_class("TrainOptions", TRAIN)  # ksae-train's values: options.k is --k


def default_lr(dataset: str):
    """``--lr``'s default for ``dataset``: ``"auto"`` for a user's file and for a built-in dataset whose
    registry entry asks for it (the paper's 0.01 diverges there), else the paper's rate."""
    from ksae_cupy.datasets.registry import DATASETS

    builtin = DATASETS.get(dataset)  # None: the user's file (or a name load_dataset refuses)
    return "auto" if builtin is None or builtin.auto_lr else PAPER.lr


def parse_lr(text: str | None, default):
    """``--lr``: a positive number or ``auto``; ``default`` when not given."""
    from ksae_cupy.errors import KsaeError

    if text is None:
        return default
    if not isinstance(text, str):  # a number already (the Python API, a parsed grid)
        text = repr(text)
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise KsaeError(f"--lr {text!r} is not allowed; use a positive learning rate or auto") from None


def parse_text(option: Option, text: str, spelled: str | None = None):
    """The value of the declared ``option`` given as text outside a command line (a pack's ``--run k=25``,
    a sweep's grid ``--k 10,25``): converted as ``ksae-train``'s option converts it (``auto`` where ``--lr``
    takes it) and checked by the field's rule (:data:`~ksae_cupy.training.config.RULES`), with the messages
    ``ksae-train`` gives; ``spelled``: how they name the value (default: the option's flag)."""
    from ksae_cupy.errors import KsaeError, OptionError
    from ksae_cupy.training.config import RULES, check_by_rule
    from ksae_cupy.training.options import check_seed

    spelled = spelled or option.spelled
    text = str(text).strip()
    if option.name == "lr" and text.lower() == "auto":
        return "auto"
    if option.type is int:
        try:
            value = int(text)
        except ValueError:
            raise KsaeError(f"{spelled} {text!r} is not allowed; use a whole number") from None
    elif option.type is float or option.name == "lr":
        try:
            value = float(text)
        except ValueError:
            what = "a positive learning rate or auto" if option.name == "lr" else "a number"
            raise KsaeError(f"{spelled} {text!r} is not allowed; use {what}") from None
    elif isinstance(option.type, (tuple, dict)):
        if text not in tuple(option.type):
            raise KsaeError(f"{spelled} {text!r} is not allowed; use one of {', '.join(option.type)}")
        value = text
    else:
        value = text
    if option.name == "seed":
        check_seed(spelled, value)
    elif option.name in RULES and RULES[option.name].check is not None:
        try:
            check_by_rule(option.name, value)
        except OptionError as exc:
            raise KsaeError(exc.spelled(spelled)) from None
    return value


def policies(options: list[Option]) -> dict[str, str]:
    """``{name: policy}`` of a command's options, DATASET and the data options included."""
    return {**{name: KEPT for name in DATA}, **{option.name: option.resume for option in options}}


def named(options: list[Option], policy: str) -> tuple[str, ...]:
    """The names of the options of one resume policy."""
    return tuple(option.name for option in options if option.resume == policy)


def resume_table(commands: dict[str, list[Option]]) -> str:
    """The resume policy of every option of every command, as a markdown table (a blank: not offered)."""
    tables = {command: policies(options) for command, options in commands.items()}
    flags = {}
    for options in commands.values():
        flags.update({option.name: option.spelled for option in options})
    flags.update({"dataset": "DATASET", **{name: "--" + name.replace("_", "-") for name in DATA[1:]}})
    names = sorted({name for table in tables.values() for name in table}, key=lambda n: flags[n].lstrip("-"))
    lines = ["| option | " + " | ".join(commands) + " |", "|---" * (len(commands) + 1) + "|"]
    lines += [f"| {flags[name]} | " + " | ".join(table.get(name, "") for table in tables.values()) + " |"
              for name in names]
    return "\n".join(lines)
