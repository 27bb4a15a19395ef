"""k-sparse autoencoders (Makhzani & Frey) on NumPy and CuPy, with hand-written gradients.

The algorithm sits at the top of the package, to be read first:

    model.py      forward, hand-written backward, encoding with alpha*k units (the paper's box)
    sparse_step.py  the same step through the k kept units only (only X W dense); --step
    packed_step.py  the dense step of a stack of models at once (many runs per launch)
    topk.py       the top-k contract: sort and iterative-threshold selection, gathers, scatters
    momentum_sgd.py  momentum SGD as in section 4.3.2; optimizers.py: the optimizers by name
    schedules.py  the sparsity schedule (k from k_start down to k over the first half)
    backend.py    NumPy or CuPy on the chosen device
    errors.py     KsaeError, the one error a user sees
    paths.py      checks of the paths a user gives, made before any work starts
    metrics.py    FVE, L0 and dead units of a model on a set of rows
    made_with.py  the package version, commit, libraries and device a result was made with

Around it, one folder per job, imports pointing down this list only:

    gpu/          the CUDA launchers of kernels/*.cu (the algorithm's GPU half)
    datasets/     fetch, verify, parse and preprocess MNIST, small NORB, CIFAR-10 patches, user files
    training/     the epoch loop, the estimator, run folders, checkpoints
    evaluation/   logistic regression on the features, figures, coherence and ITI analysis
    supervised/   fine-tuning, layer-wise pretraining, the RBM / dropout / denoising baselines
    parallel/     MPI data parallelism, sharded hidden units, Dask sweeps
    bench/        benchmarks that validate before they time
    cli/          one module per command; nothing imports it

The Python API, importable from here (each loaded on first use, so ``import ksae_cupy``
stays light):

    KSparseAutoencoder   the estimator (training/estimator.py): fit, transform, save, load
    load(path)           a ksae-train run folder, its checkpoint.h5 or a saved model, as an estimator
    load_dataset(spec)   a built-in dataset or your own file, with labels and splits
    Dataset, KsaeError   what load_dataset returns; the one error a user sees
    export(model, path)  a model's weights as safetensors, .npz or a PyTorch state dict (session/export.py)
    __version__          the package's version (setup.cfg's; made_with.py reads it)
"""

# name -> (module, attribute); read by __getattr__ on first use (PEP 562)
_API = {
    "KSparseAutoencoder": ("ksae_cupy.training.estimator", "KSparseAutoencoder"),
    "load_dataset": ("ksae_cupy.datasets", "load_dataset"),
    "Dataset": ("ksae_cupy.datasets.dataset", "Dataset"),
    "KsaeError": ("ksae_cupy.errors", "KsaeError"),
    "export": ("ksae_cupy.session.export", "export"),
}
__all__ = [*_API, "load", "__version__"]


def load(path, device: str = "auto", raw_inputs: bool = False):
    """A :class:`KSparseAutoencoder` from a ``ksae-train`` run folder, its ``checkpoint.h5``, or a file
    ``save`` wrote (see ``KSparseAutoencoder.load``): ``load("runs/quick").transform(X, sparse=True)``
    gives the run's codes, alpha chosen by the package's one rule (:mod:`ksae_cupy.training.chosen_alpha`);
    ``raw_inputs=True`` takes raw values (MNIST's 0..255 pixels) and applies the dataset's scale."""
    from ksae_cupy.training.estimator import KSparseAutoencoder

    return KSparseAutoencoder.load(path, device=device, raw_inputs=raw_inputs)


def __getattr__(name: str):
    if name == "__version__":  # read once, on first use: the version is typed in setup.cfg only
        from ksae_cupy.made_with import package_version

        return package_version()
    if name not in _API:
        raise AttributeError(f"module 'ksae_cupy' has no attribute {name!r}")
    import importlib

    module, attribute = _API[name]
    return getattr(importlib.import_module(module), attribute)


def __dir__():
    return sorted([*globals(), *_API, "__version__"])
