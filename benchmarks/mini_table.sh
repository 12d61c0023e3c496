#!/usr/bin/env bash
# Run every method and R-DFCIL ablation on cifar100-mini, one after the other, skipping finished runs.
#   bash benchmarks/mini_table.sh [CLASS_ORDER_SEED] [DATA_ROOT]
# Run directories: runs/mini-<name>-o<order seed>; then `python benchmarks/mini_report.py` prints the table.
set -uo pipefail
ORDER=${1:-0}
ROOT=${2:-../shared/data}
# every overlay (one per registered method, and R-DFCIL's ablations: configs/make_presets.py), and R-DFCIL itself
names="rdfcil $(cd configs/cifar100-mini && ls *.yaml | sed 's/\.yaml$//' | tr '\n' ' ')"
for name in ${NAMES:-$names}; do
  out=runs/mini-$name-o$ORDER
  [ -f "$out/summary.json" ] && continue
  overlay=()
  [ "$name" != rdfcil ] && overlay=(--config "configs/cifar100-mini/$name.yaml")
  dfcil train --config configs/cifar100-mini.yaml "${overlay[@]}" --data.root "$ROOT" \
    --data.class_order_seed "$ORDER" --out "$out" --no-progress > "runs/mini-$name-o$ORDER.log" 2>&1 \
    || echo "$name failed (see runs/mini-$name-o$ORDER.log)"
done
