"""Layer-1 alpha*k-sparse codes of MNIST's 50,000 training images, for layer-2 pretraining (section 4.6)."""
import sys
import numpy as np
import ksae_cupy
run, out, alpha = sys.argv[1], sys.argv[2], float(sys.argv[3])
data = ksae_cupy.load_dataset("mnist")
ae = ksae_cupy.KSparseAutoencoder.load(f"{run}/checkpoint.h5", device="cpu")
codes = ae.transform(data.X_train.astype(np.float32), alpha=alpha).astype(np.float32)
print("codes", codes.shape, "nonzeros per row", (codes != 0).sum(1).mean(), "mean sq norm", (codes**2).sum(1).mean())
np.save(out, codes)
