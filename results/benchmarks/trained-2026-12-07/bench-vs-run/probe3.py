"""Bisect: bench_train_step with one piece stubbed out; print the trained epoch."""
import json, sys
skip = sys.argv[1]
from ksae_cupy.backend import resolve_device
from ksae_cupy.bench import train_cpu
backend = resolve_device("cpu")
if skip == "compare":
    train_cpu.compare_encoders = lambda *a, **k: {}
    train_cpu.encoder_density_sweep = lambda *a, **k: {}
if skip == "timeatk":
    real = train_cpu._time_at_k
    def fake(*a, **k):
        if len(a) > 11 or "start" in k:  # the trained step timing: keep it
            return real(*a, **k)
        return {"ms": {"dense": 1, "sparse": 1}, "ratios": {"dense_over_sparse": 1}}
    train_cpu._time_at_k = fake
r = train_cpu.bench_train_step(backend, threads=2, with_torch=False, epoch_ks=(25,), log=lambda *a: None,
                               encoder="sparse", epoch_repeats=5, trained_epochs=10)
t = r["trained_epochs"][0]
print(json.dumps({"skip": skip, "trained_epoch_s": t["epoch_s"], "steps": t["parts_s"]["steps"], "fresh_epoch_s": r["epochs"][0]["epoch_s"]}))
