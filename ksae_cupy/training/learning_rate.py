"""``lr="auto"``: a learning rate derived from the data, equal to the paper's 0.01 on MNIST.

The loss 0.5 ||x - xhat||^2 sums over the input's dimensions, so its curvature in W, and
with it the largest rate at which momentum SGD stays stable, grows with the data's scale.
Two statistics bound it (measured in docs/lr-auto.md with bin/measure-lr):

* lambda_max, the largest eigenvalue of the second moment E[x x^T]: along the direction
  all units first learn (for images, the mean image) the loss is a quartic whose
  curvature at the fit is 4 lambda_max, and momentum SGD is stable below
  2 (1 + momentum) / (4 lambda_max) = 0.95 / lambda_max -- the measured limit on MNIST and
  Fashion-MNIST (within the sweep's factor sqrt(2));
* E||x||^2, the mean squared norm, which bounds it where the data's energy is spread over
  many directions (synthetic data: there 1 / lambda_max would overshoot).

The auto rate keeps the paper's margin on MNIST below both:

    lr = 0.01 * min(E_MNIST||x||^2 / E||x||^2, lambda_max,MNIST / lambda_max)   (two significant digits)
"""
from __future__ import annotations

import math

import numpy as np

from ksae_cupy.backend import array_module, to_host
from ksae_cupy import paper

# MNIST's 50,000 training images with pixels in [0, 1] (our split of section 4.1), computed
# by the functions below: E||x||^2 and the top eigenvalue of E[x x^T].
MNIST_MEAN_SQUARED_NORM = 87.827
MNIST_TOP_EIGENVALUE = 38.05
# The power iteration's rows (a seeded sample beyond this) and iterations: enough for the
# eigenvalue to three digits on image data, under a second for MNIST on one core.
EIGEN_ROWS, EIGEN_ITERATIONS = 20_000, 30


def mean_squared_norm(X_nd, chunk: int = 8192) -> float:
    """E||x||^2, the mean over rows of each row's squared Euclidean norm (in float64)."""
    return scale_of(X_nd, array_module(X_nd), chunk).mean_squared_norm


def top_eigenvalue(X_nd, rows: int = EIGEN_ROWS, iterations: int = EIGEN_ITERATIONS, seed: int = 0) -> float:
    """The largest eigenvalue of the second moment E[x x^T] (not centred), by power iteration
    on at most ``rows`` rows drawn with ``seed``; deterministic for given data."""
    X = to_host(X_nd)
    rng = np.random.default_rng(seed)
    if X.shape[0] > rows:
        X = X[np.sort(rng.choice(X.shape[0], rows, replace=False))]
    X = X.astype(np.float64)
    v_d = rng.standard_normal(X.shape[1])
    estimate = 0.0
    for _ in range(iterations):
        w_d = X.T @ (X @ v_d) / X.shape[0]
        norm = float(np.linalg.norm(w_d))
        if norm == 0.0:
            return 0.0
        estimate = float(v_d @ w_d) / float(v_d @ v_d)  # the Rayleigh quotient: a lower bound that converges
        v_d = w_d / norm
    return estimate


def auto_learning_rate(X_nd) -> float:
    """The rate ``lr="auto"`` / ``--lr auto`` trains ``X_nd`` with: 0.01 on MNIST, lower on data
    of a larger scale (see the module's docstring), two significant digits."""
    return scale_of(X_nd, array_module(X_nd)).auto_lr()


class DataScale:
    """What the checks before training read of the training rows, measured once where the rows enter, so
    that the checks take these numbers instead of the rows: their count and width, the largest magnitude,
    E||x||^2, and the top eigenvalue of E[x x^T] (a power iteration, about a second on MNIST, made on first
    use: only ``lr="auto"`` and the advice of a refused fixed rate need it; until then the rows are kept
    for it, by reference)."""

    def __init__(self, rows: int, dim: int, peak: float, mean_squared_norm: float, top_eigenvalue):
        self.rows, self.dim, self.peak, self.mean_squared_norm = rows, dim, peak, mean_squared_norm
        self._top_eigenvalue = top_eigenvalue  # a number, or the function that computes it

    @property
    def top_eigenvalue(self) -> float:
        if callable(self._top_eigenvalue):
            self._top_eigenvalue = self._top_eigenvalue()
        return self._top_eigenvalue

    def auto_lr(self) -> float:
        """The rate ``lr="auto"`` gives these rows (:func:`auto_learning_rate`)."""
        msq = self.mean_squared_norm
        if msq <= 0 or self.top_eigenvalue <= 0:
            return paper.LR  # all-zero data: any rate is stable; keep the paper's
        ratio = min(MNIST_MEAN_SQUARED_NORM / msq, MNIST_TOP_EIGENVALUE / self.top_eigenvalue)
        return round_significant(paper.LR * ratio, 2)


def scale_of(X_nd, xp, chunk: int = 8192) -> DataScale:
    """The :class:`DataScale` of the rows ``X_nd``, of array module ``xp`` (NumPy, or CuPy for rows on a device,
    measured there; the caller that checked the rows knows which): one pass, ``chunk`` rows at a time in float64,
    for the largest magnitude and E||x||^2 (each row's squared norm, summed in row order)."""
    peak, total = 0.0, 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # data too large to train is check_data_scale's to word
        for start in range(0, X_nd.shape[0], chunk):
            rows = X_nd[start:start + chunk].astype(np.float64)
            if rows.size:
                peak = max(peak, float(xp.abs(rows).max()))
            total += float(xp.vdot(rows, rows))
    return DataScale(X_nd.shape[0], X_nd.shape[1], peak, total / max(X_nd.shape[0], 1), lambda: top_eigenvalue(X_nd))


def round_significant(value: float, digits: int) -> float:
    exponent = math.floor(math.log10(abs(value)))
    return round(value, digits - 1 - exponent)


def smallest_moving_rate(W, dW) -> float | None:
    """The smallest rate ``lr`` at which one step ``lr * dW`` changes an entry of ``W`` in its own
    dtype (rounding to nearest: ``|lr dW| > spacing(W) / 2``); None when ``dW`` is zero everywhere.
    Below it a step leaves every weight bit-identical: in float32 ``0.01 + 1e-12 == 0.01``."""
    W, dW = to_host(W), np.abs(to_host(dW).astype(np.float64))
    moving = dW > 0
    if not moving.any():
        return None
    half_spacing = np.spacing(np.abs(W)).astype(np.float64) / 2
    return float((half_spacing[moving] / dW[moving]).min())


def check_rate_moves_weights(trainer, X_nd, flag: str = "lr") -> None:
    """Refuse, before training, a rate whose first step on ``X_nd``'s first batch changes no weight
    of ``trainer``'s fresh model (every epoch would leave the weights bit-identical), naming the
    smallest rate that moves one. Data whose gradient is zero or not finite is left to training."""
    from ksae_cupy import model
    from ksae_cupy.errors import KsaeError

    config = trainer.config
    with trainer.backend.use(), np.errstate(all="ignore"):
        batch_nd = trainer.backend.asarray(X_nd[:config.batch_size], dtype=trainer.dtype)
        # forward and backward as model.loss_and_grads does (called apart: tests count that one's calls)
        Xhat_nd, cache = model.forward(trainer.params, batch_nd, trainer.current_k(), config.topk, config.activation)
        loss, R_nd = model.reconstruction_loss(Xhat_nd, batch_nd)
        grads = model.backward(trainer.params, R_nd, cache)
        if not math.isfinite(loss) or not bool(trainer.backend.xp.isfinite(grads["W_dh"]).all()):
            return
        smallest = smallest_moving_rate(trainer.params["W_dh"], grads["W_dh"])
    if smallest is not None and config.lr <= smallest:
        moving = float(f"{smallest * 1.05:.2g}")  # up, past the rounding of lr and of the product
        raise KsaeError(f"{flag} {config.lr} is not allowed for this data: in {config.dtype} a step at that rate "
                        f"is below the rounding of every weight, so training would leave them bit-identical; the "
                        f"smallest rate that moves a weight here is about {moving:g}")


def check_data_varies(X_nd, xp, name: str = "X", chunk: int = 8192, centred_by: str | None = None) -> None:
    """Refuse rows that are all the same (constant or all-zero data): the model learns to output that one
    row, its loss falls to 0, and the run (or the rate derived "for this data") says nothing of any other
    data. One pass, ``chunk`` rows at a time; a single row is left alone (``partial_fit`` may see one).
    ``centred_by``: the option that centred the rows (their values are then the data's minus its mean)."""
    from ksae_cupy.errors import KsaeError

    if X_nd.shape[0] < 2:
        return
    first = X_nd[:1]
    for start in range(0, X_nd.shape[0], chunk):
        if bool(xp.any(X_nd[start:start + chunk] != first)):
            return
    values = np.unique(np.asarray(first.get() if hasattr(first, "get") else first))
    shown = f"every value {values[0]:g}" if values.size == 1 else f"{values.size} distinct values, the same in each row"
    if centred_by is not None:  # the rows seen here are centred: their zeros are the mean's doing, not the data's
        shown = f"identical rows before {centred_by} subtracted their mean, which leaves every value 0"
    raise KsaeError(f"{name} has no variance: its {X_nd.shape[0]} rows are all the same ({shown}); a model trained on "
                    f"it only learns that one row and its loss of 0 says nothing; give data whose rows differ")


def check_data_scale(scale: DataScale, config, flag: str = "lr") -> None:
    """Refuse, before training, data whose scale (:class:`DataScale`) makes training meaningless, naming
    the data (not the rate) as the cause, on any dtype (integers are converted to float first):

    * values so large that one example's squared error, summed over its D features, overflows
      the model's dtype (``1e30`` in float32): the loss would be infinite at the first step;
    * a fixed rate (not ``auto``) above the stability limit of momentum SGD at this scale:
      lambda_max >= E||x||^2 / D (the largest eigenvalue is at least the mean one), and momentum
      SGD diverges above (1 + momentum) / (2 lambda_max) (see the module's docstring), so
      ``lr > (1 + momentum) D / (2 E||x||^2)`` diverges: 8-bit pixels (0..255) at the paper's 0.01.
    """
    from ksae_cupy.errors import KsaeError

    D, peak = scale.dim, scale.peak
    with np.errstate(over="ignore"):
        largest = float(np.finfo(config.dtype).max)
        if peak * peak * D > largest / 4:  # 4: room for the reconstruction's own error
            raise KsaeError(f"X's values reach {peak:.3g}: in {config.dtype} one example's squared error, summed over "
                            f"its {D} features, would overflow (its largest number is {largest:.3g}); scale X down, "
                            f"e.g. to [0, 1] (X / {peak:.3g})")
    if config.lr_auto or isinstance(config.lr, str):
        return
    msq = scale.mean_squared_norm
    if msq <= 0:
        return
    limit = (1 + config.momentum) * D / (2 * msq)
    if config.lr > limit:
        command_line = flag.startswith("--")
        auto = f"{flag} auto" if command_line else f"{flag}='auto'"
        pixels = "divide by 255" if command_line else "divide by 255, or input_scale=1/255"
        raise KsaeError(f"{flag} {config.lr} is above the rate at which momentum SGD can train this data: X's mean "
                        f"squared norm is {msq:.4g} over {D} features, and above (1 + momentum) D / (2 E||x||^2) = "
                        f"{limit:.3g} it diverges; use a smaller rate or {auto} ({scale.auto_lr()} for this "
                        f"data), or scale X down (8-bit pixels: {pixels})")
