#!/bin/bash
# Second call on the still-warm machine: the three runs of call.sh resumed where they stopped (their folders are
# still under /tmp/ksae-gpu there), stopped again with SIGINT 45 s before the budget's end.
set -u
BUDGET=${1:-270}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KSAE_DATA_DIR=$PWD/campaign-out/data
test -d /tmp/ksae-gpu/fn-deep-ksparse-5000-200 || { echo "no /tmp/ksae-gpu: a fresh machine"; exit 3; }
END=$(( $(date +%s) + BUDGET ))
LOG=$OUT/logs; mkdir -p $LOG
left() { echo $(( END - $(date +%s) - 45 )); }
deep() {
  timeout -k 30 -s INT $(left) python3 bin/reproduce-finetune --rows deep_ksparse --ksparse1 /tmp/ksae-gpu/mnist-k25-5000 \
    --pretrain-epochs 5000 --epochs 200 --seed 0 --device gpu --data-dir $KSAE_DATA_DIR \
    --out /tmp/ksae-gpu/fn-deep-ksparse-5000-200 > $LOG/deep2.log 2>&1
  echo "deep rc $? $(date -u)" >> $LOG/deep2.log
}
indrop() {
  name=fn-deep-ksparse-500-200-indrop02-lr$1-seed1
  timeout -k 30 -s INT $(left) python3 -c "from ksae_cupy.cli.finetune import finetune_command; finetune_command()" \
    --resume /tmp/ksae-gpu/$name --device gpu --data-dir $KSAE_DATA_DIR > $LOG/$name-2.log 2>&1
  echo "indrop rc $? $(date -u)" >> $LOG/$name-2.log
}
deep & indrop 05 & indrop 025 & wait
tar czf - --exclude='*.npy' --exclude=.lock --exclude=mnist-k25-5000 --exclude=seed1 -C /tmp ksae-gpu | split -b 15m - $OUT/ksae-gpu.tgz.
