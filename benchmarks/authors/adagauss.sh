#!/bin/bash
# AdaGauss: the authors' code (github.com/grypesc/AdaGauss, src/approach/ada_gauss.py) against dfcil's `adagauss`,
# on 20 CIFAR-100 classes in 4 tasks of 5, 100 training images per class (README.md).
# Usage: DATA=... benchmarks/authors/adagauss.sh setup | authors SEED [ARGS] | dfcil SEED [ARGS] | all   (seeds 1, 2)
# ARGS are appended to the command and override it; the smokes (1 epoch, the first 2 tasks; RUN=adagauss_smoke):
#   authors 1 --nepochs 1 --stop-at-task 2
#   dfcil 1 --data.num_classes 10 --data.num_tasks 2 --data.class_order "$ORDER10" --train.epochs 1 \
#     --train.milestones "[]" --method.adapter.epochs 1 --method.adapter.passes 1 --method.adapter.milestones "[]"
# The authors' side: their scripts/cifar-10x10.sh options, with --nnet resnet32 (their ResNet-32 with the 1x1
# bottleneck to --S 64 features; the script's default is their ResNet-18) on the reduced folder (adagauss.patch:
# dataset cifar100_icarl20, the first 20 classes of the iCaRL order, the protocol's ORDER20). dfcil's adagauss is
# newer than DFCIL_COMMIT (the other methods' dfcil side): it runs from a clone of its own at DFCIL_ADA_COMMIT.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EPOCHS=20; BS=100   # a tenth of the authors' 200 epochs a task; batch 256 there (first task: 64 images + 3 rotations)
# the adapter: the 100 epochs and milestones of the authors' 200-epoch schedule (nepochs // 2 at ada_gauss.py:452,
# patched): its fit runs on the task's images through two frozen networks, and nepochs // 2 = 10 epochs of 5 steps
# leave it far from the feature pairs on both sides (dfcil's adapter check says so), moving every old Gaussian off
# its class (old accuracy 0.00 after task 1, docs/notes/authors-code-2026-12.md)
AD_EPOCHS=100
AD_PASSES=10   # dfcil's adapter cycles over 10 augmented passes of feature pairs; the authors' draws a fresh one an epoch
ms() { echo "[$((3 * $1 / 10)), $((6 * $1 / 10)), $((9 * $1 / 10))]"; }   # int(0.3 E), int(0.6 E), int(0.9 E)
MILESTONES=$(ms $EPOCHS); AD_MILESTONES=$(ms $AD_EPOCHS)   # [6, 12, 18] (ada_gauss.py:620), [30, 60, 90] (:449)
# dfcil with adagauss whose first task takes the authors' quarter batch with its rotations (efe1508 took the whole
# batch: 5 steps an epoch there instead of 20, first task 49.8 % against the authors' 71.6 on seed 1)
DFCIL_ADA_COMMIT=b11cbc1475aa44cb28bd9956abd8b5175d2b0c16
DFCIL_ADA=${DFCIL_ADA:-$W/dfcil-ada-b11cbc1}   # a clone at DFCIL_ADA_COMMIT with its .venv (setup makes it)
RUN=${RUN:-adagauss_ad100}             # the runs' names: $W/runs/${RUN}_authors_s<seed>, dfcil_${RUN}_s<seed>

check_dfcil_ada() {  # the dfcil side runs the recorded commit only
  local head
  head=$(git -C "$DFCIL_ADA" rev-parse HEAD)
  [ "$head" = $DFCIL_ADA_COMMIT ] || { echo "$DFCIL_ADA is at $head, not $DFCIL_ADA_COMMIT" >&2; exit 2; }
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced: the settings only
S=$2
case "$1" in
  setup)
    setup_authors_venv; setup_dfcil_at "$DFCIL_ADA" $DFCIL_ADA_COMMIT
    # ada_gauss.py:11 imports torchmetrics (not in requirements-authors.txt: the other codes do not use it)
    "$W/venv-authors/bin/python" -c "import torchmetrics" 2>/dev/null || \
      "$W/venv-authors/bin/pip" install -q torchmetrics==1.9.0 lightning-utilities==0.15.3
    make_data ordered20_100 --raw-order "$(echo $ORDER20 | tr -d '[] ')" --train-per-class 100   # as efc.sh
    checkout adagauss grypesc/AdaGauss $ADAGAUSS_COMMIT adagauss.patch
    mkdir -p "$W/adagauss/data"   # dataset_config.py: ../data/cifar100 from src/, the cwd of the runs
    ln -sfn ../../data/ordered20_100 "$W/adagauss/data/cifar100" ;;
  authors)
    shift 2
    rm -rf "$W/runs/${RUN}_authors_s$S"
    timed "$RUN authors $S" authors_python "$W/adagauss/src" "$W/runs/${RUN}_authors_s$S.log" \
      main_incremental.py --approach ada_gauss --seed $S --batch-size $BS --num-workers 0 --nepochs $EPOCHS \
      --datasets cifar100_icarl20 --num-tasks 4 --nc-first-task 5 --lr 0.1 --weight-decay 5e-4 \
      --adaptation-strategy full --S 64 --lamb 10 --use-test-as-val --criterion ce --distillation projected \
      --rotation --normalize --multiplier 32 --distiller mlp --adapter mlp --nnet resnet32 \
      --results-path "$W/runs/${RUN}_authors_s$S" --exp-name 4x5 "$@" ;;
  dfcil)
    shift 2
    check_dfcil_ada
    out=$W/runs/dfcil_${RUN}_s$S
    timed "$RUN dfcil $S" bash -c 'cd "$1" && shift && exec nice -n 10 .venv/bin/dfcil train "$@"' _ "$DFCIL_ADA" \
      --data.root "$DATA" --device cpu --config configs/cifar100/n10.yaml --config configs/cifar100/adagauss.yaml \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" --data.train_per_class 100 \
      --train.epochs $EPOCHS --train.batch_size $BS --train.milestones "$MILESTONES" \
      --method.adapter.epochs $AD_EPOCHS --method.adapter.passes $AD_PASSES --method.adapter.batch_size $BS \
      --method.adapter.milestones "$AD_MILESTONES" --seed $S "$@" --out "$out" > "$out.log" 2>&1 ;;
  all)
    bash "$0" setup; for s in 1 2; do bash "$0" authors $s; bash "$0" dfcil $s; done ;;
  *) echo "usage: $0 setup | authors SEED [ARGS] | dfcil SEED [ARGS] | all" >&2; exit 2 ;;
esac
