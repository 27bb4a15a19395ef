#!/bin/bash
# Device call 3 (session 2026-11-26): a second seed pair at k = 40, 500 epochs (the paper's recipe and centred),
# side by side on the one GPU, then ksae-eval; run folders written straight into $OUT so a stop still returns them.
set -u
BUDGET=${1:-150}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KSAE_DATA_DIR=$PWD/data
END=$(( $(date +%s) + BUDGET ))
{ date -u; cat gpu-seeds/COMMIT; nvidia-smi -L; } > $OUT/env.txt 2>&1
one() {
  name=$1; shift
  timeout -k 20 -s INT $(( END - $(date +%s) - 40 )) python3 -c "from ksae_cupy.cli.train import train_command; train_command()" mnist --epochs 500 --device gpu --run-dir $OUT/$name "$@" > $OUT/$name.train.log 2>&1
  echo "train rc $?" >> $OUT/$name.train.log
  if grep -q '^done:' $OUT/$name.train.log; then
    timeout -s INT $(( END - $(date +%s) )) python3 -c "from ksae_cupy.cli.evaluate import eval_command; eval_command()" $OUT/$name --device gpu > $OUT/$name.eval.log 2>&1
    echo "eval rc $?" >> $OUT/$name.eval.log
  fi
}
one k40-500-center-seed1 --k 40 --seed 1 --center-input & one k40-500-paper-seed1 --k 40 --seed 1 & wait
date -u >> $OUT/env.txt
