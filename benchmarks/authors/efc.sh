#!/bin/bash
# EFC: the authors' code (github.com/simomagi/elastic_feature_consolidation, approach efc) against dfcil's `efc`,
# on 20 CIFAR-100 classes in 4 tasks of 5, 100 training images per class (README.md).
# Usage: DATA=... benchmarks/authors/efc.sh setup | authors SEED | dfcil SEED | all   (seeds 1 and 2)
# EFC's code has only ResNet-18; the protocol's ResNet-32 is PyCIL's convs/cifar_resnet.py, copied at setup from
# the FeCAM clone (a PyCIL fork) at its recorded commit into the EFC clone, with the wrapper efc_resnet32.py.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
EPOCHS=5; MILESTONES="2,4"; BS=50   # EFC: 100 epochs a task, the first x0.1 at 45 and 90 (Adam 1e-3); 5 here

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced (the diagnostics): the settings only
case "$1" in
  setup)
    setup_authors_venv; setup_dfcil
    make_data ordered20_100 --raw-order "$(echo $ORDER20 | tr -d '[] ')" --train-per-class 100
    checkout fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch   # as fecam.sh; the patch leaves convs/ alone
    if [ ! -d "$W/efc" ]; then
      checkout efc simomagi/elastic_feature_consolidation $EFC_COMMIT efc.patch
      git -C "$W/fecam" show $FECAM_COMMIT:convs/cifar_resnet.py > "$W/efc/continual_learning/models/cifar_resnet.py"
      cp "$RECIPE/efc_resnet32.py" "$W/efc/continual_learning/models/resnet32_pycil.py"
    fi
    ln -sfn ../../data/ordered20_100 "$W/efc/dataset/data" ;;  # the code reads torchvision's CIFAR100 there
  authors)
    rm -rf "$W/runs/efc_authors_s$2"; mkdir -p "$W/runs/efc_authors_s$2"
    timed "efc authors $2" authors_python "$W/efc" "$W/runs/efc_authors_s$2.log" \
      main.py -op "$W/runs/efc_authors_s$2" --dataset cifar100 --n_task 4 --n_class_first_task 5 --approach efc \
      --nw 0 --seed $2 --epochs_first_task $EPOCHS --epochs_next_task $EPOCHS --batch_size $BS --device -1 \
      --backbone resnet32 --keep_class_order --milestones_first_task $MILESTONES ;;
  dfcil)
    timed "efc dfcil $2" dfcil_train "$W/runs/dfcil_efc_s$2" --config configs/cifar100/efc_n10.yaml \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" --data.train_per_class 100 \
      --train.epochs $EPOCHS --train.batch_size $BS --train.milestones "[${MILESTONES/,/, }]" --seed $2 ;;
  all)
    bash "$0" setup; for s in 1 2; do bash "$0" authors $s; bash "$0" dfcil $s; done ;;
  *) echo "usage: $0 setup | authors SEED | dfcil SEED | all" >&2; exit 2 ;;
esac
