#!/bin/bash
# DPCR: the authors' code (github.com/RHe502/ICML25-DPCR, a PyCIL fork) against dfcil's `dpcr`, on 20 CIFAR-100
# classes in 4 tasks of 5, 100 training images per class (README.md).
# Usage: DATA=... benchmarks/authors/dpcr.sh setup | authors SEED | dfcil SEED | dfcil-relu SEED | authors-noaug SEED | all
# (seeds 1, 2; dfcil-relu and authors-noaug: the diagnostic at equal network, border and augmentation)
# dfcil's DPCR is newer than DFCIL_COMMIT (912541e, the other three comparisons'): its side runs a dfcil checkout at
# DPCR_DFCIL_COMMIT, $DPCR_DFCIL (default $W/dfcil-dpcr, cloned from DFCIL_SRC with its own venv at setup; an existing
# checkout must be at that commit, without local changes under src/ and configs/).
# dfcil-relu (not in `all`): dfcil with the authors' network (PyCIL's ResNet-32, post-ReLU features) and crop border.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
DPCR_DFCIL_COMMIT=efe150813f46b978bedf50933157825b474250f3
DPCR_DFCIL=${DPCR_DFCIL:-$W/dfcil-dpcr}
INIT_EPOCHS=40; INIT_MILESTONES="[12, 24, 32]"; EPOCHS=20; MILESTONES="[9, 18]"; BS=50; PER_CLASS=100
# The authors' two schedules (models/lwf.py:19-31) scaled by 1/5, the milestones exactly: first task SGD lr 0.1,
# wd 5e-4, 200 epochs x0.1 at 60, 120, 160 -> 40 epochs at 12, 24, 32; later tasks SGD lr 0.05, wd 2e-4, 100 epochs
# x0.1 at 45, 90 -> 20 at 9, 18; momentum 0.9; batch 128 -> 50 (divides a task's 500 images: dfcil's drop_last drops
# nothing). Both sides; about 12 min a run on one thread of the shared 2-core machine (from a 1-epoch smoke).

dpcr_json() {  # dpcr_json FILE SEED PREFIX MODEL_DIR: the protocol on the authors' side (their exps/dpcr_cifar_*.json)
  cat > "$1" <<JSON
{
    "prefix": "$3",
    "dataset": "cifar100",
    "memory_size": 0,
    "fixed_memory": false,
    "shuffle": true,
    "cosine": true,
    "init_cls": 5,
    "increment": 5,
    "model_name": "lwf",
    "convnet_type": "resnet32",
    "batch_size" : $BS,
    "device": [-1],
    "seed": [1993],
    "train_seed": $2,
    "resume": false,
    "model_dir": "$4",
    "DPCR": true,
    "rg": 200,
    "rg_tssp": 1e-9,
    "num_per_class": $PER_CLASS,
    "init_epoch": $INIT_EPOCHS,
    "init_lr": 0.1,
    "init_milestones": $INIT_MILESTONES,
    "init_lr_decay": 0.1,
    "init_weight_decay": 0.0005,
    "epochs": $EPOCHS,
    "lrate": 0.05,
    "milestones": $MILESTONES,
    "lrate_decay": 0.1,
    "weight_decay": 0.0002,
    "num_workers": 0,
    "T": 2,
    "lamda": 10
}
JSON
}

dfcil_dpcr() {  # dfcil_dpcr OUT ARGS...: dfcil's DPCR on this protocol's schedule, nice 10, its output into OUT.log
  local out=$1
  shift
  (cd "$DPCR_DFCIL" && nice -n 10 .venv/bin/dfcil train --data.root "$DATA" --device cpu \
    --config configs/cifar100/n10.yaml --config configs/cifar100/dpcr.yaml --data.train_per_class $PER_CLASS \
    --train.epochs $EPOCHS --train.batch_size $BS --train.milestones "$MILESTONES" \
    --method.first.epochs $INIT_EPOCHS --method.first.milestones "$INIT_MILESTONES" "$@" --out "$out") > "$out.log" 2>&1
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced: the functions only
case "$1" in
  setup)
    setup_authors_venv; setup_dfcil_at "$DPCR_DFCIL" $DPCR_DFCIL_COMMIT
    make_data pycil20_100 --pycil-seed 1993 --num-classes 20 --train-per-class $PER_CLASS
    checkout dpcr RHe502/ICML25-DPCR $DPCR_COMMIT dpcr.patch
    ln -sfn ../data/pycil20_100 "$W/dpcr/data" ;;  # utils/data.py (patched) reads torchvision's CIFAR100 at ./data
  authors)
    dpcr_json "$W/dpcr/exps/dpcr_mini_s$2.json" $2 mini_s$2 weights/dpcr_mini_s$2/
    timed "dpcr authors $2" authors_python "$W/dpcr" "$W/runs/dpcr_authors_s$2.log" \
      main.py --config exps/dpcr_mini_s$2.json ;;
  authors-noaug)   # diagnostic: the authors' code with crop + flip only (dpcr_diag_noaug.patch), dfcil-relu's augmentation
    checkout dpcr-noaug RHe502/ICML25-DPCR $DPCR_COMMIT dpcr.patch dpcr_diag_noaug.patch
    ln -sfn ../data/pycil20_100 "$W/dpcr-noaug/data"
    dpcr_json "$W/dpcr-noaug/exps/dpcr_noaug_s$2.json" $2 noaug_s$2 weights/dpcr_noaug_s$2/
    timed "dpcr authors-noaug $2" authors_python "$W/dpcr-noaug" "$W/runs/dpcr_authors_noaug_s$2.log" \
      main.py --config exps/dpcr_noaug_s$2.json ;;
  dfcil)
    timed "dpcr dfcil $2" dfcil_dpcr "$W/runs/dfcil_dpcr_s$2" \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" --seed $2 ;;
  dfcil-relu)
    timed "dpcr dfcil-relu $2" dfcil_dpcr "$W/runs/dfcil_dpcr_relu_black_s$2" \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" --seed $2 \
      --model.backbone resnet32_relu --data.crop_fill black ;;
  all)
    bash "$0" setup; for s in 1 2; do bash "$0" authors $s; bash "$0" dfcil $s; done ;;
  *) echo "usage: $0 setup | authors SEED | dfcil SEED | dfcil-relu SEED | authors-noaug SEED | all" >&2; exit 2 ;;
esac
