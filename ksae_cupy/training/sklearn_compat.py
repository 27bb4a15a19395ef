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
