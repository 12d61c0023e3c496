#!/bin/bash
# FeCAM: the authors' code (github.com/dipamgoswami/FeCAM) against dfcil's `fecam`, on 20 CIFAR-100 classes in
# 4 tasks of 5, 250 training images per class (README.md).
# Usage: DATA=... benchmarks/authors/fecam.sh setup | authors SEED | dfcil SEED | all   (seeds 1 and 2)
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EPOCHS=20; MILESTONES="[6, 12, 16]"   # FeCAM: cosine over 200 epochs; dfcil's preset: x0.1 at 60/120/160 of 200

fecam_json() {  # fecam_json FILE SEED PREFIX [EXTRA]: the protocol on the authors' side (their FeCAM_cifar100.json)
  cat > "$1" <<JSON
{
    "prefix": "$3",
    "dataset": "cifar100",
    "memory_size": 0,
    "shuffle": true,
    "init_cls": 5,
    "increment": 5,
    "model_name": "fecam",
    "convnet_type": "resnet32",
    "device": [-1],
    "seed": [1993],
    "train_seed": $2,
    "init_epochs": $EPOCHS,
    "init_lr" : 0.1,
    "init_weight_decay" : 5e-4,
    "batch_size" : 125,
    "num_workers" : 0,
    "T" : 2,
    "beta": 0.5,
    "alpha1": 1,
    "alpha2": 1,
    "ncm": false,
    "tukey" : true,
    "diagonal" : false,
    "per_class" : true,
    "full_cov" : true,
    "shrink" : true,
    "norm_cov" : true${4:+,
    $4}
}
JSON
}

fecam_setup() {
  setup_authors_venv
  make_data pycil20_250 --pycil-seed 1993 --num-classes 20 --train-per-class 250
  checkout fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch
  ln -sfn ../data/pycil20_250 "$W/fecam/data"   # the code reads torchvision's CIFAR100 from ./data
}

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced (fecam_diag.sh): the functions only
case "$1" in
  setup)
    fecam_setup; setup_dfcil ;;
  authors)
    fecam_json "$W/fecam/exps/FeCAM_mini_s$2.json" $2 mini_s$2
    timed "fecam authors $2" authors_python "$W/fecam" "$W/runs/fecam_authors_s$2.log" \
      main.py --config exps/FeCAM_mini_s$2.json ;;
  dfcil)
    timed "fecam dfcil $2" dfcil_train "$W/runs/dfcil_fecam_s$2" --config configs/cifar100/fecam_n10.yaml \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" --data.train_per_class 250 \
      --train.epochs $EPOCHS --train.batch_size 125 --train.milestones "$MILESTONES" --seed $2 ;;
  all)
    bash "$0" setup; for s in 1 2; do bash "$0" authors $s; bash "$0" dfcil $s; done ;;
  *) echo "usage: $0 setup | authors SEED | dfcil SEED | all" >&2; exit 2 ;;
esac
