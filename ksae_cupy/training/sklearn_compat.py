"""scikit-learn's estimator base classes and input checks, or small stand-ins without it.

scikit-learn is an optional extra (``pip install ksae-cupy[compare]``). With it,
:class:`~ksae_cupy.training.estimator.KSparseAutoencoder` is a real scikit-learn
transformer (``clone``, ``Pipeline``, ``GridSearchCV``, ``set_output``); without it, the
stand-ins below give it the same methods and the same checks on its input, raising
:class:`~ksae_cupy.errors.KsaeError` (a ``ValueError``) instead of scikit-learn's errors.
"""
from __future__ import annotations

import inspect

import numpy as np

from ksae_cupy.errors import KsaeError

try:
    from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted, validate_data

    HAVE_SKLEARN = True
except ImportError:
    HAVE_SKLEARN = False

# Parameter constraints as scikit-learn declares them (``_parameter_constraints``): its own
# constraint classes when it is installed (so that its ``check_param_validation`` can read them),
# else the stand-ins below, which print and test alike.
try:
    from sklearn.utils._param_validation import InvalidParameterError as _SklearnInvalidParameterError
    from sklearn.utils._param_validation import Interval, StrOptions, make_constraint
except ImportError:  # no scikit-learn, or a version whose private module moved
    _SklearnInvalidParameterError = None

    class NotFittedError(KsaeError, AttributeError):
        """Like scikit-learn's: a method that needs a fitted model was called before ``fit``."""

    class BaseEstimator:
        """``get_params`` / ``set_params`` from the ``__init__`` signature, as scikit-learn does."""

        def get_params(self, deep=True):
            names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
            return {name: getattr(self, name) for name in names}

        def set_params(self, **params):
            valid = self.get_params()
            for name, value in params.items():
                if name not in valid:
                    raise KsaeError(f"{name!r} is not a parameter of {type(self).__name__}; "
                                    f"use one of {', '.join(valid)}")
                setattr(self, name, value)
            return self

        def __repr__(self):
            args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
            return f"{type(self).__name__}({args})"

    class TransformerMixin:
        def fit_transform(self, X, y=None, **fit_params):
            return self.fit(X, y, **fit_params).transform(X)

    class ClassNamePrefixFeaturesOutMixin:
        def get_feature_names_out(self, input_features=None):
            check_is_fitted(self)
            prefix = type(self).__name__.lower()
            return np.asarray([f"{prefix}{i}" for i in range(self._n_features_out)], dtype=object)

    def check_is_fitted(estimator, attributes=None):
        if not estimator.__sklearn_is_fitted__():
            raise NotFittedError(f"this {type(estimator).__name__} is not fitted yet; call fit() or load() first")

    def validate_data(estimator, X, *, reset=True, dtype=None, **_ignored):
        """The checks scikit-learn's ``validate_data`` makes on a dense ``X`` that matter here."""
        if hasattr(X, "tocsr") or hasattr(X, "toarray"):
            raise KsaeError("sparse input is not supported; convert it with X.toarray()")
        X = np.asarray(X)
        if X.dtype.kind not in "biuf":
            raise KsaeError(f"X has dtype {X.dtype}; use real numbers (integer or float)")
        if X.ndim != 2:
            raise KsaeError(f"X has {X.ndim} dimension(s); use a 2-D array of N examples x D features")
        if X.shape[0] == 0 or X.shape[1] == 0:
            raise KsaeError(f"X of shape {X.shape} is empty; use at least one example and one feature")
        if dtype is not None and X.dtype not in [np.dtype(d) for d in dtype]:
            X = X.astype(dtype[0])
        if not np.isfinite(X).all():
            raise KsaeError("X holds NaN or infinite values; use finite numbers")
        check_width(estimator, X.shape[1], reset)
        return X


def check_width(estimator, n_features: int, reset: bool) -> None:
    """Record ``n_features_in_`` when fitting (``reset``); otherwise refuse a different width."""
    if reset:
        estimator.n_features_in_ = n_features
    elif n_features != estimator.n_features_in_:
        raise KsaeError(f"X has {n_features} features, but {type(estimator).__name__} "
                        f"is expecting {estimator.n_features_in_} features as input")


# -- parameter constraints ---------------------------------------------------------------------

_BASES = (KsaeError, TypeError) if _SklearnInvalidParameterError is None else (KsaeError, _SklearnInvalidParameterError)


class InvalidParameterError(*_BASES):
    """A parameter of the wrong type or out of its range: scikit-learn's ``InvalidParameterError``
    (a ``ValueError`` and a ``TypeError``) when it is installed, and always a :class:`KsaeError`."""


if _SklearnInvalidParameterError is None:
    from numbers import Integral, Real  # noqa: F401 (the constraints' types, as scikit-learn's)

    class Interval:
        """``type`` values from ``left`` to ``right`` (None: unbounded); ``closed``: left, right, both, neither."""

        def __init__(self, type, left, right, *, closed):
            self.type, self.left, self.right, self.closed = type, left, right, closed
            self.hidden = False

        def is_satisfied_by(self, value) -> bool:
            if not isinstance(value, self.type) or isinstance(value, bool) and self.type is not bool:
                return False
            if value != value:  # NaN
                return False
            if self.left is not None and (value < self.left or value == self.left and self.closed in ("right", "neither")):
                return False
            if self.right is not None and (value > self.right or value == self.right and self.closed in ("left", "neither")):
                return False
            return True

        def __str__(self):
            kind = "an int" if self.type is Integral else "a float"
            left = "-inf" if self.left is None else self.left
            right = "inf" if self.right is None else self.right
            opening = "[" if self.closed in ("left", "both") and self.left is not None else "("
            closing = "]" if self.closed in ("right", "both") and self.right is not None else ")"
            return f"{kind} in the range {opening}{left}, {right}{closing}"

    class StrOptions:
        def __init__(self, options):
            self.options, self.hidden = options, False  # a set, or a registry's live keys

        def is_satisfied_by(self, value) -> bool:
            return isinstance(value, str) and value in self.options

        def __str__(self):
            return f"a str among {{{', '.join(repr(o) for o in sorted(self.options))}}}"

    class _Constant:
        def __init__(self, name, test, hidden=False):
            self.name, self.test, self.hidden = name, test, hidden

        def is_satisfied_by(self, value) -> bool:
            return self.test(value)

        def __str__(self):
            return self.name

    def make_constraint(constraint):
        if constraint is None:
            return _Constant("None", lambda value: value is None)
        if constraint == "boolean":
            return _Constant("an instance of 'bool'", lambda value: isinstance(value, (bool, np.bool_)))
        if isinstance(constraint, type):
            return _Constant(f"an instance of {constraint.__qualname__!r}", lambda value: isinstance(value, constraint))
        return constraint
else:
    from numbers import Integral, Real  # noqa: F401


def check_parameters(estimator) -> None:
    """Raise :class:`InvalidParameterError` for the first parameter of ``estimator`` that meets none
    of its ``_parameter_constraints``, in scikit-learn's words: ``The 'k' parameter of
    KSparseAutoencoder must be an int in the range [1, inf). Got 2.5 instead.``"""
    for name, allowed in estimator._parameter_constraints.items():
        value = getattr(estimator, name)
        constraints = [make_constraint(c) for c in allowed]
        if any(c.is_satisfied_by(value) for c in constraints):
            continue
        shown = [str(c) for c in constraints if not getattr(c, "hidden", False)]
        text = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
        raise InvalidParameterError(f"The {name!r} parameter of {type(estimator).__name__} must be {text}. "
                                    f"Got {value!r} instead.")


def constraints(rules: dict, names=None, also=None) -> dict:
    """``_parameter_constraints`` made from :data:`~ksae_cupy.training.config.RULES`: ``{parameter: [constraint,
    ...]}`` in scikit-learn's order (the range or the choices, then the strings allowed besides, then None).
    ``names(field)`` gives a field's parameter name; ``also``: ``{field: (value, ...)}``, values a front end allows
    beyond the rule (the estimator's ``k_start="auto"``)."""
    made = {}
    for field, rule in rules.items():
        extra = (*(also or {}).get(field, ()), *rule.also)
        if rule.kind is bool:
            first = "boolean"
        elif rule.choices:
            # a registry's names as they are when fit runs (one registered later is allowed), else the set
            first = StrOptions(rule.choices.keys() if isinstance(rule.choices, dict) else set(rule.choices))
        else:
            first = Interval(Integral if rule.kind is int else Real, rule.low, rule.high, closed=rule.closed)
        strings = {value for value in extra if isinstance(value, str)}
        made[field if names is None else names(field)] = [first, *([StrOptions(strings)] if strings else []),
                                                          *([None] if None in extra else [])]
    return made
