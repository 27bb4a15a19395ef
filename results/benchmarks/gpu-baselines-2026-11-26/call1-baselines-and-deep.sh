#!/bin/bash
# One device call (session 2026-11-26 11:00): three runs side by side on the one GPU, each stopped with SIGINT
# (checkpoint saved) before the budget ends, then evaluated if finished:
#   the 5000-epoch denoising AE and dropout + denoising AE baselines (issue 34), resumed from their CPU checkpoints;
#   deep k-sparse (Table fn_mnist) from the 5000-epoch k = 25 CPU run as layer 1, layer 2 500 epochs, 200 x 3 F.T.,
#   in /tmp/ksae-deep (the same absolute path here and on the CPU machine: run folders record absolute paths).
set -u
BUDGET=${1:-540}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KSAE_DATA_DIR=$PWD/data
END=$(( $(date +%s) + BUDGET ))
{ date -u; cat gpu-base/COMMIT; nvidia-smi -L; python3 -c "import cupy,numpy;print('cupy',cupy.__version__,'numpy',numpy.__version__)"; } > $OUT/env.txt 2>&1
base() {
  r=$1
  timeout -k 40 -s INT $(( END - $(date +%s) - 50 )) python3 -c "from ksae_cupy.cli.baseline import baseline_command; baseline_command()" --resume gpu-base/$r --epochs 5000 --device gpu --data-dir $PWD/data --progress-seconds 60 >> gpu-base/$r/gpu-train.log 2>&1
  echo "train rc $? $(date -u)" >> gpu-base/$r/gpu-train.log
  if grep -q '^done:' gpu-base/$r/gpu-train.log && [ ! -f gpu-base/$r/eval.json ]; then
    timeout -s INT $(( END - $(date +%s) - 10 )) python3 -c "from ksae_cupy.cli.evaluate import eval_command; eval_command()" gpu-base/$r --device gpu --max-iter 1000 > gpu-base/$r/eval.log 2>&1
    echo "eval rc $?" >> gpu-base/$r/eval.log
  fi
}
deep() {
  mkdir -p /tmp/ksae-deep && cp -r gpu-base/k25-5000 /tmp/ksae-deep/
  timeout -k 40 -s INT $(( END - $(date +%s) - 50 )) python3 bin/reproduce-finetune --rows deep_ksparse --ksparse1 /tmp/ksae-deep/k25-5000 --pretrain-epochs 500 --epochs 200 --device gpu --out /tmp/ksae-deep/fn-deep-ksparse-5000-500-200 --data-dir $PWD/data >> gpu-base/deep.log 2>&1
  echo "deep rc $? $(date -u)" >> gpu-base/deep.log
}
base mnist-denoising-ae-5000 & base mnist-dropout-denoising-ae-5000 & deep & wait
date -u >> $OUT/env.txt
tar czf - --exclude=k25-5000 gpu-base | split -b 15m - $OUT/gpu-base.tgz.

tar czf $OUT/deep.tgz --exclude='*.npy' --exclude=k25-5000 -C /tmp ksae-deep  # 19.5 MB: over the reply's per-file limit, fetched again split in call 1b
