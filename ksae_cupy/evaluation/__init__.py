"""What a trained dictionary is worth: classification on its features, the paper's figures and analysis.

``classifier.py`` (logistic regression, hand-written gradients), ``softmax_kernels.py`` (its sparse
products on the CPU, compiled with Numba), ``trained_run.py`` (a run folder opened, and its rows),
``features.py`` (its alpha*k features), ``selection.py`` (alpha and L2 chosen on validation, test once),
``run_evaluation.py`` and ``eval_report.py`` (ksae-eval's work and what it writes), ``variants.py`` (encoding
variants), ``analysis.py`` (coherence, ITI, Theorem 3.1), ``compare.py`` (OMP and dictionary
learning side by side), ``plots.py`` (filters, activity histograms) and ``run_figures.py`` (ksae-plot's
figures of a run, each made whole).

May import: the algorithm (cpu included), gpu, datasets, training, session.
"""
