#!/bin/bash
# Third call (a fresh machine): only the deep k-sparse run (layer 2 done, fine-tuning in phase softmax) resumed.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KSAE_DATA_DIR=$PWD/campaign-out/data
END=$(( $(date +%s) + ${1:-200} ))
tar xf campaign-out/deep.tar -C /tmp
timeout -k 20 -s INT $(( END - $(date +%s) - 25 )) python3 bin/reproduce-finetune --rows deep_ksparse --ksparse1 /tmp/ksae-gpu/mnist-k25-5000 \
  --pretrain-epochs 5000 --epochs 200 --seed 0 --device gpu --data-dir $KSAE_DATA_DIR \
  --out /tmp/ksae-gpu/fn-deep-ksparse-5000-200 > $OUT/deep3.log 2>&1
echo "deep rc $? $(date -u)" >> $OUT/deep3.log
tar czf - --exclude='*.npy' --exclude=.lock -C /tmp/ksae-gpu fn-deep-ksparse-5000-200/finetune | split -b 15m - $OUT/ft.tgz.
