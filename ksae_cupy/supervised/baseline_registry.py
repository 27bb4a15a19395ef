"""The baselines' registry: every learner ``ksae-baseline --model`` and ``ksae-finetune --baseline`` know.

It imports no learner. A learner's module registers its entries, each a :class:`Baseline` carrying its
config class, its step and the options of its own settings (``register(Baseline(...))``), and
:data:`LEARNERS` names the package's learner modules, loaded the first time the registry is read
(:func:`registered`). A new baseline is then a module of its own and one line here (its module's name),
or, outside the package, a module imported before the commands are built (the commands read the
registry when they are: ``ksae-baseline`` adds each entry's options to its own).

    register(Baseline("contractive-ae", "contractive penalty", "contractive autoencoder", ContractiveConfig,
                      step=contractive_step, family="contractive",
                      options=(Option("penalty", "Weight of the contractive penalty. [default: 0.1]", None, float),)))

A setting given to a learner that lacks it is refused in one line (:func:`own_settings`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, fields

from ksae_cupy.errors import KsaeError, OptionError
from ksae_cupy.registry import Registry

LEARNERS = ("ksae_cupy.supervised.baselines",)  # the package's learner modules (each registers its entries)
DROPOUTS = ("input_dropout", "hidden_dropout")


def _any_input(X_nd):
    return X_nd


@dataclass(frozen=True)
class Baseline:
    """One baseline model: everything the commands, the reports and the scripts ask of it.

    ``name``: how ``ksae-baseline --model`` and ``ksae-finetune --baseline`` spell it, the run folder's
    ``model`` and its row key in :mod:`ksae_cupy.paper`; ``what``: ``--model``'s help words; ``label``: how
    ``ksae-eval``'s report names it; ``config``: its configuration class; ``regularisation``: its dropout
    rates, in pretraining and -- section 4.5: "the regularization method used in the fine-tuning stage ... is
    the same" -- in fine-tuning; ``fine_tuned``: Table fn_mnist has a row fine-tuning a ``ksae-baseline`` run
    of it; ``check_input(X_nd)``: refuses data it cannot learn from, in one line (returns ``X_nd``);
    ``grid_lrs``, ``grid_weight_decays``: the points ``bin/baseline-grid`` tries (comma-separated, as its
    run folders are named: ``lr0.01-wd2e-5``); ``step(run, X_bd)``: ``(loss, grads)`` of one minibatch, its random
    numbers drawn from the run's generator; ``valid_loss(params, X_nd)``: the clean reconstruction error the
    metrics report; ``family``: how help texts name the baselines sharing its config class (its defaults);
    ``upper_layers``: the options of a stacked layer above the first (``ksae-finetune --baseline`` with two
    layers), where they are not the first layer's; ``options``: the declarations
    (:class:`~ksae_cupy.session.fields.Option`, default None) of its config's settings that the commands do
    not declare for every baseline."""

    name: str
    what: str
    label: str
    config: type
    regularisation: dict = field(default_factory=dict)
    fine_tuned: bool = False
    check_input: object = _any_input
    grid_lrs: str = "0.003,0.01"
    grid_weight_decays: str = "0,1e-3"
    step: object = None
    valid_loss: object = None
    family: str = "autoencoders"
    upper_layers: dict = field(default_factory=dict)
    options: tuple = ()

    def matches(self, config) -> bool:
        """Whether ``config`` is one of this baseline's: its class, with exactly its dropout rates."""
        return type(config) is self.config and all(getattr(config, rate, 0.0) == self.regularisation.get(rate, 0.0)
                                                    for rate in DROPOUTS)


BASELINES: Registry = Registry("baseline")  # name -> Baseline
register = BASELINES.register  # add one baseline (a name already there is refused in one line)


def registered() -> Registry:
    """The registry, its package learners loaded (imported by name: the registry imports no learner)."""
    for module in LEARNERS:
        importlib.import_module(module)
    return BASELINES


def learner_of(config) -> Baseline:
    """The registered baseline that trains ``config``: one with its config class (every baseline of a class
    shares its step; the dropout rates are the config's own)."""
    for baseline in registered().values():
        if type(config) is baseline.config:
            return baseline
    raise KsaeError(f"no registered baseline trains a {type(config).__name__}; use one of "
                    f"{', '.join(sorted({b.config.__name__ for b in BASELINES.values()}))}")


def per_family_default(option: str) -> str:
    """``[default: V]``, or ``[default: V1 (family), V2 (family)]`` where the config classes differ: the help's
    default of ``option``, read from the registered baselines' config classes (so it cannot drift from them)."""
    values = {}
    for baseline in registered().values():
        values.setdefault(baseline.family, getattr(baseline.config, option))
    if len(set(values.values())) == 1:
        return f"[default: {next(iter(values.values())):g}]"
    return "[default: " + ", ".join(f"{value:g} ({family})" for family, value in values.items()) + "]"


def own_options() -> list:
    """The options of the registered baselines' own settings, each name once (the commands add them)."""
    seen = {}
    for baseline in registered().values():
        for option in baseline.options:
            seen.setdefault(option.name, option)
    return list(seen.values())


def own_settings(model: str, options) -> dict:
    """The baseline ``model``'s own settings that the command's ``options`` give (a field left at None is not given);
    one a learner of another kind owns and ``model`` lacks is refused in one line."""
    baseline = registered().get(model)
    if baseline is None:  # an unknown model: the caller refuses it by name
        return {}
    has = {f.name for f in fields(baseline.config)}
    settings = {}
    for option in own_options():
        value = getattr(options, option.name, None)  # registered after the command was built: not offered
        if value is None:
            continue
        if option.name not in has:
            owners = ", ".join(b.name for b in BASELINES.values() if any(o.name == option.name for o in b.options))
            raise OptionError(option.name, f"{{name}} is a setting of {owners}; {model} has none (leave it out)")
        settings[option.name] = value
    return settings
