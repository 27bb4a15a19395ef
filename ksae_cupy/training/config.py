"""The options of one training run, declared once: :class:`TrainConfig` and :data:`RULES`.

:class:`TrainConfig` holds every option that shapes a run (it is saved in checkpoints); its field
defaults are the paper's unsupervised MNIST settings, typed here and nowhere else: the
estimator's constructor defaults and the commands' option defaults and help texts read them.

:data:`RULES` says what each field allows, once: its type, its bounds, its choice set (the source
constant: :data:`~ksae_cupy.topk.TOPK_METHODS`, :data:`~ksae_cupy.model.ACTIVATIONS`,
:data:`~ksae_cupy.training.options.DTYPES`, :data:`~ksae_cupy.sparse_step.STEPS`, the registry
:data:`~ksae_cupy.optimizers.OPTIMIZERS`) and the shared check
that words its message. :meth:`TrainConfig.validate` runs those checks; the estimator's
``_parameter_constraints`` are made from the same rules (:func:`~ksae_cupy.training.sklearn_compat.constraints`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ksae_cupy import model, optimizers, paper
from ksae_cupy.errors import KsaeError, OptionError, literal, note, python_name
from ksae_cupy.sparse_step import STEPS, choose_step
from ksae_cupy.topk import TOPK_METHODS
from ksae_cupy.training.options import (DTYPES, MAX_SEED, DictConfig, ValidatedOnce, check_batch_size, check_choice,
                                        check_dtype, check_in_dtype, check_momentum, check_positive_count,
                                        check_positive_finite)


@dataclass(frozen=True)
class Rule:
    """What one field of :class:`TrainConfig` allows, on its own (rules between fields, such as
    ``k <= hidden``, are :meth:`TrainConfig.validate`'s). ``kind``: int, float or str; ``low``,
    ``high`` and ``closed`` bound a number as scikit-learn's ``Interval`` does; ``choices``: a str
    field's values; ``also``: values allowed besides (``"auto"``, None); ``check(name, value, *args)``:
    the shared check that refuses a bad value in one line (None: validate checks it its own way)."""

    kind: type
    low: float | None = None
    high: float | None = None
    closed: str = "left"
    choices: tuple = ()
    also: tuple = ()
    check: object = None
    args: tuple = ()


RULES = {
    "hidden": Rule(int, 1, check=check_positive_count, args=("hidden units",)),
    "k": Rule(int, 1),  # and k <= hidden
    "k_start": Rule(int, 1, also=(None,)),  # and k <= k_start <= hidden
    "epochs": Rule(int, 1, check=check_positive_count, args=("epochs",)),
    "batch_size": Rule(int, 1),  # and at most the training rows: check_batch_size
    "lr": Rule(float, 0, closed="neither", also=("auto",), check=check_positive_finite,
               args=("learning rate (or 'auto')",)),
    "momentum": Rule(float, 0, 1, check=check_momentum),
    "sigma": Rule(float, 0, closed="neither", check=check_positive_finite, args=("standard deviation",)),
    "topk": Rule(str, choices=TOPK_METHODS, check=check_choice, args=(TOPK_METHODS,)),
    "seed": Rule(int, 0, MAX_SEED, closed="both"),  # checked by the estimator; NumPy's generator takes any
    "dtype": Rule(str, choices=DTYPES, check=check_dtype),
    "activation": Rule(str, choices=model.ACTIVATIONS, check=check_choice, args=(model.ACTIVATIONS,)),
    "step": Rule(str, choices=STEPS, check=check_choice, args=(STEPS,)),  # choose_step also refuses sparse where
    # it does not apply
    "aux_k": Rule(int, 0),  # and at most hidden
    "aux_coef": Rule(float, 0, closed="neither", check=check_positive_finite, args=("weight of the auxiliary loss",)),
    "dead_window": Rule(int, 1, check=check_positive_count, args=("examples",)),
    "center_input": Rule(bool),
    # the registry itself, so that an optimizer registered at run time is allowed (a command's choices read it too)
    "optimizer": Rule(str, choices=optimizers.OPTIMIZERS, check=check_choice, args=(optimizers.OPTIMIZERS,)),
}


# The rule of a learning rate with no "auto" (the fine-tuning's lr_start and lr_end, the baselines' lr): a field
# of the other configurations, which share RULES's rules where their fields are the same kind of value.
RATE = Rule(float, 0, closed="neither", check=check_positive_finite, args=("learning rate",))


def check_with(field: str, check, *args, name=python_name) -> None:
    """Run a shared check of training/options.py (``check(flag, *args)``); a value it refuses raises an
    :class:`~ksae_cupy.errors.OptionError` on ``name(field)``, its message the check's."""
    try:
        check("{name}", *args)
    except KsaeError as exc:
        raise _option_error(name(field), _template(str(exc))) from None


def check_by_rule(field: str, value, rule: Rule | None = None, name=python_name) -> None:
    """``value`` of the field ``field`` checked by ``rule`` (default: ``RULES[field]``): how every configuration
    (:class:`TrainConfig`, the fine-tuning's, the baselines') checks a field of a kind RULES declares."""
    rule = rule or RULES[field]
    check_with(field, rule.check, value, *rule.args, name=name)


def check_in_dtype_by_field(dtype: str, name=python_name, **fields) -> None:
    """:func:`~ksae_cupy.training.options.check_in_dtype` of ``fields`` (``{field: (kind, value)}``), a value
    it refuses an :class:`~ksae_cupy.errors.OptionError` on its field."""
    for field, (kind, value) in fields.items():
        check_with(field, lambda flag, v, kind=kind: check_in_dtype(dtype, **{flag: (kind, v)}), value, name=name)


def _template(message: str) -> str:
    """A shared check's message, made with ``{name}`` for the field, as an OptionError template (its braces kept;
    only the first ``{name}``, the field, is a placeholder: a value quoted after it may hold braces too)."""
    return literal(message).replace("{{name}}", "{name}", 1)


def _option_error(field: str, template: str) -> KsaeError:
    """An :class:`OptionError` for ``field``; for a caller that still spells fields as flags (``--hidden``),
    the message with that spelling (a plain KsaeError, which the CLI prints as it reads)."""
    if field.startswith("-"):
        return KsaeError(template.format(name=field))
    return OptionError(field, template)



@dataclass
class TrainConfig(DictConfig, ValidatedOnce):
    """Options of one training run; defaults are the paper's unsupervised MNIST settings (:mod:`ksae_cupy.paper`).

    Sources: sigma, momentum, lr and epochs from section 4.3.2; the k schedule (k_start
    100, linear over the first half of the epochs) from section 4.3.1; batch 128 from the
    authors' code.
    """

    hidden: int = paper.HIDDEN
    k: int = paper.K
    k_start: int | None = paper.K_START  # None: no schedule, k from the first epoch
    epochs: int = paper.EPOCHS
    batch_size: int = paper.BATCH_SIZE
    lr: float = paper.LR
    momentum: float = paper.MOMENTUM
    sigma: float = paper.SIGMA
    topk: str = "sort"
    seed: int = 0
    dtype: str = "float32"
    activation: str = "linear"  # the paper's linear units; "relu" is an investigated variant
    # Epochs the k schedule spans (None: all of them). Set when a resumed run changes its
    # epochs, so that k goes on as it was scheduled instead of jumping back up; and when a new
    # run drops a schedule that never reaches k (k_start None), to the epochs it was asked over.
    k_schedule_epochs: int | None = None
    # dense, sparse or auto (by k / H): the same math, so a checkpoint without it loads as auto.
    step: str = "auto"
    # Whether lr was derived from the data (lr "auto", see learning_rate.py); lr holds the rate.
    lr_auto: bool = False
    # Beyond the paper, all off by default. aux_k > 0: the auxiliary loss of Gao et al.
    # (2024) on the dead units (model.loss_and_grads_auxk), weighted by aux_coef (1/32, as theirs).
    # A unit is dead when no example of the last dead_window examples kept it (also what the
    # dead_window_fraction metric counts, whatever aux_k). center_input: the training mean is
    # subtracted from every input (the estimator does it, and keeps the mean with the model).
    aux_k: int = 0
    aux_coef: float = 1 / 32
    dead_window: int = 10000
    center_input: bool = False
    # The update (ksae_cupy.optimizers): the paper's momentum SGD; a checkpoint without it loads as that.
    optimizer: str = optimizers.PAPER

    def validate(self, n_train: int | None = None, name=python_name) -> None:
        """Raise :class:`~ksae_cupy.errors.OptionError` naming the first bad field and what is allowed.

        Messages name fields as Python does (``k_start``); a command line prints its flag instead
        (the CLI spells an OptionError's field). ``name(field)`` renames a field for a front end with
        its own parameter names (the estimator's ``n_hidden``). ``lr`` may still be ``"auto"`` here;
        a :class:`Trainer` needs the rate itself.
        """
        def bad(field, template):
            return _option_error(name(field), template)

        def checked(field, check, *args):  # a shared check of training/options.py, its message in {name} terms
            check_with(field, check, *args, name=name)

        def ruled(field):  # a field's own rule (RULES), its message in {name} terms
            check_by_rule(field, getattr(self, field), name=name)

        # The other field a message names, in words ("1 <= k <= hidden"; n_hidden from the estimator), flag or not.
        hidden = name("hidden").lstrip("-")
        ruled("hidden")
        if not 1 <= self.k <= self.hidden:
            raise bad("k", f"{{name}} {self.k} is not allowed; use 1 <= k <= {hidden} ({self.hidden})")
        if self.k_start is not None and self.k_start < self.k:
            raise bad("k_start", f"{{name}} {self.k_start} is not allowed; use {{name}} >= k ({self.k})")
        if self.k_start is not None and self.k_start > self.hidden:
            raise bad("k_start", f"{{name}} {self.k_start} is not allowed; use {{name}} <= {hidden} ({self.hidden})")
        ruled("epochs")
        checked("batch_size", check_batch_size, self.batch_size, n_train)
        if self.lr != "auto":
            if isinstance(self.lr, str):
                raise bad("lr", f"{{name}} {literal(repr(self.lr))} is not allowed; use a positive learning rate "
                                f"or 'auto'")
            ruled("lr")
        ruled("momentum")
        ruled("sigma")
        ruled("topk")
        ruled("activation")
        ruled("dtype")
        ruled("optimizer")
        # (lr is checked against the data: learning_rate.check_rate_moves_weights)
        check_in_dtype_by_field(self.dtype, name, sigma=("sigma", self.sigma), momentum=("momentum", self.momentum))
        try:
            choose_step(self.step, self.k, self.hidden)
        except OptionError as exc:
            raise bad("step", exc.template) from None
        if isinstance(self.aux_k, bool) or not isinstance(self.aux_k, (int, np.integer)) or not 0 <= self.aux_k <= self.hidden:
            raise bad("aux_k", f"{{name}} {literal(self.aux_k)} is not allowed; use 0 (off) to {hidden} "
                               f"({self.hidden}) dead units per example")
        if self.aux_k:
            ruled("aux_coef")
        ruled("dead_window")

    def check_new(self, name=lambda field: field, refuse: bool = True) -> None:
        """A value with no effect in a new run (a loaded checkpoint keeps what it recorded), which
        config.json would record as if it had acted: refused (a command), or with ``refuse=False`` said
        in a note (the estimator, which a grid search may give aux_coef beside aux_k=0)."""
        if not self.aux_k and self.aux_coef != TrainConfig.aux_coef:
            error = _option_error(name("aux_coef"), f"{{name}} {self.aux_coef} has no effect with {name('aux_k')} 0 "
                                                    f"(the auxiliary loss is off); give {name('aux_k')} N too, or "
                                                    f"leave {{name}} out")
            if refuse:
                raise error
            note(str(error))

    def resolve_lr(self, lr: float) -> None:
        """``lr="auto"`` resolved to the rate derived from the data (``lr_auto`` records it). A validated
        configuration stays validated: the rate is positive and finite, all :meth:`validate` asks of one."""
        if isinstance(lr, bool) or not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"a learning rate derived from the data must be positive and finite, not {lr!r}")
        self.changed_validly(lr=lr, lr_auto=True)

    def drop_schedule(self) -> None:
        """Train with ``k`` from the first epoch (``k_start`` None, which :meth:`validate` allows with any
        other values): a validated configuration stays validated. The epochs the schedule was asked over
        are kept (k_schedule_epochs): once the run's epochs are raised, the options that made it are still
        judged over them, and name it."""
        self.changed_validly(k_start=None, k_schedule_epochs=self.k_schedule_epochs or self.epochs)


DEFAULTS = TrainConfig()  # the options' defaults, declared once: the paper's settings (ksae_cupy.paper) and ours beyond it
