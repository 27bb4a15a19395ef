"""Each rule, default and choice set is declared once: TrainConfig's field rules (config.RULES) are what both
TrainConfig.validate and the estimator's scikit-learn constraints enforce; the commands' choices are the
source constants; the paper's figures come from ksae_cupy.paper."""
from __future__ import annotations

import dataclasses
import math

import pytest

from ksae_cupy import model, paper
from ksae_cupy.errors import KsaeError
from ksae_cupy.sparse_step import STEPS
from ksae_cupy.topk import TOPK_METHODS
from ksae_cupy.training.config import RULES, TrainConfig
from ksae_cupy.training.estimator import KSparseAutoencoder, parameter_name
from ksae_cupy.session.fields import SHARED, TRAIN
from ksae_cupy.training.options import DTYPES
from ksae_cupy.training.sklearn_compat import check_parameters, make_constraint


def _outside(rule):
    """Values just outside a rule (and one inside), as (value, allowed)."""
    if rule.kind is bool:
        return [(True, True), ("yes", False)]
    if rule.choices:
        return [(next(iter(rule.choices)), True), ("no-such-choice", False)]
    cases = []
    if rule.low is not None:
        cases += [(rule.low, rule.closed in ("left", "both")), (rule.low - 1, False)]
    if rule.high is not None:
        cases += [(rule.high, rule.closed in ("right", "both")), (rule.high + 1, False)]
    return [(rule.kind(value) if allowed or rule.kind is int else value, allowed) for value, allowed in cases]


@pytest.mark.parametrize("field", list(RULES))
def test_the_estimators_constraint_is_the_fields_rule(field):
    allowed_by = [make_constraint(c) for c in KSparseAutoencoder._parameter_constraints[parameter_name(field)]]
    for value, allowed in _outside(RULES[field]):
        assert any(c.is_satisfied_by(value) for c in allowed_by) == allowed, (field, value)


@pytest.mark.parametrize("field", [f for f, rule in RULES.items() if rule.check is not None])
def test_validate_refuses_what_the_rule_refuses(field):
    """A value outside the rule, every other field valid, is refused by validate and by fit's check, naming the
    field; the value on the rule's allowed edge passes validate."""
    for value, allowed in _outside(RULES[field]):
        config = dataclasses.replace(TrainConfig(hidden=100, k=1, k_start=None), **{field: value})
        if field == "aux_coef":
            config.aux_k = 1  # the weight is checked where the loss is on
        if allowed:
            if not (isinstance(value, float) and math.isinf(value)):
                config.validate()
            continue
        with pytest.raises(KsaeError, match=field):
            config.validate()
        estimator = KSparseAutoencoder(**{parameter_name(field): value})
        with pytest.raises(KsaeError, match=parameter_name(field)):
            check_parameters(estimator)


def test_the_choices_are_the_source_constants():
    options = {option.name: option for option in TRAIN}
    assert options["topk"].type is TOPK_METHODS and SHARED["topk"].type is TOPK_METHODS
    assert options["step"].type is STEPS and options["dtype"].type is DTYPES
    assert options["activation"].type is model.ACTIVATIONS
    assert RULES["topk"].choices is TOPK_METHODS and RULES["step"].choices is STEPS
    assert RULES["activation"].choices is model.ACTIVATIONS and RULES["dtype"].choices is DTYPES


def test_the_defaults_and_help_texts_are_the_papers():
    config = TrainConfig()
    assert (config.hidden, config.k, config.k_start, config.epochs, config.batch_size) == (
        paper.HIDDEN, paper.K, paper.K_START, paper.EPOCHS, paper.BATCH_SIZE)
    assert (config.lr, config.momentum, config.sigma) == (paper.LR, paper.MOMENTUM, paper.SIGMA)
    helps = {option.name: option.help for option in TRAIN}
    assert f"paper: {paper.HIDDEN} on MNIST" in helps["hidden"] and f"paper: {paper.MOMENTUM}" in helps["momentum"]
    assert f"paper: {paper.EPOCHS}" in helps["epochs"] and f"paper: {paper.SIGMA}" in helps["sigma"]


def test_a_baseline_is_one_registry_entry(monkeypatch):
    """design.md's worked example: one entry makes a baseline the trainers configure, recognise and reload."""
    from ksae_cupy.supervised import baseline_trainer as bt
    from ksae_cupy.supervised import baselines
    from ksae_cupy.supervised.commands import BASELINE

    assert next(option.type for option in BASELINE if option.name == "model") is baselines.BASELINES
    model_help = next(option.help for option in BASELINE if option.name == "model")
    assert all(f"{b.name} ({b.what})" in model_help for b in baselines.BASELINES.values())
    entry = baselines.Baseline("dropout30-ae", "30% hidden dropout", "dropout autoencoder (30% hidden)",
                               baselines.AutoencoderConfig, {"hidden_dropout": 0.3})
    monkeypatch.setitem(baselines.BASELINES, entry.name, entry)
    config = bt.config_for("dropout30-ae", epochs=1)
    assert (config.hidden_dropout, config.input_dropout) == (0.3, 0.0)
    assert bt.model_name(config) == "dropout30-ae"
    assert bt.config_from_dict(bt.config_to_dict(config)) == config
    assert bt.model_name(bt.config_for("rbm")) == "rbm"
    assert bt.model_name(baselines.AutoencoderConfig(hidden_dropout=0.1)) == "autoencoder"
