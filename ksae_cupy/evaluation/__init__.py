"""What a trained dictionary is worth: classification on its features, the paper's figures and analysis.

``classifier.py`` (logistic regression, hand-written gradients), ``softmax_kernels.py`` (its sparse
products on the CPU, compiled with Numba), ``features.py`` (alpha*k
features of a run, alpha and L2 chosen on validation, test once), ``variants.py`` (encoding
variants), ``analysis.py`` (coherence, ITI, Theorem 3.1), ``compare.py`` (OMP and dictionary
learning side by side), ``plots.py`` (filters, activity histograms).

May import: the algorithm (cpu included), gpu, datasets, training, session.
"""
