#!/bin/bash
# DIAGNOSTIC (not a faithful run): dfcil's LwF + LDC with PyCIL's ResNet-32 as its backbone (the plugin
# diag_pycil_backbone.py imports it from the FeCAM clone), on the protocol's first two tasks (the first 10 classes
# of the order), otherwise as ldc.sh. Usage: DATA=... benchmarks/authors/ldc_diag_dfcil_backbone.sh SEED (ran: 1)
. "$(dirname "${BASH_SOURCE[0]}")/ldc.sh"
S=${1:?usage: $0 SEED}
checkout fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch   # PYCIL_CONVS: the network of the plugin
setup_dfcil
timed "ldc_diag_pycilnet dfcil $S" dfcil_ldc "$W/runs/dfcil_ldc_diag_pycilnet_s$S" \
  --data.num_classes 10 --data.num_tasks 2 --data.class_order "$ORDER10" \
  --method.drift.epochs $PROJ_EPOCHS --method.drift.passes $PROJ_EPOCHS --method.drift.batch_size $BS --seed $S \
  --plugin "$RECIPE/diag_pycil_backbone.py" --model.backbone pycil_resnet32
