#!/usr/bin/env bash
# GPU checks for the lent GPU machine (repo root; torch from the machine's image; runbook: docs/gpu.md). Calls back
# to back while the machine is warm (files under /tmp stay between them); CIFAR-100 (122 MB packed,
# benchmarks/pack_cifar.py) arrives in two uploads of under 64 MiB, and one call runs 10 minutes at most, so the
# full protocol (11.5 minutes on an H200, docs/results.md §3.1) takes a `full` and a `resume` call:
#   bash benchmarks/gpu_check.sh prep    # carries .whl, .devdata/part0, .devdata/index.json: wheels, GPU name;
#                                        #   PROFILE=1 adds the channels_last A/B of graphed steps and a kernel profile
#   bash benchmarks/gpu_check.sh full    # carries .devdata/part1: the full 5-task CIFAR-100 R-DFCIL protocol
#                                        #   (paper schedule) for FULL_TIMEOUT seconds at most in /tmp/runs/full-on,
#                                        #   copied to $OUT/full-on with its newest checkpoint; PRECISION (fp32) and
#                                        #   GRAPHS (on) choose the engine switches (GRAPHS=off: full-off throughout),
#                                        #   COMPILE=default adds engine.compile (full-on-compile), ORDER=1 or 2
#                                        #   runs another class order (full-on-order1); give resume the same
#   bash benchmarks/gpu_check.sh resume  # carries nothing new: continues /tmp/runs/full-on for RESUME_TIMEOUT seconds
#                                        #   (on a fresh machine after prep: carries .devdata/part1 and the run
#                                        #   directory brought back earlier, copied to .devdata/full-on)
#   bash benchmarks/gpu_check.sh speed   # eager vs graphed steps (fp32; bf16 + channels_last)
#   bash benchmarks/gpu_check.sh tests   # the CUDA tests; SPEED=all adds the older merge and precision A/Bs,
#                                        #   SPEED=compile graphs with and without engine.compile,
#                                        #   SPEED=compile-step with and without whole steps compiled
set -uo pipefail
export PYTHONUNBUFFERED=1
case "${1:-}" in prep | speed | full | resume | tests) ;; *)
  echo "usage: bash benchmarks/gpu_check.sh prep|full|resume|speed|tests (docs/gpu.md)" >&2
  exit 2
  ;;
esac
OUT=${OUT:-/tmp/out}
ORDER=${ORDER:-0}  # the class order (data.class_order_seed); the paper averages orders 0, 1 and 2
RUN=/tmp/runs/full-${GRAPHS:-on}${COMPILE:+-compile}$([ "$ORDER" = 0 ] || echo "-order$ORDER")
mkdir -p "$OUT" /tmp/dev /tmp/runs
cp .devdata/part* .devdata/index.json /tmp/dev/ 2>/dev/null
if [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src

bring_back() {  # the run's records and newest checkpoint (a later lease can resume it), not the weights
  local to=$OUT/${RUN##*/}
  mkdir -p "$to/checkpoints"
  cp "$RUN"/{config.yaml,meta.json,metrics.jsonl,run.log,summary.json} "$to/" 2>/dev/null
  cp "$RUN/checkpoints/last.pt" "$to/checkpoints/" 2>/dev/null
  grep -v " epoch " "$RUN/run.log" | tail -25
}

speed() {  # $1 seconds at most, the rest speed.py's arguments, into $OUT/speed-$2.txt
  local limit=$1 name=$2
  shift 2
  timeout "$limit" python3 benchmarks/speed.py --device cuda --rounds 10 --steps 20 "$@" 2>&1 | tee "$OUT/speed-$name.txt"
}

case "${1:-}" in
prep)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(), 'register_generator_state:',
    hasattr(torch.cuda.CUDAGraph, 'register_generator_state'))" | tee -a "$OUT/gpu.txt"
  if [ "${PROFILE:-0}" = 1 ]; then  # where a graphed step's time goes (about a minute)
    speed 90 memory-graphs --ab memory --graphs --phases task0,inversion,rrl,chr --profile 10
    speed 60 memory-graphs-bf16 --ab memory --graphs --precision bf16 --phases task0,rrl
  fi
  ;;
speed)
  speed 90 graphs --ab graphs
  speed 90 graphs-bf16-cl --ab graphs --precision bf16 --channels-last
  ;;
full)
  [ -f /tmp/dev/part0 ] || { echo "no /tmp/dev/part0: the machine went cold; run prep first (docs/gpu.md)"; exit 3; }
  python3 benchmarks/pack_cifar.py unpack /tmp/dev /tmp/data || exit 1
  rm -rf "$RUN"
  # --epoch_checkpoint_interval_s 60: a runtime key (results unchanged); epoch-end checkpoints cost ~22 ms each
  timeout "${FULL_TIMEOUT:-540}" python3 -m dfcil train --config configs/cifar100/rdfcil_n5.yaml --data.root /tmp/data \
    --data.class_order_seed "$ORDER" --device cuda --engine.precision "${PRECISION:-fp32}" --engine.channels_last true \
    --engine.cuda_graphs "${GRAPHS:-on}" --engine.compile "${COMPILE:-none}" --epoch_checkpoint_interval_s 60 --out "$RUN" --no-progress \
    > "$OUT/full.log" 2>&1
  echo "full: exit $? (124: stopped by the timeout, checkpoint written; continue with resume)"
  bring_back
  ;;
resume)
  if [ ! -d "$RUN" ] && [ -d ".devdata/${RUN##*/}" ]; then  # a fresh machine: the run directory brought back
    cp -r ".devdata/${RUN##*/}" "$RUN"
  fi
  if [ ! -d /tmp/data/cifar100 ]; then  # a fresh machine: prep brought part0, this call part1
    python3 benchmarks/pack_cifar.py unpack /tmp/dev /tmp/data \
      || { echo "no data: run prep (part0) first, then resume carrying .devdata/part1 (docs/gpu.md)"; exit 3; }
  fi
  timeout "${RESUME_TIMEOUT:-300}" python3 -m dfcil resume "$RUN" --data.root /tmp/data --no-progress \
    > "$OUT/resume.log" 2>&1
  echo "resume: exit $?"
  bring_back
  [ -f "$RUN/summary.json" ] && python3 -c "import json, sys; s = json.load(open(sys.argv[1]));
print({k: s[k] for k in ('last_acc', 'avg_inc_acc', 'forgetting', 'total_time_s', 'resumed')})" \
    "$RUN/summary.json"
  ;;
tests)
  if [ "${SPEED:-}" = all ]; then  # measured already (docs/results.md §3): only on request
    speed 60 merge
    speed 60 precision --ab precision
  fi
  if [ "${SPEED:-}" = compile ]; then  # compile time (minutes) is untimed but costs device time
    speed 300 compile --ab compile --channels-last  # engine.compile: the backbones, fp32 as the full run
  fi
  if [ "${SPEED:-}" = compile-step ]; then
    speed 300 compile-step --ab compile-step --channels-last  # whole steps compiled: what fusion could give
  fi
  # the CUDA tests only (the rest of the suite runs on the CPU in CI); -rA names every test even if cut off
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -rA -p no:cacheprovider tests/test_cuda.py 2>&1 \
    | tee "$OUT/tests.txt" | tail -25
  ;;
esac
