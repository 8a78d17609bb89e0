#!/bin/bash
# The worked example of docs/experiments.md, "Cost beside accuracy" (run idle, from /work/main)
set -e
W=/tmp/wx2
P=.venv/bin/patchword
t() { local s=$(date +%s.%N); "$@"; echo "TIME $(echo "$(date +%s.%N) - $s" | bc) s: $*" >> $W/times.txt; }
rm -f $W/times.txt
t $P sweep --config demo --seeds 0 --name cost-example output_dir=$W/runs progress=false \
    --variant "seps-paper: train.max_steps=100" \
    --variant "vse: model.name=vse-tiny model.tiny_pretrained=cluttered-64 train.max_steps=100"
t .venv/bin/python benchmarks/official_seps_checkpoint.py --out $W/official
t $P import $W/official/model_best.pth --out $W/runs/imported --family seps \
    --hf-vision $W/official/hf/vit --hf-text $W/official/hf/bert \
    data.root=$W/official/data data.image_root=$W/official/data/images \
    data.dense_train=$W/official/data/train.jsonl data.dense_test=$W/official/data/test.jsonl
t $P eval $W/runs/imported progress=false
RUN=$W/runs/cost-example/seps-paper/seed-0
t $P data export synthetic --split test --out $W/scenes --run $RUN
t $P index build $RUN --images $W/scenes/images --dense $W/scenes/test.jsonl --out $W/scenes.index
cp benchmarks/results/gallery_cpu_1k.json $W/gallery.json  # measured by the first pass (270 s)
t $P report $W/runs/cost-example $W/runs/imported --out $W/report.md --csv $W/report.csv \
    --index $W/scenes.index --gallery $W/gallery.json
echo DONE
