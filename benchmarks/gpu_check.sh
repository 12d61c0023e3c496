#!/usr/bin/env bash
# GPU checks for the lent GPU machine (repo root; torch from the machine's image; runbook: docs/gpu.md). Two stages,
# so that CIFAR-100 (122 MB packed, benchmarks/pack_cifar.py) can arrive in two uploads of under 64 MiB:
#   bash benchmarks/gpu_check.sh check   # carries .whl, .devdata/part0, .devdata/index.json:
#                                        #   step benchmarks (eager vs graphs; SPEED=all adds fast vs reference and
#                                        #   fp32 vs bf16, SPEED=compile graphs with and without torch.compile),
#                                        #   then the CUDA tests
#   bash benchmarks/gpu_check.sh full    # carries .devdata/part1: the full 5-task CIFAR-100 R-DFCIL protocol
#                                        #   (paper schedule) with FULL_TIMEOUT seconds at most; records in
#                                        #   $OUT/full-on; PRECISION (fp32) and GRAPHS (on) choose the engine
#                                        #   switches; if graphs fail, the rest of the budget runs eagerly
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/dev
cp .devdata/part* .devdata/index.json /tmp/dev/ 2>/dev/null
if [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src
if [ "${1:-check}" = "check" ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
  if [ "${SPEED:-graphs}" = all ]; then  # measured already (docs/results.md §3): only on request
    timeout 60 python3 benchmarks/speed.py --device cuda --rounds 10 --steps 20 2>&1 | tee "$OUT/speed-merge.txt"
    timeout 60 python3 benchmarks/speed.py --device cuda --ab precision --rounds 10 --steps 20 2>&1 \
      | tee "$OUT/speed-precision.txt"
    timeout 60 python3 benchmarks/speed.py --device cuda --precision bf16 --channels-last --rounds 10 --steps 20 \
      2>&1 | tee "$OUT/speed-bf16-cl.txt"
  fi
  if [ "${SPEED:-graphs}" = compile ]; then  # compile time (minutes) is untimed but costs device time
    timeout 300 python3 benchmarks/speed.py --device cuda --ab compile --precision bf16 --channels-last --rounds 10 \
      --steps 20 2>&1 | tee "$OUT/speed-compile-bf16-cl.txt"
  fi
  timeout 90 python3 benchmarks/speed.py --device cuda --ab graphs --rounds 10 --steps 20 2>&1 \
    | tee "$OUT/speed-graphs.txt"
  timeout 90 python3 benchmarks/speed.py --device cuda --ab graphs --precision bf16 --channels-last --rounds 10 \
    --steps 20 2>&1 | tee "$OUT/speed-graphs-bf16-cl.txt"
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_engine_modes.py tests/test_cuda.py \
    tests/test_graphs.py -k "not every_graph_safe" 2>&1 | tee "$OUT/tests.txt" | tail -15
else
  python3 benchmarks/pack_cifar.py unpack /tmp/dev /tmp/data || exit 1
  full() {  # $1 seconds at most, $2 cuda_graphs, into $OUT/full-$2
    timeout "$1" python3 -m dfcil train --config configs/cifar100/rdfcil_n5.yaml --data.root /tmp/data \
      --device cuda --engine.precision "${PRECISION:-fp32}" --engine.channels_last true \
      --engine.cuda_graphs "$2" --out "$OUT/full-$2" --no-progress > "$OUT/full-$2.log" 2>&1
    rc=$?
    echo "cuda_graphs $2: exit $rc"
    rm -rf "$OUT/full-$2/checkpoints" "$OUT/full-$2/model.pt" "$OUT/full-$2/.lock"
    grep -v " epoch " "$OUT/full-$2.log" | tail -25
    return $rc
  }
  budget=${FULL_TIMEOUT:-480}
  start=$(date +%s)
  full "$budget" "${GRAPHS:-on}"
  rc=$?
  left=$((budget - $(date +%s) + start))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "${GRAPHS:-on}" = on ] && [ "$left" -gt 60 ]; then
    echo "graphs failed: the rest of the budget ($left s) runs the eager engine"
    full "$left" off
  fi
fi
