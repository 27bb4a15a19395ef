"""Figures of the paper: filter grids (W's columns as images) and hidden-activity histograms.

matplotlib is an optional extra (``pip install ksae-cupy[plot]``) and is imported inside
the functions that draw, never at module load; the mosaic itself is plain NumPy. Figures
are drawn on an Agg canvas without pyplot, so nothing global (backends, open figures)
is touched and the PNG's pixel size is exactly what is asked for.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ksae_cupy.backend import to_host
from ksae_cupy.errors import KsaeError, OptionError, literal

LAYOUTS = ("hwc", "chw")
# The largest filter image written: 100 megapixels (past this, an image library refuses to open it
# as a possible "decompression bomb", and the float mosaic alone takes gigabytes).
MAX_PIXELS = 100_000_000


def matplotlib_config_dir() -> None:
    """Give matplotlib a writable folder for its settings and font cache when its own is not (a read-only or
    missing HOME): without one it prints two warnings and builds its font cache in a temporary folder anyway.
    Nothing changes where ``MPLCONFIGDIR`` is set, matplotlib is loaded, or its folder can be made."""
    import os
    import sys

    if "MPLCONFIGDIR" in os.environ or "matplotlib" in sys.modules:
        return
    from ksae_cupy.paths import nearest_existing, writable

    home = os.path.expanduser("~")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")) / "matplotlib"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")) / "matplotlib"
    if all(nearest_existing(folder).is_dir() and writable(nearest_existing(folder)) for folder in (config, cache)):
        return
    import atexit
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="ksae-matplotlib-")
    atexit.register(shutil.rmtree, folder, True)
    os.environ["MPLCONFIGDIR"] = folder


def require_matplotlib():
    """Import matplotlib or fail with the install hint."""
    matplotlib_config_dir()
    try:
        import matplotlib
    except ImportError:
        raise KsaeError("figures need matplotlib: pip install ksae-cupy[plot]") from None
    return matplotlib


def parse_image_shape(text: str | None) -> tuple[int, int] | None:
    """``"28x28"`` -> ``(28, 28)`` (``image_shape``); None stays None (the square default)."""
    if text is None:
        return None
    try:
        h, w = (int(p) for p in text.lower().split("x"))
    except ValueError:
        raise OptionError("image_shape", f"{{name}} {literal(repr(text))}: use HxW, e.g. 28x28") from None
    if h < 1 or w < 1:
        raise OptionError("image_shape", f"{{name}} {literal(repr(text))}: sides must be positive")
    return h, w


def filter_shape(D: int, image_shape=None, channels: int = 1) -> tuple[int, int]:
    """``(h, w)`` of one filter: ``image_shape`` if given, else the square ``sqrt(D / channels)``."""
    if channels not in (1, 3):
        raise KsaeError(f"channels={channels} is not allowed; use 1 (grey) or 3 (RGB)")
    if image_shape is not None:
        h, w = (int(s) for s in image_shape)
        if h * w * channels != D:
            raise KsaeError(f"filters of {D} values cannot be shown as {h}x{w}x{channels} images")
        return h, w
    side = math.isqrt(D // channels)
    if side * side * channels != D:
        raise OptionError("image_shape", f"filters of {D} values are not square images with {channels} channel(s); "
                                         "give the image shape, e.g. {name} 28x28")
    return side, side


def filters_drawn(H: int, n_filters: int | None) -> int:
    """How many of ``H`` filters a grid of the first ``n_filters`` (None: all) draws."""
    n = H if n_filters is None else min(int(n_filters), H)
    if n < 1:
        raise KsaeError(f"n_filters={n_filters} is not allowed; use at least 1")
    return n


def filter_mosaic(W_dh, image_shape=None, channels: int = 1, layout: str = "hwc", n_filters: int | None = None,
                  cols: int | None = None, pad: int = 1):
    """Tile the columns of ``W_dh`` as images: a float array in [0, 1], (rows, cols) or (rows, cols, 3).

    Each filter is scaled to [0, 1] on its own (min to max), as in the paper's figures;
    ``layout`` says how the D values of a colour filter are ordered (``hwc`` or ``chw``).
    Grid cells are separated by ``pad`` pixels of white.
    """
    W_dh = to_host(W_dh).astype(np.float64)
    D, H = W_dh.shape
    if layout not in LAYOUTS:
        raise KsaeError(f"layout={layout!r} is not allowed; use one of {', '.join(LAYOUTS)}")
    h, w = filter_shape(D, image_shape, channels)
    n = filters_drawn(H, n_filters)
    cols = int(cols) if cols else math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    F_nd = W_dh[:, :n].T
    lo_n, hi_n = F_nd.min(axis=1, keepdims=True), F_nd.max(axis=1, keepdims=True)
    F_nd = (F_nd - lo_n) / np.where(hi_n > lo_n, hi_n - lo_n, 1)  # a constant filter shows as black
    if channels == 1:
        tiles = F_nd.reshape(n, h, w, 1)
    elif layout == "hwc":
        tiles = F_nd.reshape(n, h, w, channels)
    else:
        tiles = F_nd.reshape(n, channels, h, w).transpose(0, 2, 3, 1)
    mosaic = np.ones((rows * (h + pad) + pad, cols * (w + pad) + pad, channels))
    for i in range(n):
        r, c = divmod(i, cols)
        top, left = pad + r * (h + pad), pad + c * (w + pad)
        mosaic[top:top + h, left:left + w] = tiles[i]
    return mosaic[:, :, 0] if channels == 1 else mosaic


def image_formats() -> list[str]:
    """The file suffixes matplotlib can write (png, pdf, svg, jpg, ...)."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def check_image_output(path, flag: str = "-o", runs=(), overwrite: bool = True) -> None:
    """Before any work: ``path`` can be written and names a format matplotlib writes; it is no file of
    ``runs`` and, without ``overwrite``, no existing file (:func:`~ksae_cupy.session.outputs.check_output`)."""
    from ksae_cupy.session.outputs import check_output

    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in image_formats():
        raise KsaeError(f"{flag} {path}: unknown image format {suffix or '(no suffix)'!r}; "
                        f"use one of {', '.join(image_formats())}")
    check_output(path, flag, runs=runs, overwrite=overwrite)


def save_filter_grid(W_dh, path, image_shape=None, channels: int = 1, layout: str = "hwc",
                     n_filters: int | None = None, cols: int | None = None, scale: int = 2) -> tuple[int, int]:
    """Write the filter mosaic as a PNG, each pixel repeated ``scale`` times; returns (width, height)."""
    require_matplotlib()
    from matplotlib import image as mpimg

    if scale < 1:
        raise KsaeError(f"scale={scale} is not allowed; use an integer >= 1")
    if cols is not None and cols < 1:
        raise KsaeError(f"cols={cols} is not allowed; use at least 1 filter per row")
    mosaic = filter_mosaic(W_dh, image_shape, channels, layout, n_filters, cols)
    height, width = mosaic.shape[0] * scale, mosaic.shape[1] * scale
    if height * width > MAX_PIXELS:  # checked before np.repeat allocates it
        raise KsaeError(f"scale={scale} is not allowed here: the image would be {width} x {height} pixels; use a "
                        f"scale of at most {max(1, int((MAX_PIXELS / (mosaic.shape[0] * mosaic.shape[1])) ** 0.5))}")
    mosaic = np.repeat(np.repeat(mosaic, scale, axis=0), scale, axis=1)
    mpimg.imsave(str(path), mosaic, cmap="gray", vmin=0.0, vmax=1.0)
    return mosaic.shape[1], mosaic.shape[0]


def save_activity_histograms(activities: dict, path, bins: int = 100, size=(800, 500), dpi: int = 100,
                             title: str = "Hidden unit activities") -> tuple[int, int]:
    """Overlaid histograms of hidden activities, one per labelled run (the paper's histograms).

    ``activities`` maps a label (e.g. ``"k=70"``) to an array of encoded activities (all
    units of all rows, zeros included). Counts are normalised per run and drawn on a log
    scale; the legend gives each run's fraction of exact zeros. Returns (width, height).
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not activities:
        raise KsaeError("no runs to draw a histogram of")
    values = {label: to_host(a).ravel().astype(np.float64) for label, a in activities.items()}
    lo = min(v.min() for v in values.values())
    hi = max(v.max() for v in values.values())
    edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, v in values.items():
        zeros = float(np.mean(v == 0))
        ax.hist(v, bins=edges, histtype="step", weights=np.full(v.size, 1 / v.size), linewidth=1.5,
                label=f"{label} ({100 * zeros:.1f}% exactly zero)")
    ax.set_yscale("log")
    ax.set_xlabel("activity")
    ax.set_ylabel("fraction of activities")
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=dpi)  # the format follows the suffix (see check_image_output)
    return size[0], size[1]


def save_training_curves(metrics: list[dict], path, title: str = "", size=(900, 500), dpi: int = 100) -> tuple[int, int]:
    """:func:`training_curves_figure` written to ``path``; returns (width, height)."""
    fig = training_curves_figure(metrics, title, size, dpi)
    fig.savefig(str(path), dpi=dpi)
    return size[0], size[1]


def training_curves_figure(metrics: list[dict], title: str = "", size=(900, 500), dpi: int = 100):
    """Training and validation loss (log scale, left axis) and k (right axis) over epochs, from a
    run's ``metrics.jsonl`` records; below them the fraction of variance explained (training and validation),
    then the dead units: the fraction no example kept during
    each epoch, and (where logged) the fraction kept in none of the last ``dead_window`` examples at
    its end. Returns the matplotlib figure."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not metrics:
        raise KsaeError("the run has no epochs logged in metrics.jsonl yet; nothing to draw")
    epochs = [m["epoch"] for m in metrics]
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3, 1, height_ratios=(3, 1, 1))
    ax = fig.add_subplot(grid[0])
    ax.plot(epochs, [m["train_loss"] for m in metrics], label="training loss", linewidth=1.2)
    valid = [(m["epoch"], m["valid_loss"]) for m in metrics if m.get("valid_loss") is not None]
    if valid:
        ax.plot(*zip(*valid), label="validation loss", linewidth=1.2)
    ax.set_yscale("log")
    ax.set_ylabel("0.5 ||x - xhat||^2 per example")
    k_axis = ax.twinx()
    k_axis.plot(epochs, [m["k"] for m in metrics], color="grey", linestyle="--", linewidth=1, label="k")
    k_axis.set_ylabel("k (units kept in training)")
    k_axis.set_ylim(bottom=0)
    lines, labels = ax.get_legend_handles_labels()
    more_lines, more_labels = k_axis.get_legend_handles_labels()
    ax.legend(lines + more_lines, labels + more_labels, fontsize="small", loc="upper right")
    ax.set_title(title or f"{len(epochs)} epochs")
    fve_ax = fig.add_subplot(grid[1], sharex=ax)
    for key, label in (("fve", "training FVE"), ("valid_fve", "validation FVE")):
        points = [(m["epoch"], m[key]) for m in metrics if m.get(key) is not None]  # runs before FVE: none
        if points:
            fve_ax.plot(*zip(*points), linewidth=1, label=label)
    fve_ax.set_ylabel("FVE")
    if fve_ax.get_lines():
        fve_ax.legend(fontsize="small", loc="lower right")
    dead_ax = fig.add_subplot(grid[2], sharex=ax)
    for key, label in (("dead_fraction", "dead over the epoch"),
                       ("dead_window_fraction", "dead over the last dead_window examples")):
        points = [(m["epoch"], 100 * m[key]) for m in metrics if m.get(key) is not None]  # epochs that logged it
        if points:
            dead_ax.plot(*zip(*points), linewidth=1, label=label)
    dead_ax.set_ylabel("dead units (%)")
    dead_ax.set_ylim(bottom=0)
    dead_ax.set_xlabel("epoch")
    if dead_ax.get_lines():
        dead_ax.legend(fontsize="small", loc="upper right")
    fig.tight_layout()
    return fig


def save_firing_histogram(counts_h, rows: int, path, title: str = "", bins: int = 50, size=(800, 500),
                          dpi: int = 100) -> tuple[int, int]:
    """The field's first dashboard plot: a histogram (density) of log10 of each unit's firing frequency, the
    fraction of the ``rows`` training rows whose k-code holds it non-zero (``counts_h``); the dead units (count 0,
    no logarithm) are named in the legend. Returns (width, height)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts_h = np.asarray(counts_h)
    live = counts_h[counts_h > 0]
    fig = Figure(figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    n_dead = int((counts_h == 0).sum())
    label = f"{live.size} live units; {n_dead} dead (firing on no training row)"
    if live.size:
        ax.hist(np.log10(live / rows), bins=bins, density=True, histtype="stepfilled", alpha=0.7, label=label)
    else:
        ax.plot([], [], label=label)
    ax.set_xlabel(f"log10 firing frequency (fraction of the {rows:,} training rows whose k-code holds the unit)")
    ax.set_ylabel("density")
    ax.set_title(title or "Firing frequencies")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), dpi=dpi)
    return size[0], size[1]


def check_training_records(metrics: list[dict], path) -> None:
    """Every record names its epoch, training loss and k, as ksae-train writes them; a fine-tuning
    run's log (phases, validation errors) or an edited file is one line, not a ``KeyError``."""
    for number, record in enumerate(metrics, 1):
        if "phase" in record:
            raise KsaeError(f"{path} is a ksae-finetune run's log (phases and validation errors); ksae-plot curves "
                            f"draws the runs of ksae-train")
        missing = [key for key in ("epoch", "train_loss", "k") if not isinstance(record.get(key), (int, float))]
        if missing:
            raise KsaeError(f"{path}: record {number} has no {', '.join(missing)}; it is not what ksae-train logs "
                            f"(the file was edited or comes from elsewhere)")
