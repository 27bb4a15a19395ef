"""The bench's own trained model (trained_here, N epochs) then time_epoch, bench thread regime, sparse encoder."""
import json, sys
n = int(sys.argv[1])
from ksae_cupy.backend import resolve_device
from ksae_cupy.bench import train_cpu, trained
backend = resolve_device("cpu")
limit, _ = train_cpu._thread_limit(2)
inputs = train_cpu.mnist_inputs(784)
with backend.use(), limit:
    start = trained.trained_here(backend, inputs[0], inputs[1], 1000, 25, 128, "sort", n, log=lambda *a: None)
    r = train_cpu.time_epoch(backend, 784, 1000, 25, 128, "sort", inputs=inputs, encoders=("sparse",), repeats=6,
                             trained=start, log=lambda *a: None)
    ck = start.checkpoint
print(json.dumps({"trained_here": n, "epoch_s": r["epoch_s"], "steps_s": r["steps_s"], "dead": r["dead_fraction"],
                  "parts": r["parts_s"]}))
