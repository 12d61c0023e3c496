#!/bin/bash
# DIAGNOSTIC (not a faithful run): dfcil's EFC with PyCIL's ResNet-32 as its backbone (the plugin
# diag_pycil_backbone.py imports it from the FeCAM clone), on the protocol's first two tasks (the first 10 classes
# of the order), otherwise as efc.sh. Usage: DATA=... benchmarks/authors/efc_diag_dfcil_backbone.sh SEED (ran: 1)
. "$(dirname "${BASH_SOURCE[0]}")/efc.sh"
S=${1:?usage: $0 SEED}
checkout fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch   # PYCIL_CONVS: the network of the plugin
setup_dfcil
timed "efc_diag_pycilnet dfcil $S" dfcil_train "$W/runs/dfcil_efc_diag_pycilnet_s$S" \
  --config configs/cifar100/efc_n10.yaml --data.num_classes 10 --data.num_tasks 2 --data.class_order "$ORDER10" \
  --data.train_per_class 100 --train.epochs $EPOCHS --train.batch_size $BS --train.milestones "[${MILESTONES/,/, }]" \
  --seed $S --plugin "$RECIPE/diag_pycil_backbone.py" --model.backbone pycil_resnet32
