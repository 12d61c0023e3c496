#!/bin/bash
# DIAGNOSTIC pair (not faithful runs): the protocol's first two tasks, PyCIL's ResNet-32 and crop + flip on both
# sides, and NO drift compensation: the authors' code (the ldc-diag clone of ldc_diag.sh) with "LDC": false, and
# dfcil with --method.drift.kind none and the plugin diag_pycil_backbone.py.
# Usage: DATA=... benchmarks/authors/ldc_diag_noldc.sh SEED (ran: 1; run ldc_diag.sh SEED first: it builds ldc-diag/)
. "$(dirname "${BASH_SOURCE[0]}")/ldc.sh"
S=${1:?usage: $0 SEED}
[ -d "$W/ldc-diag" ] || { echo "run ldc_diag.sh $S first" >&2; exit 2; }
checkout fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch   # PYCIL_CONVS: the network of the plugin
setup_dfcil
ldc_json "$W/ldc-diag/LDC_supervised/exps/lwf_diag_noldc_s$S.json" $S diag_noaug_noldc_s$S weights/diag_noldc_s$S/ false
timed "ldc_diag_noaug_noldc authors $S" authors_python "$W/ldc-diag/LDC_supervised" \
  "$W/runs/ldc_diag_noaug_noldc_s$S.log" main.py --config exps/lwf_diag_noldc_s$S.json
timed "ldc_diag_pycilnet_nodrift dfcil $S" dfcil_ldc "$W/runs/dfcil_ldc_diag_pycilnet_nodrift_s$S" \
  --data.num_classes 10 --data.num_tasks 2 --data.class_order "$ORDER10" --method.drift.kind none --seed $S \
  --plugin "$RECIPE/diag_pycil_backbone.py" --model.backbone pycil_resnet32
