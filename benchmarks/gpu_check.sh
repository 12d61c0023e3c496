#!/usr/bin/env bash
# GPU checks on any CUDA machine, from the repository root (docs/gpu.md):
#   bash benchmarks/gpu_check.sh prep    # the card and PyTorch (gpu.txt); PROFILE=1 adds the channels_last A/B of
#                                        #   graphed steps and a kernel profile of eager ones
#   bash benchmarks/gpu_check.sh speed   # eager vs graphed steps (fp32; bf16 + channels_last)
#   bash benchmarks/gpu_check.sh full    # the 5-task CIFAR-100 R-DFCIL protocol (paper schedule) in $RUNS/full-on:
#                                        #   PRECISION (fp32), GRAPHS (on), COMPILE=default, ORDER (class order 0, 1
#                                        #   or 2) choose the run; FULL_TIMEOUT seconds at most (none by default),
#                                        #   a timeout stops it with a checkpoint
#   bash benchmarks/gpu_check.sh resume  # continues that run (RESUME_TIMEOUT) and prints its summary
#   bash benchmarks/gpu_check.sh tests   # the CUDA tests; SPEED=all|compile|compile-step|autotune adds step A/Bs first
#   bash benchmarks/gpu_check.sh round2  # the static head and engine.compile: step, ROUND2_BUDGET seconds (570):
#                                        #   (1) the 5-task CIFAR-100 R-DFCIL schedule at full size on generated
#                                        #   images (timing only; FULL_BUDGET s, then extrapolated by
#                                        #   dfcil report --timing), (2) the step A/B graphs vs graphs + compiled
#                                        #   steps with eager kernel profiles (memory-format conversions counted),
#                                        #   (3) cifar100-mini R-DFCIL seeds 1, 2, 3, graphs vs static head +
#                                        #   compiled steps, for accuracy
#   bash benchmarks/gpu_check.sh mini    # cifar100-mini through dfcil sweep, runs packed on the GPU: every method on
#                                        #   class orders 0, 1, 2; R-DFCIL fp32 and bf16 on seeds 1, 2, 3; the
#                                        #   ablations on orders 0, 1, 2; MINI_BUDGET seconds in all (default 540),
#                                        #   the records of every run in $OUT/mini-runs.tgz
#   bash benchmarks/gpu_check.sh mini10  # cifar100-mini10 (R-DFCIL+ and its ablations against R-DFCIL, EFC,
#                                        #   LwF + LDC, FeCAM, fine-tuning) on class orders 0, 1, 2, packed on the
#                                        #   GPU; MINI_BUDGET seconds (540); the same command resumes it; records in
#                                        #   $OUT/mini10-runs.tgz and the report in $OUT/mini10-report.md
#   bash benchmarks/gpu_check.sh cell    # one table cell: CELL_CONFIG (the files of one run joined with +, default
#                                        #   configs/cifar100/n5.yaml+configs/cifar100/rdfcil.yaml) on class
#                                        #   orders 0, 1, 2 at once on the card (static head, compiled and graphed
#                                        #   steps, one compile cache) in $CELL (default $RUNS/cell); CELL_BUDGET
#                                        #   seconds (540), then stopped with checkpoints; the same command resumes.
#                                        #   $OUT/cell.tgz carries it to the next machine (records, newest
#                                        #   checkpoints, compile cache): put it at the repository root (or CELL_FROM)
#                                        #   there. $OUT/cell-report.md: dfcil report's table. DRY_RUN=1: the plan,
#                                        #   the unpacking and the packing only, on any machine (no GPU, no data)
#                                        #   CELL_CONFIG may name several rows (space-separated), CELL_ORDERS the
#                                        #   class orders (default 0,1,2), CELL_COMPILE=none the eager head and
#                                        #   graphed steps without compiling (every row x order runs at once;
#                                        #   CELL_JOBS sets how many), CELL_ARGS more sweep arguments for every
#                                        #   row (CELL_ARGS="--grid model.backbone=resnet32,resnet18_cifar")
#   bash benchmarks/gpu_check.sh queue   # the first item of benchmarks/queue.yaml not done (QUEUE_ITEM=<id>: that
#                                        #   one), as a cell (CELL_CONFIG, CELL_ORDERS, CELL_ARGS, CELL_COMPILE from
#                                        #   the item) in $RUNS/queue-<id>, for QUEUE_LEFT seconds (540: a window's
#                                        #   time after its start and the data's staging). First
#                                        #   benchmarks/gpu_queue.py plan estimates what each run reaches, from the
#                                        #   step times measured on the card, and refuses (exit 3) an item whose runs
#                                        #   reach no task boundary (QUEUE_FORCE=1 runs it anyway); a partial item
#                                        #   continues from its pack (cell.tgz at the repository root). DRY_RUN=1:
#                                        #   the plan and the cell's dry run, on any machine. The plan in
#                                        #   $OUT/queue-plan.txt
#   bash benchmarks/gpu_check.sh stage   # keeps this call's parts of $DEVDATA (.devdata) in $STAGE (default
#                                        #   /tmp/devdata-stage) for the next call on the same machine, and unpacks
#                                        #   them into $DATA once all are there: the full arrays in two calls
#   bash benchmarks/gpu_check.sh mps     # throughput of 1, 3 and 6 runs at once, without and with CUDA MPS
#                                        #   (benchmarks/concurrency.py; JOBS=1,3,6, MPS=off,auto, MPS_BUDGET
#                                        #   seconds, 570); the table in $OUT/concurrency.txt
#   bash benchmarks/gpu_check.sh batched # the batched-orders prototype (benchmarks/batched_orders.py): one step of
#                                        #   3 ResNet-32s as one grouped network against one model and 3 in turn,
#                                        #   eager and compiled with CUDA graphs, after its equality check; the
#                                        #   tables in $OUT/batched.txt (at most 8 minutes)
# DATA: a data root holding cifar100/{train,test}.npz (default /tmp/data); where it has none and .devdata/ holds
# the arrays packed by benchmarks/pack_cifar.py, they are unpacked there. Wheels in .whl/ (if any) are installed
# offline into /tmp/site for a machine whose image lacks dfcil's dependencies; else dfcil must be installed.
# Results and records go to $OUT (default /tmp/out).
set -uo pipefail
export PYTHONUNBUFFERED=1
case "${1:-}" in prep | stage | speed | full | resume | tests | mini | mini10 | round2 | cell | queue | mps | batched) ;; *)
  echo "usage: bash benchmarks/gpu_check.sh prep|stage|full|resume|speed|tests|mini|mini10|round2|cell|queue|mps|batched (docs/gpu.md)" >&2
  exit 2
  ;;
esac
OUT=${OUT:-/tmp/out}
DATA=${DATA:-/tmp/data}
RUNS=${RUNS:-/tmp/runs}
ORDER=${ORDER:-0}  # the class order (data.class_order_seed); the paper averages orders 0, 1 and 2
RUN=$RUNS/full-${GRAPHS:-on}${COMPILE:+-compile}$([ "$ORDER" = 0 ] || echo "-order$ORDER")
mkdir -p "$OUT" "$RUNS"
if compgen -G ".whl/*.whl" > /dev/null && [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD/src

DEVDATA=${DEVDATA:-.devdata}       # the packed arrays (benchmarks/pack_cifar.py), or this call's share of them
STAGE=${STAGE:-/tmp/devdata-stage}  # `stage` keeps the parts that earlier calls on this machine brought

keep_parts() {  # this call's parts of $DEVDATA added to those kept in $STAGE
  mkdir -p "$STAGE" && cp "$DEVDATA"/* "$STAGE/" 2>/dev/null
}

data() {  # the CIFAR-100 arrays in $DATA, unpacked from $DEVDATA (with the parts staged before) if need be
  [ -f "$DATA/cifar100/train.npz" ] && return 0
  local src=$DEVDATA
  if [ -d "$STAGE" ]; then
    keep_parts
    src=$STAGE
  fi
  python3 benchmarks/pack_cifar.py unpack "$src" "$DATA" \
    || { echo "no CIFAR-100 arrays: set DATA to a data root holding cifar100/ (docs/gpu.md)"; exit 3; }
}

bring_back() {  # the run's records and newest checkpoint (enough to resume it elsewhere), not the weights
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
  if [ "${PROFILE:-0}" = 1 ]; then  # where a graphed step's time goes (about two minutes)
    speed 90 memory-graphs --ab memory --graphs --phases task0,inversion,rrl,chr --profile 10
    speed 60 memory-graphs-bf16 --ab memory --graphs --precision bf16 --phases task0,rrl
  fi
  ;;
speed)
  speed 90 graphs --ab graphs
  speed 90 graphs-bf16-cl --ab graphs --precision bf16 --channels-last
  ;;
full)
  data
  rm -rf "$RUN"
  # --epoch_checkpoint_interval_s 60: a runtime key (results unchanged); an epoch of this protocol is ~0.8 s
  timeout "${FULL_TIMEOUT:-0}" python3 -m dfcil train --config configs/cifar100/n5.yaml \
    --config configs/cifar100/rdfcil.yaml --data.root "$DATA" --data.class_order_seed "$ORDER" --device cuda \
    --engine.precision "${PRECISION:-fp32}" --engine.channels_last true --engine.cuda_graphs "${GRAPHS:-on}" \
    --engine.compile "${COMPILE:-none}" --epoch_checkpoint_interval_s 60 \
    --out "$RUN" --no-progress > "$OUT/full.log" 2>&1
  echo "full: exit $? (124: stopped by the timeout, checkpoint written; continue with resume)"
  bring_back
  ;;
resume)
  if [ ! -d "$RUN" ] && [ -d ".devdata/${RUN##*/}" ]; then  # a run directory brought from another machine
    cp -r ".devdata/${RUN##*/}" "$RUN"
  fi
  data
  timeout "${RESUME_TIMEOUT:-0}" python3 -m dfcil resume "$RUN" --data.root "$DATA" --no-progress \
    > "$OUT/resume.log" 2>&1
  echo "resume: exit $?"
  bring_back
  [ -f "$RUN/summary.json" ] && python3 -c "import json, sys; s = json.load(open(sys.argv[1]));
print({k: s[k] for k in ('last_acc', 'avg_inc_acc', 'forgetting', 'total_time_s', 'resumed')})" \
    "$RUN/summary.json"
  ;;
mini)
  data
  end=$((SECONDS + ${MINI_BUDGET:-540}))
  engine=(--data.root "$DATA" --device cuda --engine.channels_last true --engine.cuda_graphs on)
  methods=(--config configs/cifar100-mini.yaml) ablations=()
  for f in configs/cifar100-mini/*.yaml; do
    case $f in */rdfcil_*) ablations+=(--config "configs/cifar100-mini.yaml+$f") ;;
      *) methods+=(--config "configs/cifar100-mini.yaml+$f") ;; esac
  done
  sweep() {  # $1: the sweep's name; the rest: dfcil sweep's arguments; stopped (checkpointed) at the deadline
    local name=$1
    shift
    [ $((end - SECONDS)) -gt 20 ] || { echo "mini: no time left for $name"; return; }
    timeout $((end - SECONDS)) python3 -m dfcil sweep "$@" "${engine[@]}" --out "$RUNS/mini-$name" 2>&1 \
      | tee "$OUT/mini-$name.txt"
  }
  sweep methods "${methods[@]}" --grid data.class_order_seed=0,1,2
  sweep precision --config configs/cifar100-mini.yaml --grid seed=1,2,3 --grid engine.precision=fp32,bf16
  sweep ablations "${ablations[@]}" --grid data.class_order_seed=0,1,2
  (cd "$RUNS" && find mini-* -maxdepth 2 \( -name summary.json -o -name config.yaml -o -name meta.json \
    -o -name metrics.jsonl -o -name sweep.json -o -name run.log \) | tar czf "$OUT/mini-runs.tgz" -T -)
  ;;
mini10)
  data
  runs=(--config configs/cifar100-mini10.yaml)
  for f in configs/cifar100-mini10/*.yaml; do runs+=(--config "configs/cifar100-mini10.yaml+$f"); done
  timeout "${MINI_BUDGET:-540}" python3 -m dfcil sweep "${runs[@]}" --grid data.class_order_seed=0,1,2 \
    --data.root "$DATA" --device cuda --engine.channels_last true --out "$RUNS/mini10" 2>&1 | tee "$OUT/mini10.txt"
  python3 -m dfcil report "$RUNS/mini10" > "$OUT/mini10-report.md" 2>&1
  tail -20 "$OUT/mini10-report.md"
  (cd "$RUNS" && find mini10 -maxdepth 2 \( -name summary.json -o -name config.yaml -o -name meta.json \
    -o -name metrics.jsonl -o -name sweep.json -o -name run.log \) | tar czf "$OUT/mini10-runs.tgz" -T -)
  ;;
stage)  # this call's parts of $DEVDATA kept in $STAGE for a later call on the same machine (data too large for
  # one call); once the stage holds every part (index.json says how many), they are unpacked into $DATA
  keep_parts || { echo "stage: nothing to keep in $DEVDATA"; exit 3; }
  ! command -v nvidia-smi > /dev/null || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
    | tee "$OUT/gpu.txt"
  have=$(find "$STAGE" -maxdepth 1 -name 'part*' | wc -l)
  need=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["parts"])' "$STAGE/index.json" 2>/dev/null)
  if [ -n "$need" ] && [ "$have" -ge "$need" ]; then
    data
  else
    echo "stage: $have of ${need:-? (no index.json yet)} parts kept in $STAGE"
  fi
  ;;
cell)
  CELL=${CELL:-$RUNS/cell}
  from=${CELL_FROM:-cell.tgz}
  if [ ! -e "$CELL/sweep.json" ] && [ ! -f "$from" ] && [ -f "$from.00" ]; then  # carried in pieces
    cat "$from".[0-9][0-9] > "/tmp/${from##*/}" && from=/tmp/${from##*/}
  fi
  if [ ! -e "$CELL/sweep.json" ] && [ -f "$from" ]; then  # carried from an earlier machine
    mkdir -p "$CELL" && tar xzf "$from" -C "$CELL" || { echo "cell: cannot unpack $from into $CELL"; exit 4; }
    echo "cell: continuing the runs carried in $from"
  fi
  read -ra rows <<< "${CELL_CONFIG:-configs/cifar100/n5.yaml+configs/cifar100/rdfcil.yaml}"
  orders=${CELL_ORDERS:-0,1,2}
  IFS=, read -ra olist <<< "$orders"
  sweep=(python3 -m dfcil sweep)
  for r in "${rows[@]}"; do sweep+=(--config "$r"); done
  read -ra extra <<< "${CELL_ARGS:-}"  # more sweep arguments for every row: a grid (--grid model.backbone=...)
  sweep+=(--grid "data.class_order_seed=$orders" --jobs "${CELL_JOBS:-$((${#rows[@]} * ${#olist[@]}))}"
    --data.root "$DATA" --device cuda --engine.channels_last true --engine.cuda_graphs on "${extra[@]}")
  [ "${CELL_COMPILE:-step}" = step ] && sweep+=(--model.static_head true --engine.compile step)
  sweep+=(--engine.compile_cache "$CELL/.compile-cache" --out "$CELL")
  budget=${CELL_BUDGET:-540}
  sweep+=(--budget-s "$budget")  # each run stops at the last task boundary it can reach in the time left
  if [ "${DRY_RUN:-0}" = 1 ]; then
    echo "cell: would run (for $budget s at most): ${sweep[*]}"
    "${sweep[@]}" --dry-run || exit 1
  else
    data
    # the sweep stops its runs when its budget is spent; the timeout is the last resort, should it not
    timeout -k 30 "$((budget + 60))" "${sweep[@]}" 2>&1 | tee "$OUT/cell.txt"
    python3 -m dfcil report "$CELL" > "$OUT/cell-report.md" 2>&1
    tail -20 "$OUT/cell-report.md"
  fi
  # what resuming needs in at most CELL_PIECE bytes: records, logs and each unfinished run's newest checkpoint, or
  # its last task boundary where the newest is too large (benchmarks/pack.py); the compile cache where it fits
  if [ -d "$CELL" ]; then
    cache=()
    [ "${CELL_CARRY_CACHE:-1}" = 1 ] && [ -d "$CELL/.compile-cache" ] && cache=(--cache "$CELL/.compile-cache")
    python3 benchmarks/pack.py "$CELL" "$OUT/cell.tgz" --limit "${CELL_PIECE:-15M}" "${cache[@]}"
  fi
  ;;
queue)
  # the plan: the first item not done, what its runs reach in QUEUE_LEFT seconds, and the cell's settings as shell
  # lines (QUEUE_ID, CELL_CONFIG, CELL_ORDERS, CELL_ARGS, CELL_COMPILE, CELL_BUDGET, CELL_FROM for a partial item)
  plan=(plan --left "${QUEUE_LEFT:-540}")
  [ -n "${QUEUE_ITEM:-}" ] && plan+=(--item "$QUEUE_ITEM")
  [ "${QUEUE_FORCE:-0}" = 1 ] && plan+=(--force)
  [ -n "${QUEUE_FILE:-}" ] && plan=(--queue "$QUEUE_FILE" "${plan[@]}")  # another queue file (tests)
  settings=$(python3 benchmarks/gpu_queue.py "${plan[@]}")
  rc=$?
  echo "$settings" | tee "$OUT/queue-plan.txt"
  [ $rc = 0 ] || { echo "queue: nothing run (benchmarks/gpu_queue.py plan: exit $rc)"; exit $rc; }
  eval "$settings"
  export CELL_CONFIG CELL_ORDERS CELL_ARGS CELL_COMPILE CELL_BUDGET
  [ -n "${CELL_FROM:-}" ] && export CELL_FROM
  CELL=${CELL:-$RUNS/queue-$QUEUE_ID} bash "$0" cell
  ;;
mps)
  nvidia-smi --query-gpu=name,compute_mode --format=csv,noheader | tee "$OUT/gpu.txt"
  timeout "${MPS_BUDGET:-570}" python3 benchmarks/concurrency.py --jobs "${JOBS:-1,3,6}" --mps "${MPS:-off,auto}" \
    2>&1 | tee "$OUT/concurrency.txt"
  ;;
batched)
  nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/gpu.txt"
  {
    python3 benchmarks/batched_orders.py --device cuda --check || exit 1
    timeout 120 python3 benchmarks/batched_orders.py --device cuda --batch 256 --rounds 10 --steps 20
    # compiled: four step functions (three models and the grouped one) compile first
    timeout 360 python3 benchmarks/batched_orders.py --device cuda --batch 256 --rounds 10 --steps 20 \
      --compile reduce-overhead
  } 2>&1 | tee "$OUT/batched.txt"
  ;;
round2)
  end=$((SECONDS + ${ROUND2_BUDGET:-570}))
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
  fast=(--device cuda --engine.channels_last true --engine.cuda_graphs on)
  step=(--model.static_head true --engine.compile step)
  # (1) the n5 + rdfcil schedule on 100 generated classes of 500 images: CIFAR-100's steps and shapes, for timing
  RUN=$RUNS/full-fake-step
  rm -rf "$RUN"
  timeout -k 30 "${FULL_BUDGET:-270}" python3 -m dfcil train --config configs/cifar100/n5.yaml \
    --config configs/cifar100/rdfcil.yaml --data.name fake --data.num_classes 100 --data.train_per_class 500 --data.image_size 32 \
    "${fast[@]}" "${step[@]}" --epoch_checkpoint_interval_s 60 --out "$RUN" --no-progress > "$OUT/full-fake.log" 2>&1
  echo "full (generated images): exit $? (124: stopped by its budget, checkpoint written)"
  tail -5 "$OUT/full-fake.log"
  dfcil report "$RUN" --timing | tee "$OUT/full-fake-time.txt"
  # (2) step times, graphed, without and with compiled steps; eager kernel profiles of the NHWC steps
  speed $((end - SECONDS < 160 ? end - SECONDS : 160)) compile-step --ab compile-step --channels-last \
    --phases inversion,rrl,chr --rounds 5 --profile 5
  # (3) accuracy: cifar100-mini, seeds 1, 2, 3, both engines at once (about two minutes with the compilations)
  if [ $((end - SECONDS)) -lt 150 ]; then
    echo "round2: $((end - SECONDS)) s left, too little for the accuracy sweeps; skipped"
    end=$SECONDS
  fi
  [ $((end - SECONDS)) -gt 0 ] && data
  for v in plain step; do
    [ $((end - SECONDS)) -gt 0 ] || break
    extra=()
    [ $v = step ] && extra=("${step[@]}")
    timeout $((end - SECONDS)) python3 -m dfcil sweep --config configs/cifar100-mini.yaml --grid seed=1,2,3 \
      --data.root "$DATA" "${fast[@]}" "${extra[@]}" --out "$RUNS/acc-$v" > "$OUT/acc-$v.txt" 2>&1 &
  done
  wait
  tail -12 "$OUT"/acc-*.txt
  if [ $((end - SECONDS)) -gt 90 ]; then  # the CUDA test of compiled, graphed steps, if time is left
    timeout $((end - SECONDS)) python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_cuda.py \
      -k compiled_steps 2>&1 | tail -15 | tee "$OUT/tests-compile.txt"
  fi
  (cd "$RUNS" && find acc-* full-fake-step -maxdepth 2 \( -name summary.json -o -name config.yaml -o -name metrics.jsonl \
    -o -name sweep.json -o -name run.log \) | tar czf "$OUT/round2-runs.tgz" -T -)
  ;;
tests)
  if [ "${SPEED:-}" = all ]; then
    speed 60 merge
    speed 60 precision --ab precision
  fi
  if [ "${SPEED:-}" = compile ]; then  # compile time (minutes) is untimed
    speed 300 compile --ab compile --channels-last  # engine.compile: the backbones, fp32 as the full run
  fi
  if [ "${SPEED:-}" = autotune ]; then  # engine.compile_mode: max-autotune-no-cudagraphs against default
    speed 420 autotune --ab autotune --channels-last --phases inversion,rrl,chr
  fi
  if [ "${SPEED:-}" = compile-step ]; then
    speed 300 compile-step --ab compile-step --channels-last  # whole steps compiled: what fusion could give
  fi
  # the CUDA tests only (the rest of the suite runs on the CPU); -rA names every test even if cut off
  timeout "${TEST_TIMEOUT:-600}" python3 -m pytest -q -rA -p no:cacheprovider -m gpu tests/test_cuda.py tests/test_tools.py 2>&1 \
    | tee "$OUT/tests.txt" | tail -25
  ;;
esac
