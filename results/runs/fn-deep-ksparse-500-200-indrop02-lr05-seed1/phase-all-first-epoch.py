import numpy as np, sys
from ksae_cupy.supervised.checkpoint import load_finetune_checkpoint
from ksae_cupy.supervised import finetune as ft
from ksae_cupy.datasets import load_dataset
from ksae_cupy.training.threads import set_blas_threads
set_blas_threads(1)
d = load_dataset("mnist", root="/root/data")
path, lr, indrop = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
p = {k: np.asarray(v, dtype=np.float32) for k, v in load_finetune_checkpoint(path + "/checkpoint.h5")["params"].items()}
v = {k: np.zeros_like(a) for k, a in p.items()}
rng = np.random.default_rng(1)
perm = rng.permutation(50000)
X_all, y_all = d.X_train.astype(np.float32), d.y_train
for b in range(390):
    rows = perm[b*128:(b+1)*128]
    X, y = X_all[rows], y_all[rows]
    masks = None if indrop == 0 else [((rng.random(X.shape) >= indrop) / (1 - indrop)).astype(np.float32), None, None]
    loss, g = ft.loss_and_grads(p, X, y, [75, 75], None, "sort", None, masks)
    if b % 20 == 0 or not np.isfinite(loss) or loss > 1:
        print(b, f"loss {loss:.4g}", {k: f"{np.linalg.norm(g[k]):.3g}/{np.linalg.norm(p[k]):.3g}" for k in ("W1_dh", "W2_hh", "W_hc")}, flush=True)
    if not np.isfinite(loss):
        break
    for k in p:
        v[k] = 0.25 * v[k] - lr * g[k]
        p[k] += v[k]
