#!/usr/bin/env bash
# GPU checks for the lent GPU machine (one call, repo root, torch preinstalled there):
#   bash benchmarks/gpu_check.sh [full]
# 1. installs the pure-Python dependencies carried as wheels in .whl/ (pydantic and friends),
# 2. unpacks CIFAR-100 carried in .devdata/ (benchmarks/pack_cifar.py) into /tmp/data,
# 3. runs the CUDA tests and the fast-vs-reference and fp32-vs-bf16 step benchmarks,
# 4. with "full": the full 5-task CIFAR-100 R-DFCIL protocol (paper schedule), records in $OUT/full.
# Everything it prints is also written under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD/src
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
python3 benchmarks/pack_cifar.py unpack .devdata /tmp/data || exit 1
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_cuda.py tests/test_engine_modes.py 2>&1 \
  | tee "$OUT/tests.txt" | tail -5
for ab in merge precision; do
  timeout 120 python3 benchmarks/speed.py --device cuda --ab "$ab" --rounds 10 --steps 20 2>&1 | tee "$OUT/speed-$ab.txt"
done
if [ "${1:-}" = "full" ]; then
  timeout "${FULL_TIMEOUT:-420}" python3 -m dfcil train --config configs/cifar100/rdfcil_n5.yaml --data.root /tmp/data \
    --device cuda --engine.precision bf16 --engine.channels_last true --out "$OUT/full" --no-progress \
    2>&1 | grep -v " epoch " | tail -20
  rm -rf "$OUT/full/checkpoints" "$OUT/full/model.pt"
fi
