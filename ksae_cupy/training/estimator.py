"""``KSparseAutoencoder``: the Python API, a scikit-learn transformer when scikit-learn is installed.

    ae = KSparseAutoencoder(n_hidden=1000, k=25, epochs=50, lr="auto", device="auto")
    ae.fit(X_train_nd, X_valid=X_valid_nd)    # NumPy or CuPy float arrays, N x D; y is ignored
    H_nh = ae.transform(X_test_nd, alpha=3)   # alpha*k-sparse features (section 2.2)
    Xhat_nd = ae.inverse_transform(H_nh)
    ae.save("model.h5"); ae = KSparseAutoencoder.load("model.h5")

It follows scikit-learn's conventions (see :mod:`ksae_cupy.training.sklearn_compat`):
``__init__`` only stores its arguments; ``fit`` starts from scratch unless ``warm_start``
(a loaded checkpoint is warm, so ``fit`` resumes it); fitted attributes end in ``_``;
input is checked with scikit-learn's ``validate_data``; every parameter's type and range is
checked when ``fit`` starts (``_parameter_constraints``, in scikit-learn's words); pickling and
``clone`` work.
A fresh fit's trainer is made ready by :func:`~ksae_cupy.training.prepare.prepare`, which ``ksae-train``
calls too (it builds its trainer directly, not through this class: :mod:`ksae_cupy.session.train_run`).

Over 400 lines: scikit-learn's whole estimator contract (parameters and their constraints, fit, partial_fit,
transform, inverse_transform, score, save / load, pickling) on one class, as scikit-learn keeps an estimator.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ksae_cupy import model
from ksae_cupy.backend import CPU, array_module, resolve_device, to_host
from ksae_cupy.datasets.preprocess import raw_input_params
from ksae_cupy.errors import KsaeError, note
from ksae_cupy.schedules import resolve_k_start
from ksae_cupy.training.checkpoint import Checkpoint, load_checkpoint
from ksae_cupy.training.learning_rate import auto_learning_rate
from ksae_cupy.training.options import DTYPES, check_positive_finite
from ksae_cupy.training.config import DEFAULTS, RULES, TrainConfig
from ksae_cupy.training import prepare as preparation
from ksae_cupy.training.sklearn_compat import (BaseEstimator, ClassNamePrefixFeaturesOutMixin, Integral, Interval,
                                               Real, TransformerMixin, check_is_fitted, check_parameters,
                                               check_width, constraints, validate_data)
from ksae_cupy.training.trainer import Trainer, TrainingDiverged


def parameter_name(field: str) -> str:
    """How the estimator's messages name a :class:`TrainConfig` field: by its parameter."""
    return {"hidden": "n_hidden"}.get(field, field)



# Input dtypes kept as they are; anything else (integers, with input_scale) becomes the first.
KEPT_DTYPES = (np.float64, np.float32)


class KSparseAutoencoder(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """A k-sparse autoencoder with tied weights, trained by momentum SGD.

    Parameters mirror :class:`~ksae_cupy.training.trainer.TrainConfig` (``n_hidden`` is its
    ``hidden``); ``lr="auto"``, the default, derives the learning rate from the training data
    (0.01 on MNIST, the paper's rate; smaller on data of a larger scale; see
    :mod:`ksae_cupy.training.learning_rate`), a number fixes it; ``k_start="auto"`` starts the schedule at 100 (section 4.3.1), or at k
    when k > 100, never above ``n_hidden``; ``None`` turns the schedule off; ``device`` is
    ``auto``, ``cpu`` or ``gpu[:N]``; ``batch_size`` larger than the data is cut to the data,
    as scikit-learn's MLP does; ``alpha`` is the default of :meth:`transform`'s (a parameter, so
    a grid search can tune it; ``None``: the package's one rule, :mod:`ksae_cupy.training.chosen_alpha`:
    the alpha the run's ``ksae-eval`` chose, else 3, the paper's); ``warm_start=True`` makes ``fit`` go on from the current state;
    ``input_scale``, when given, multiplies every input (integer input is converted to float,
    as scikit-learn does; ``fit`` refuses data whose scale would diverge at a fixed ``lr``, and
    ``input_scale=1/255`` takes 8-bit pixels as they are); ``verbose=1`` prints a line per
    epoch of ``fit`` (loss, validation loss, speed, time left), as scikit-learn's estimators do;
    ``n_threads`` caps the CPU threads of ``fit`` (BLAS and the CPU kernels; ``None``: as
    ``ksae-train`` chooses: the count a command set, else ``OMP_NUM_THREADS`` and its kin, else
    one per core that other jobs leave free). Beyond the paper, off by default:
    ``aux_k > 0`` adds the auxiliary loss of Gao et al. (2024) on the units kept in none of the last
    ``dead_window`` examples, weighted by ``aux_coef``; ``center_input=True`` subtracts the training
    mean from every input (kept in ``preprocess_["input_mean"]``, subtracted by ``transform`` and ``score``).
    ``optimizer`` names the update (:data:`ksae_cupy.optimizers.OPTIMIZERS`; the paper's momentum SGD).

    Fitted attributes: ``components_`` (the dictionary ``W_dh`` transposed, H x D, as in
    scikit-learn's decomposition estimators), ``n_features_in_``, ``trainer_`` (the
    :class:`Trainer` holding parameters, velocities and random state; ``None`` before fit),
    ``preprocess_`` (the data's preprocessing statistics, saved with the checkpoint), ``unit_counts_`` (after
    ``fit``: each unit's firing count on the training rows and the dead count, :mod:`ksae_cupy.training.unit_counts`;
    the export carries them).
    """

    # Every parameter's type and range, checked when fit starts (scikit-learn's convention and
    # words: "The 'k' parameter of KSparseAutoencoder must be an int in the range [1, inf). Got 2.5
    # instead."): TrainConfig's fields by their rules (config.RULES, which TrainConfig.validate checks too),
    # then the estimator's own; the constraints between parameters (k <= n_hidden, ...) are TrainConfig.validate's.
    _parameter_constraints = {
        **constraints(RULES, parameter_name, also={"k_start": ("auto",)}),
        "device": [str],
        "alpha": [Interval(Real, 1, None, closed="left"), None],
        "warm_start": ["boolean"],
        "input_scale": [Interval(Real, 0, None, closed="neither"), None],
        "verbose": [Interval(Integral, 0, None, closed="left"), "boolean"],
        "n_threads": [Interval(Integral, 1, None, closed="left"), None],
    }

    # Defaults: TrainConfig's (the paper's), but for the rate and the schedule's start, derived from the data
    # and from k here ("auto"), and the estimator's own.
    def __init__(self, n_hidden=DEFAULTS.hidden, k=DEFAULTS.k, k_start="auto", epochs=DEFAULTS.epochs,
                 batch_size=DEFAULTS.batch_size, lr="auto", momentum=DEFAULTS.momentum, sigma=DEFAULTS.sigma, topk=DEFAULTS.topk,
                 seed=DEFAULTS.seed, dtype=DEFAULTS.dtype, device="auto", activation=DEFAULTS.activation, step=DEFAULTS.step,
                 alpha=None, warm_start=False, input_scale=None, verbose=0, n_threads=None, aux_k=DEFAULTS.aux_k,
                 aux_coef=DEFAULTS.aux_coef, dead_window=DEFAULTS.dead_window, center_input=DEFAULTS.center_input,
                 optimizer=DEFAULTS.optimizer):
        self.n_hidden, self.k, self.k_start, self.epochs = n_hidden, k, k_start, epochs
        self.batch_size, self.lr, self.momentum, self.sigma = batch_size, lr, momentum, sigma
        self.topk, self.seed, self.dtype, self.device = topk, seed, dtype, device
        self.activation, self.step, self.alpha, self.warm_start = activation, step, alpha, warm_start
        self.input_scale = input_scale
        self.verbose, self.n_threads = verbose, n_threads
        # Beyond the paper: the AuxK loss on dead units, and centred inputs (TrainConfig says how).
        self.aux_k, self.aux_coef, self.dead_window, self.center_input = aux_k, aux_coef, dead_window, center_input
        self.optimizer = optimizer  # the update (ksae_cupy.optimizers): the paper's momentum SGD

    # -- configuration -------------------------------------------------------------------
    def config(self, X_nd=None) -> TrainConfig:
        """The :class:`TrainConfig` these parameters make; with training data ``X_nd``,
        ``lr="auto"`` is resolved to the rate derived from it (``lr_auto`` records that)."""
        k_start = resolve_k_start(self.k_start, self.k, self.n_hidden)
        lr, lr_auto = self.lr, False
        if isinstance(lr, str) and lr == "auto" and X_nd is not None:
            lr, lr_auto = auto_learning_rate(X_nd), True
        values = {field: getattr(self, parameter_name(field)) for field in RULES}  # a parameter per ruled field
        return TrainConfig(**{**values, "k_start": k_start, "lr": lr, "lr_auto": lr_auto})

    @property
    def trainer_(self) -> Trainer | None:
        # A property, not an attribute set in __init__ (scikit-learn's rule), so that
        # callers may still ask ``trainer_ is None`` before fitting.
        return self.__dict__.get("_trainer")

    @property
    def preprocess_(self) -> dict:
        return self.__dict__.get("_preprocess", {})

    @preprocess_.setter
    def preprocess_(self, value: dict) -> None:
        self._preprocess = dict(value)

    @property
    def run_id_(self) -> str | None:
        """The identity of the run folder this model's checkpoints belong to (``ksae-train``
        sets it; :meth:`save` writes it, :meth:`load` reads it back); None outside a run folder."""
        return self.__dict__.get("_run_id")

    @run_id_.setter
    def run_id_(self, value: str | None) -> None:
        self._run_id = value

    def __sklearn_is_fitted__(self) -> bool:
        return self.trainer_ is not None

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = sorted(DTYPES, reverse=True)  # float64 first: scikit-learn's default
        return tags

    @property
    def backend(self):
        if self.trainer_ is not None:
            return self.trainer_.backend
        return resolve_device(self.device)

    # -- training ------------------------------------------------------------------------
    def fit(self, X, y=None, *, X_valid=None, on_epoch=None, on_batch=None, checkpoint_path=None,
            should_checkpoint=None, option_names=parameter_name):
        """Train for the configured epochs; ``y`` is ignored. Returns ``self``.

        Starts from fresh parameters, unless ``warm_start`` is true and the model is fitted
        (or loaded): then it goes on where it stopped, up to ``epochs`` in all (so a finished
        model trains more only after ``set_params(epochs=...)`` raises it). ``X_valid`` is scored after every epoch.
        ``on_epoch(report)`` is called after every epoch, ``on_batch(done, total)`` after
        every batch; when ``checkpoint_path`` is given, a checkpoint is written there whenever
        ``should_checkpoint(epoch)`` is true and at the end.

        A loss that becomes NaN or infinite raises :class:`TrainingDiverged`, a one-line
        ``ValueError`` that says what was saved and the rate ``lr="auto"`` gives for ``X``.
        ``option_names(field)`` spells parameters in messages (``ksae-train`` passes flags).
        """
        check_parameters(self)  # every parameter's type and range, in scikit-learn's words
        resume = self.warm_start and self.trainer_ is not None
        prepared = self.__dict__.pop("_prepared", None)
        if not resume and prepared is not None and prepared[0] is X and prepared[2] == self.get_params():
            X_nd = prepared[1]  # prepare(X) checked X and built the trainer: train that one
        elif resume:
            X_nd = self._centred(*self._check_X(X, reset=False))
        else:
            X_nd, xp = self._fresh_rows(X, whole_set=True)
            self._trainer = self._new_trainer(X_nd, xp, option_names)
        trainer = self.trainer_
        trainer.config.epochs = self.epochs  # a warm fit may have been given more epochs
        trainer.config.check(name=option_names)  # validated again only if that changed it
        X_valid_nd = self._centred(*self._check_X(X_valid, reset=False)) if X_valid is not None else None
        X_dev, X_valid_dev = self._to_device(X_nd), self._to_device(X_valid_nd)
        step_before = trainer.step
        self._saved_at = None
        on_epoch = self._verbose_epochs(on_epoch, trainer)
        try:
            with trainer.backend.use(), self._thread_limits(trainer):
                trainer.fit(X_dev, X_valid_dev, on_epoch, on_batch, should_checkpoint,
                            checkpoint=None if checkpoint_path is None else lambda: self.save(checkpoint_path))
        except TrainingDiverged as exc:
            raise self._diverged(exc, X_nd, checkpoint_path, option_names) from None
        # A finished run resumed again trains nothing: leave its checkpoint file untouched.
        if checkpoint_path is not None and (trainer.step != step_before or not Path(checkpoint_path).exists()):
            self.save(checkpoint_path)
        from ksae_cupy.training.unit_counts import measure

        # every unit's firing count on the rows fit trained on (the dead units, as every command counts them)
        self.unit_counts_ = measure(trainer, self.preprocess_, to_host(X_nd), centred=True)
        return self

    def prepare(self, X, *, config: TrainConfig | None = None, option_names=parameter_name, on_config=None):
        """The first half of a fresh :meth:`fit`, done now; returns ``self``. ``X`` and the parameters are
        checked, the configuration made (``lr="auto"`` resolved from ``X``) and validated, and the trainer
        built after the checks fit makes before training (memory, the data's scale, a rate that moves the
        weights): a caller calls it to refuse bad input before it writes anything. The next ``fit`` of
        the same ``X`` object, the parameters unchanged, trains that trainer instead of building another
        (until then the model holds its initial weights). The trainer is made by
        :func:`~ksae_cupy.training.prepare.prepare`, as ``ksae-train`` makes its own.

        ``config``: the :class:`TrainConfig` these parameters make, already validated (by a caller that
        validates its options before it reads the data), taken instead of a new one (its ``"auto"`` rate
        resolved in place). ``on_config(config, scale)`` is called once the rate is resolved, before the
        checks, with the rows' :class:`~ksae_cupy.training.learning_rate.DataScale` (to say which rate
        ``lr="auto"`` chose, and from what).
        """
        check_parameters(self)
        X_nd, xp = self._fresh_rows(X, whole_set=True)
        self._trainer = self._new_trainer(X_nd, xp, option_names, config, on_config)
        self._prepared = (X, X_nd, self.get_params())
        return self

    def partial_fit(self, X, y=None):
        """One pass over ``X`` (one epoch of the schedule), from the current state; returns ``self``.

        With ``lr="auto"`` the rate is derived from the first ``X`` and kept after it."""
        check_parameters(self)
        if self.trainer_ is None:
            X_nd, xp = self._fresh_rows(X)  # the first batch's mean: the one partial_fit sees first
            self._trainer = self._new_trainer(X_nd, xp)
        else:
            X_nd = self._centred(*self._check_X(X, reset=False))
        trainer = self.trainer_
        if trainer.finished:
            trainer.config.epochs += 1  # partial_fit may go on past the configured epochs
        try:
            with trainer.backend.use(), self._thread_limits(trainer):
                trainer.run_epoch(self._to_device(X_nd))
        except TrainingDiverged as exc:
            raise self._diverged(exc, X_nd, None, parameter_name) from None
        return self

    def _thread_limits(self, trainer):
        """The CPU thread counts for the ``with`` block (``n_threads``); said when ``verbose``."""
        from contextlib import contextmanager

        from ksae_cupy.threads import estimator_threads

        @contextmanager
        def limits():
            if trainer.backend.is_gpu:
                if self.n_threads is not None and not self.__dict__.get("_gpu_threads_noted"):
                    self._gpu_threads_noted = True  # once per estimator, not once per partial_fit
                    note(f"n_threads={self.n_threads} has no effect on the GPU: the training runs there, with "
                         f"no CPU threads to set")
                yield
                return
            with estimator_threads(self.n_threads) as (count, how):
                if self.verbose:
                    print(f"{type(self).__name__}: {count or 'default'} CPU thread(s) ({how})", flush=True)
                yield

        return limits()

    def _verbose_epochs(self, on_epoch, trainer):
        """``on_epoch``, preceded when ``verbose`` by a printed line per epoch with the time left."""
        if isinstance(self.verbose, bool) or not isinstance(self.verbose, (int, np.integer)) or self.verbose < 0:
            raise KsaeError(f"verbose={self.verbose!r} is not allowed; use 0 (silent) or 1 (a line per epoch)")
        if not self.verbose:
            return on_epoch
        import time

        from ksae_cupy.training.wording import epoch_line, format_duration

        started, first_epoch = time.perf_counter(), trainer.epoch

        def report_then(report):
            epochs = trainer.config.epochs
            per_epoch = (time.perf_counter() - started) / max(1, report.epoch - first_epoch)
            left = format_duration(per_epoch * (epochs - report.epoch)) if report.epoch < epochs else ""
            print(epoch_line(report, epochs, left), flush=True)
            if on_epoch is not None:
                on_epoch(report)

        return report_then

    def _new_trainer(self, X_nd, xp, option_names=parameter_name, config=None, on_config=None) -> Trainer:
        """The trainer of a fresh fit on the rows ``X_nd`` (of array module ``xp``, as :meth:`_fresh_rows` returns
        them): :func:`~ksae_cupy.training.prepare.prepare`, as ``ksae-train`` builds its trainer."""
        config = self.config() if config is None else config
        return preparation.prepare(X_nd, xp, config, self.device, option_names, on_config)

    def _diverged(self, exc: TrainingDiverged, X_nd, checkpoint_path, option_names) -> TrainingDiverged:
        """``exc`` retold for the caller: what was saved, and a rate that trains this data."""
        rate = self.trainer_.config.lr if self.trainer_ is not None else None
        return preparation.retold(exc, X_nd, checkpoint_path, self.__dict__.get("_saved_at"), self.sigma, option_names,
                                  rate=rate)

    def _check_X(self, X, reset: bool):
        """``X`` checked as scikit-learn does (2-D, non-empty, real, finite, right width), numeric
        integers converted to float as scikit-learn does (fit then checks the data's scale: see
        :func:`~ksae_cupy.training.learning_rate.check_data_scale`), then multiplied by ``input_scale``.
        Returns the rows and their array module, asked here once: NumPy, or CuPy for rows already on a device
        (then only their shape is checked, without a copy to the host).
        """
        if self.input_scale is not None:
            check_positive_finite("input_scale", self.input_scale, "factor (e.g. 1/255 for 8-bit pixels)")
        dtype = getattr(X, "dtype", None) if hasattr(X, "dtype") else np.asarray(X).dtype if isinstance(X, list) else None
        if getattr(dtype, "kind", None) == "c":  # scikit-learn's message would print the whole array
            raise KsaeError(f"Complex data not supported: X has dtype {dtype}; use real numbers")
        xp = array_module(X)
        if xp is np:
            X = validate_data(self, X, reset=reset, dtype=KEPT_DTYPES)
        else:
            if X.ndim != 2 or X.shape[0] == 0:
                raise KsaeError(f"X of shape {tuple(X.shape)} is not allowed; use a non-empty N x D array")
            check_width(self, X.shape[1], reset)
            if X.dtype.kind != "f":
                X = X.astype(np.float32)
        if self.input_scale is not None:
            X = X * X.dtype.type(self.input_scale)
        return X, xp

    def _fresh_rows(self, X, whole_set: bool = False):
        """The rows a fresh fit trains on, and their array module: ``X`` checked (its width learned), then with
        ``center_input`` minus their mean, kept in ``preprocess_["input_mean"]`` (with the model, in its
        checkpoints; :func:`~ksae_cupy.training.prepare.centre_rows`)."""
        X_nd, xp = self._check_X(X, reset=True)
        if whole_set:  # fit's training set, as ksae-train's file: at least two rows (partial_fit's batch may be one)
            from ksae_cupy.datasets.user_files import check_matrix_shape

            check_matrix_shape(X_nd, "X")
        X_nd, self.preprocess_ = preparation.centre_rows(X_nd, self.center_input, self.dtype, self.preprocess_)
        return X_nd, xp

    def _centred(self, X_nd, xp):
        """``X_nd`` (of array module ``xp``) minus the training mean when the model was trained on centred
        inputs, else as it is."""
        return preparation.centred(X_nd, xp, self.preprocess_)

    def _to_device(self, X_nd):
        if X_nd is None:
            return None
        return self.trainer_.backend.asarray(X_nd, dtype=self.trainer_.dtype)

    # -- using the model -----------------------------------------------------------------
    @property
    def params_(self) -> dict:
        check_is_fitted(self)
        return self.trainer_.params

    @property
    def components_(self) -> np.ndarray:
        return to_host(self.params_["W_dh"]).T

    @property
    def _n_features_out(self) -> int:
        return self.params_["b_h"].shape[0]  # for get_feature_names_out

    @property
    def alpha_(self) -> float:
        """The alpha :meth:`transform` uses when given none: the ``alpha`` parameter, or by the package's one
        rule (:func:`~ksae_cupy.training.chosen_alpha.default_alpha`): the run's evaluated choice, else 3."""
        if self.alpha is not None:
            return float(self.alpha)
        from ksae_cupy.training.chosen_alpha import fallback_alpha

        config = self.trainer_.config if self.trainer_ is not None else None
        return fallback_alpha(config.k if config else self.k, config.hidden if config else self.n_hidden)

    def transform(self, X, alpha: float | None = None, chunk: int = 8192, dtype=None, sparse=False):
        """The ``alpha*k``-sparse features ``supp_{alpha k}(W^T x + b)``, an N x H array.

        ``alpha`` defaults to :attr:`alpha_` (the ``alpha`` parameter, else the run's evaluated choice, else 3).
        ``sparse=True`` returns a SciPy CSR matrix (N x H, built a chunk at a time: the dense N x H never
        exists), ``sparse="topk"`` a pair ``(idx_nK, val_nK)``: each row's ``alpha*k`` kept columns (ascending)
        and their values, on the host. Otherwise it returns the array type of the input (NumPy in, NumPy out), in the input's float
        dtype, computed in ``dtype`` (default: the model's ``dtype``). float64 makes float32 features the same bytes
        with other BLAS threads (MNIST's 50,000 x 1000 codes at 1 and 2 threads: identical; computed in float32,
        555,216 values differ in the last bit); only a sum within float64 rounding of a float32 boundary could
        still round apart, on another device.
        """
        check_is_fitted(self)
        X, xp_in = self._check_X(X, reset=False)
        X = self._centred(X, xp_in)
        alpha = self.alpha_ if alpha is None else alpha
        if sparse not in (False, True, "topk"):
            raise KsaeError(f"sparse={sparse!r} is not allowed; use False (a dense array), True (SciPy CSR) or "
                            f"'topk' (indices and values)")
        params, backend = self.params_, self.trainer_.backend
        compute = self.trainer_.dtype if dtype is None else np.dtype(dtype)
        if compute != self.trainer_.dtype:
            with backend.use():
                params = {name: backend.asarray(value, dtype=compute) for name, value in params.items()}
        is_host = xp_in is np
        out = []
        with backend.use():
            for start in range(0, X.shape[0], chunk):
                X_chunk = backend.asarray(X[start:start + chunk], dtype=compute)
                H_nh = model.encode(params, X_chunk, self.trainer_.config.k, alpha, self.trainer_.config.topk,
                                    self.trainer_.config.activation)
                out.append(sparse_rows(to_host(H_nh).astype(X.dtype, copy=False), sparse,
                                       model.alpha_k(self.trainer_.config.k, alpha, H_nh.shape[1]))
                           if sparse else to_host(H_nh) if is_host else H_nh)
        if sparse:
            return joined_sparse(out, sparse)
        xp = np if is_host else backend.xp
        return xp.concatenate(out).astype(X.dtype, copy=False)

    def inverse_transform(self, X):
        """Reconstructions ``W h + c`` of codes ``X`` (N x H), in the codes' float dtype."""
        check_is_fitted(self)
        if array_module(X) is np:
            X = np.asarray(X)
        H = self.params_["b_h"].shape[0]
        if X.ndim != 2 or X.shape[1] != H:
            raise KsaeError(f"codes of shape {tuple(X.shape)} do not fit this model; expected N x {H}")
        backend = self.trainer_.backend
        with backend.use():
            Xhat = model.decode(raw_input_params(self.params_, self.preprocess_),
                                backend.asarray(X, dtype=self.trainer_.dtype))
        out_dtype = X.dtype if X.dtype.kind == "f" else self.trainer_.dtype
        return (to_host(Xhat) if array_module(X) is np else Xhat).astype(out_dtype, copy=False)

    def score(self, X, y=None) -> float:
        """The fraction of variance explained (FVE) of ``X``'s reconstructions through the k largest units:
        ``1 - sum ||x - xhat||^2 / sum ||x - mean(x)||^2`` (:mod:`ksae_cupy.metrics`); ``y`` is ignored.

        Higher is better, as scikit-learn's model selection (``GridSearchCV``, ``cross_val_score``) wants:
        1 is a perfect reconstruction, 0 no better than ``X``'s mean. It is scikit-learn's ``r2_score``
        with ``multioutput="variance_weighted"``. On one ``X`` it orders models as the reconstruction loss
        does: the loss (the training log's ``valid`` column) is ``(1 - score) * sum ||x - mean(x)||^2 / (2 N)``.
        """
        from ksae_cupy.metrics import fve_from_sums, total_variance

        check_is_fitted(self)
        X = self._centred(*self._check_X(X, reset=False))
        with self.trainer_.backend.use():
            X_nd = self._to_device(X)
            loss = self.trainer_.evaluate_loss(X_nd)  # mean 0.5 ||x - xhat||^2
            return fve_from_sums(2.0 * loss * X_nd.shape[0], total_variance(X_nd))

    # -- persistence ---------------------------------------------------------------------
    def save(self, path) -> None:
        """Write a checkpoint (the whole training state) to ``path`` atomically."""
        check_is_fitted(self)
        self._saved_at = preparation.save_state(self.trainer_, path, self.preprocess_, self.run_id_)

    @classmethod
    def load(cls, path, device: str = "auto", raw_inputs: bool = False) -> "KSparseAutoencoder":
        """An estimator restored from a checkpoint, ready to transform or to go on training
        (``warm_start=True``, so ``fit`` resumes it).

        ``path`` is a file :meth:`save` wrote, a ``ksae-train`` run folder or its ``checkpoint.h5``
        (the same format): ``load("runs/RUN").transform(X)`` gives that run's features of the rows
        ``load_dataset`` gives (scaled as the run's dataset is; a ``--center-input`` run's mean is subtracted
        here). From a run folder that ``ksae-eval`` evaluated, ``alpha`` is the alpha it chose.
        ``raw_inputs=True`` (a run folder of a built-in dataset that only scales its values, as MNIST's pixels
        / 255): ``input_scale`` is set to that factor, so ``transform`` takes the raw values. The parameters come back as the checkpoint has them
        (``lr`` is the rate the run trained with, resolved if it was ``auto``)."""
        from ksae_cupy.training.chosen_alpha import evaluated_alpha, run_folder_of

        path = Path(path)
        if path.is_dir():
            if not (path / "checkpoint.h5").is_file():
                raise KsaeError(f"{path} holds no checkpoint.h5; give a ksae-train run folder or a checkpoint file")
            path = path / "checkpoint.h5"
        ckpt = load_checkpoint(path)
        config = TrainConfig.from_dict(ckpt.config)
        run_dir = run_folder_of(path)
        alpha = evaluated_alpha(run_dir, ckpt.epoch) if run_dir is not None else None
        est = cls(**{parameter_name(field): getattr(config, field) for field in RULES}, device=device, warm_start=True,
                  alpha=alpha)
        if raw_inputs:
            est.input_scale = _dataset_scale(run_dir)
        est._restore(ckpt, resolve_device(device))
        est.preprocess_ = dict(ckpt.preprocess)
        est.run_id_ = ckpt.run_id
        return est

    def _restore(self, ckpt: Checkpoint, backend) -> None:
        D = ckpt.params["W_dh"].shape[0]
        self._trainer = Trainer(TrainConfig.from_dict(ckpt.config), backend, D=D, checkpoint=ckpt)
        self.n_features_in_ = D

    def to_device(self, device: str) -> "KSparseAutoencoder":
        """Move the whole fitted state to ``device`` (``cpu``, ``gpu[:N]``, ``auto``); returns ``self``.

        An unpickled estimator lives on the CPU; this puts it back on a GPU.
        """
        check_is_fitted(self)
        self._restore(self.trainer_.checkpoint(), resolve_device(device))
        self.device = device
        return self

    def __getstate__(self):
        # The trainer holds its backend, and a CuPy backend holds a module (not picklable):
        # pickle the host copy of the training state instead.
        state = dict(super().__getstate__())
        state.pop("_prepared", None)  # prepare()'s rows: a pickle holds the model, not its training data
        if state.get("_trainer") is not None:
            state["_trainer"] = state["_trainer"].checkpoint()
        return state

    def __setstate__(self, state):
        state = dict(state)
        ckpt = state.pop("_trainer", None)
        parent_setstate = getattr(super(), "__setstate__", None)  # scikit-learn's, or none without it
        if parent_setstate is not None:
            parent_setstate(state)
        else:
            self.__dict__.update(state)
        if isinstance(ckpt, Checkpoint):
            self._restore(ckpt, CPU)  # on the CPU; to_device() moves it


def sparse_rows(H_nh: np.ndarray, sparse, kept: int):
    """A chunk of dense codes as ``transform(sparse=...)`` returns them: CSR, or ``(idx_nK, val_nK)`` of the
    ``kept`` columns a row may hold (its non-zero ones first, ascending; then zeros)."""
    if sparse == "topk":
        # a stable sort of "is zero": the non-zero columns first, ascending, then the zero ones
        idx_nK = np.argsort(H_nh == 0, axis=1, kind="stable")[:, :kept].astype(np.int32)
        return idx_nK, np.take_along_axis(H_nh, idx_nK, axis=1)
    from scipy import sparse as scipy_sparse

    return scipy_sparse.csr_matrix(H_nh)


def joined_sparse(chunks: list, sparse):
    """The chunks of :func:`sparse_rows` as one result."""
    if sparse == "topk":
        return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])
    from scipy import sparse as scipy_sparse

    return scipy_sparse.vstack(chunks, format="csr")


def _dataset_scale(run_dir) -> float:
    """The factor a run's built-in dataset multiplies its raw values by; one line where there is none to apply."""
    from ksae_cupy.training.chosen_alpha import dataset_input_scale

    scale = dataset_input_scale(run_dir) if run_dir is not None else None
    if scale is None:
        raise KsaeError(f"raw_inputs=True needs a run folder of a built-in dataset whose only preprocessing is a "
                        f"scale (mnist, fashion-mnist, synthetic); {run_dir or 'this file'} has none: give the rows "
                        f"as load_dataset gives them, and leave raw_inputs out")
    return scale
