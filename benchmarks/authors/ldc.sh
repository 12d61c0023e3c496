#!/bin/bash
# LwF + LDC: the authors' code (github.com/alviur/ldc, LDC_supervised/) against dfcil's `lwf` with `ldc: true`,
# on 20 CIFAR-100 classes in 4 tasks of 5, 100 training images per class (README.md).
# Usage: DATA=... benchmarks/authors/ldc.sh setup | authors SEED | dfcil SEED | all   (seeds 1 and 2)
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EPOCHS=10; MILESTONES="[5, 9]"; PROJ_EPOCHS=10; BS=50
# One schedule for every task, as dfcil's lwf_ldc presets: LDC's incremental recipe (SGD lr 0.05, wd 2e-4,
# x0.1 at 45 and 90 of 100 epochs) scaled to EPOCHS; the authors' code gets it for its first task too.

ldc_json() {  # ldc_json FILE SEED PREFIX MODEL_DIR LDC: the protocol on the authors' side (their exps/lwf.json)
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
    "sigma": 0.3,
    "alpha": 25,
    "adv_epoch": 3,
    "sample_limit": 100,
    "ADC": false,
    "SDC": false,
    "LDC": $5,
    "NCM": true,
    "init_epoch": $EPOCHS,
    "init_lr": 0.05,
    "init_milestones": $MILESTONES,
    "init_lr_decay": 0.1,
    "init_weight_decay": 0.0002,
    "epochs": $EPOCHS,
    "lrate": 0.05,
    "milestones": $MILESTONES,
    "lrate_decay": 0.1,
    "weight_decay": 0.0002,
    "num_workers": 0,
    "T": 2,
    "lamda": 10,
    "ldc_epochs": $PROJ_EPOCHS
}
JSON
}

dfcil_ldc() {  # dfcil_ldc OUT ARGS...: dfcil's LwF + LDC on this protocol's schedule
  local out=$1
  shift
  dfcil_train "$out" --config configs/cifar100/lwf_ldc_n10.yaml --data.train_per_class 100 \
    --train.epochs $EPOCHS --train.batch_size $BS --train.milestones "$MILESTONES" "$@"
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced (the diagnostics): the functions only
case "$1" in
  setup)
    setup_authors_venv; setup_dfcil
    make_data pycil20_100 --pycil-seed 1993 --num-classes 20 --train-per-class 100
    checkout ldc alviur/ldc $LDC_COMMIT ldc.patch
    ln -sfn ../../data/pycil20_100 "$W/ldc/LDC_supervised/data" ;;
  authors)
    ldc_json "$W/ldc/LDC_supervised/exps/lwf_mini_s$2.json" $2 mini_s$2 weights/lwf_mini_s$2/ true
    timed "ldc authors $2" authors_python "$W/ldc/LDC_supervised" "$W/runs/ldc_authors_s$2.log" \
      main.py --config exps/lwf_mini_s$2.json ;;
  dfcil)
    timed "ldc dfcil $2" dfcil_ldc "$W/runs/dfcil_ldc_s$2" \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" \
      --method.drift.epochs $PROJ_EPOCHS --method.drift.passes $PROJ_EPOCHS --method.drift.batch_size $BS --seed $2 ;;
  all)
    bash "$0" setup; for s in 1 2; do bash "$0" authors $s; bash "$0" dfcil $s; done ;;
  *) echo "usage: $0 setup | authors SEED | dfcil SEED | all" >&2; exit 2 ;;
esac
