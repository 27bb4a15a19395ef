"""k-sparse autoencoders (Makhzani & Frey) on NumPy and CuPy, with hand-written gradients.

The algorithm sits at the top of the package, to be read first:

    model.py      forward, hand-written backward, encoding with alpha*k units (the paper's box)
    sparse_step.py  the same step through the k kept units only (only X W dense); --step
    topk.py       the top-k contract: sort and iterative-threshold selection, gathers, scatters
    optim.py      momentum SGD as in section 4.3.2
    schedules.py  the sparsity schedule (k from k_start down to k over the first half)
    backend.py    NumPy or CuPy on the chosen device
    errors.py     KsaeError, the one error a user sees
    paths.py      checks of the paths a user gives, made before any work
    paths.py      checks of the paths a user gives, made before any work starts

Around it, one folder per job, imports pointing down this list only:

    gpu/          the CUDA launchers of kernels/*.cu (the algorithm's GPU half)
    datasets/     fetch, verify, parse and preprocess MNIST, small NORB, CIFAR-10 patches, user files
    training/     the epoch loop, the estimator, run folders, checkpoints
    evaluation/   logistic regression on the features, figures, coherence and ITI analysis
    supervised/   fine-tuning, layer-wise pretraining, the RBM / dropout / denoising baselines
    parallel/     MPI data parallelism, sharded hidden units, Dask sweeps
    bench/        benchmarks that validate before they time
    cli/          one module per command; nothing imports it
"""
