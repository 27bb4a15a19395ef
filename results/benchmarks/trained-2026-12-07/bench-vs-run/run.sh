#!/bin/bash
# bench-vs-run gap at two threads; quiet cores required. Run with the package installed (its venv active),
# KSAE_DATA_DIR holding MNIST, and GAP_DIR a scratch folder outside the clone (default /tmp/ksae-gap).
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
G=${GAP_DIR:-/tmp/ksae-gap}; rm -rf $G; mkdir -p $G
export GAP_DIR=$G
ksae-train mnist --k 25 --epochs 16 --threads 2 --run-dir $G/real --quiet
for rep in 1 2; do
  cp -r $G/real $G/resume$rep
  ksae-train --resume $G/resume$rep --epochs 22 --threads 2 --quiet
done
for rep in 1 2; do
  for cfg in "bench sparse,dense" "bench sparse" "train sparse" "train sparse,dense"; do
    python $HERE/probe.py $G/real $cfg | tail -1 >> $G/probe.jsonl
  done
done
cp -r $G/real $G/resume3; ksae-train --resume $G/resume3 --epochs 22 --threads 2 --quiet
python - <<'PY'
import json, statistics
import os; G=os.environ["GAP_DIR"]
for rep in (1,2,3):
    lines=[json.loads(l) for l in open(f"{G}/resume{rep}/metrics.jsonl")]
    ep=[l for l in lines if l.get("epoch",0)>16]
    w=[l["seconds"]+l.get("parts",{}).get("validation",0) for l in ep]
    print("real resume", rep, "epochs", [l["epoch"] for l in ep][:1], "with-validation median", round(statistics.median(w),3),
          "steps median", round(statistics.median(l["parts"]["steps"]+l["parts"]["updates"] for l in ep),3))
for l in open(f"{G}/probe.jsonl"):
    d=json.loads(l); print(d["regime"], d["encoders"], d["epoch_s"], d["steps_s"], d["by_encoder"])
PY
