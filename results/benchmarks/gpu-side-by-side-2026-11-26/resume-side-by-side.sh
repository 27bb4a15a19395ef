#!/bin/bash
# One device call (session 2026-11-26 07:56): resume the two centred 5000-epoch CPU runs (issue 35) on the GPU side
# by side, each stopped with SIGINT (checkpoint saved) before the budget ends, then ksae-eval what finished.
set -u
BUDGET=${1:-480}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD KSAE_DATA_DIR=$PWD/data
END=$(( $(date +%s) + BUDGET ))
{ date -u; cat gpu-resume/COMMIT; nvidia-smi; python3 -c "import sys,cupy,numpy,h5py;print(sys.version);print('cupy',cupy.__version__,'numpy',numpy.__version__,'h5py',h5py.__version__);cupy.show_config()"; } > $OUT/env.txt 2>&1
one() {
  r=$1
  timeout -k 40 -s INT $(( END - $(date +%s) - 45 )) python3 -c "from ksae_cupy.cli.train import train_command; train_command()" --resume gpu-resume/$r --device gpu > $OUT/$r.train.log 2>&1
  echo "train rc $?" >> $OUT/$r.train.log
  if grep -q '^done:' $OUT/$r.train.log; then
    timeout -s INT $(( END - $(date +%s) )) python3 -c "from ksae_cupy.cli.evaluate import eval_command; eval_command()" gpu-resume/$r --device gpu > $OUT/$r.eval.log 2>&1
    echo "eval rc $?" >> $OUT/$r.eval.log
  fi
}
one k25c & one k40c & wait
tar czf - gpu-resume | split -b 15m - $OUT/gpu-resume.tgz.
date -u >> $OUT/env.txt
