"""Bench-vs-run gap probe: time_epoch on a run's checkpoint under different thread regimes.
usage: probe.py RUN_DIR REGIME ENCODERS   REGIME: bench (threadpool_limits all APIs) | train (set_blas_threads)
"""
import json, sys, time
from pathlib import Path
run, regime, encoders = Path(sys.argv[1]), sys.argv[2], tuple(sys.argv[3].split(","))
from ksae_cupy.backend import resolve_device
from ksae_cupy.bench import train_cpu, trained
backend = resolve_device("cpu")
if regime == "bench":
    limit, _ = train_cpu._thread_limit(2)
else:
    from ksae_cupy.threads import set_blas_threads
    import contextlib
    print(set_blas_threads(2)[0])
    limit = contextlib.nullcontext()
inputs = train_cpu.mnist_inputs(784)
start = trained.from_run(run, 784, 1000)
with backend.use(), limit:
    r = train_cpu.time_epoch(backend, 784, 1000, 25, 128, "sort", inputs=inputs, encoders=encoders, repeats=6,
                             trained=start, log=lambda *a: None)
out = {"regime": regime, "encoders": encoders, "epoch_s": r["epoch_s"], "steps_s": r["steps_s"], "parts": r["parts_s"],
       "by_encoder": {k: v["epochs_s"] for k, v in r.get("by_encoder", {}).items()}}
print(json.dumps(out))
