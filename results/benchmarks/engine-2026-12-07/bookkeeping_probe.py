"""Trainer.run_epoch on real MNIST (one thread, k = 25, the paper's rate): cProfile of epochs 5 and 6, the
per-epoch bookkeeping's share (metrics and tally) of the epoch."""
import cProfile, pstats, sys, time, io
import numpy as np
from threadpoolctl import threadpool_limits
from ksae_cupy.cpu import numba_kernels
from ksae_cupy.backend import CPU
from ksae_cupy.datasets.registry import DATASETS
from ksae_cupy.training.trainer import TrainConfig, Trainer

numba_kernels.set_threads(1) if hasattr(numba_kernels, "set_threads") else None
with threadpool_limits(1):
    from pathlib import Path; data = DATASETS["mnist"].load(Path("data"))
    X, Xv = data.X_train.astype(np.float32), data.X_valid.astype(np.float32)
    t = Trainer(TrainConfig(k=25, k_start=None, epochs=10, seed=7), CPU, X.shape[1])
    walls = []
    for e in range(6):
        prof = cProfile.Profile() if e >= 4 else None
        start = time.perf_counter()
        if prof: prof.enable()
        r = t.run_epoch(X, Xv)
        if prof: prof.disable()
        walls.append(time.perf_counter() - start)
        if prof:
            s = io.StringIO(); st = pstats.Stats(prof, stream=s)
            rows = {}
            for (f, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
                key = f"{f.split('ksae_cupy/')[-1]}:{name}"
                for want in ("metrics.py:add", "metrics.py:total_variance", "trainer.py:count_step", "epochs.py:add",
                             "trainer.py:_note_kept", "trainer.py:dead_window_fraction", "trainer.py:_dead_fraction",
                             "trainer.py:_code_nonzero", "epochs.py:of", "trainer.py:evaluate_loss", "trainer.py:code_l0",
                             "trainer.py:close_epoch", "trainer.py:_batch_gradients", "trainer.py:one_step", "trainer.py:take_step"):
                    if key.endswith(want): rows[want] = rows.get(want, 0) + ct
            bincount = sum(ct for (f, l, n), (cc, nc, tt, ct, c) in st.stats.items() if "bincount" in n)
            book = sum(rows.get(k, 0) for k in ("trainer.py:count_step", "trainer.py:_code_nonzero", "trainer.py:dead_window_fraction",
                       "trainer.py:_dead_fraction", "metrics.py:total_variance")) + bincount
            print(f"   bookkeeping (count_step, bincount, code_nonzero, dead fractions, spread): {book:.3f} s = "
                  f"{100 * book / walls[-1]:.1f}% of the epoch's wall time")
            print(f"epoch {e+1}: wall {walls[-1]:.3f} s, report.seconds {r.seconds:.3f}, bincount {bincount:.3f}")
            for k, v in sorted(rows.items()): print(f"   {k:40s} {v:.3f} s")
