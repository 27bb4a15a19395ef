#!/bin/bash
# One device call (session 2026-11-27 07:14 UTC), three processes side by side on the one GPU, each stopped with
# SIGINT (checkpoint saved) 45 s before the budget's end; everything continues on the CPU afterwards:
#   A: deep k-sparse (Table fn_mnist) at the paper's lengths: layer 1 the 5000-epoch k = 25 CPU run, layer 2
#      resumed at epoch 1461 of 5000 (CPU checkpoint; its codes file carried, xz, so that its SHA-256 is the
#      run's: codes written again on another device differ by float rounding), then 200 x 3 fine-tuning;
#   B: deep k-sparse + F.T. with 20% input dropout from the seed-1 500/500 layers, whose run at --lr-start 1
#      diverged in phase all: --lr-start 0.5 (B05) and 0.25 (B025).
# Run folders live under /tmp/ksae-gpu on both machines (run folders record absolute paths).
set -u
BUDGET=${1:-540}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KSAE_DATA_DIR=$PWD/campaign-out/data
END=$(( $(date +%s) + BUDGET ))
LOG=$OUT/logs; mkdir -p $LOG
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi -L; python3 -c "import cupy,numpy;print('cupy',cupy.__version__,'numpy',numpy.__version__)"; } > $LOG/env.txt 2>&1
tar xf campaign-out/ksae-gpu.tar -C /tmp
xz -dc campaign-out/codes.npy.xz > /tmp/ksae-gpu/fn-deep-ksparse-5000-200/pretrain/ksparse1-codes.npy
sha256sum /tmp/ksae-gpu/fn-deep-ksparse-5000-200/pretrain/ksparse1-codes.npy >> $LOG/env.txt
left() { echo $(( END - $(date +%s) - 45 )); }
deep() {
  timeout -k 30 -s INT $(left) python3 bin/reproduce-finetune --rows deep_ksparse --ksparse1 /tmp/ksae-gpu/mnist-k25-5000 \
    --pretrain-epochs 5000 --epochs 200 --seed 0 --device gpu --data-dir $KSAE_DATA_DIR \
    --out /tmp/ksae-gpu/fn-deep-ksparse-5000-200 > $LOG/deep.log 2>&1
  echo "deep rc $? $(date -u)" >> $LOG/deep.log
}
indrop() {
  lr=$1; name=fn-deep-ksparse-500-200-indrop02-lr$2-seed1
  timeout -k 30 -s INT $(left) python3 -c "from ksae_cupy.cli.finetune import finetune_command; finetune_command()" \
    /tmp/ksae-gpu/seed1/ksparse1 /tmp/ksae-gpu/seed1/ksparse2 --input-dropout 0.2 --lr-start $lr --epochs 200 \
    --seed 1 --device gpu --data-dir $KSAE_DATA_DIR --progress-seconds 30 --run-dir /tmp/ksae-gpu/$name > $LOG/$name.log 2>&1
  echo "indrop rc $? $(date -u)" >> $LOG/$name.log
}
deep & indrop 0.5 05 & indrop 0.25 025 & wait
nvidia-smi >> $LOG/env.txt 2>&1; date -u >> $LOG/env.txt
tar czf - --exclude='*.npy' --exclude=.lock --exclude=mnist-k25-5000 --exclude=seed1 -C /tmp ksae-gpu | split -b 15m - $OUT/ksae-gpu.tgz.
