#!/bin/bash
# deep dropout AE row with both layers pretrained 50 epochs instead of 500 (otherwise the row's commands), one thread
set -e
cd /work/main
export KSAE_DATA_DIR=/root/data
B=/root/runs/deep-dropout-50
[ -f $B/layer1/checkpoint.h5 ] && grep -q '"epoch": 50,' $B/layer1/metrics.jsonl || \
  .venv/bin/ksae-baseline mnist --model dropout-ae --lr 0.01 --weight-decay 0 --epochs 50 --seed 0 --threads 1 --device cpu --data-dir /root/data --run-dir $B/layer1 >> $B/layer1.log 2>&1
[ -f $B/layer1-features.npy ] || .venv/bin/ksae-data codes $B/layer1 $B/layer1-features.npy --data-dir /root/data >> $B/codes.log 2>&1
[ -f $B/layer2/checkpoint.h5 ] && grep -q '"epoch": 50,' $B/layer2/metrics.jsonl || \
  .venv/bin/ksae-baseline $B/layer1-features.npy --model dropout-ae --lr 0.01 --weight-decay 0 --sigma 0.1 --seed 1 --epochs 50 --threads 1 --device cpu --run-dir $B/layer2 >> $B/layer2.log 2>&1
.venv/bin/ksae-finetune $B/layer1 $B/layer2 --epochs 200 --seed 0 --threads 1 --device cpu --data-dir /root/data --run-dir $B/ft >> $B/ft.log 2>&1
