#!/bin/bash
# DIAGNOSTIC (not a faithful run): the authors' LDC with dfcil's augmentation (crop + flip; ColorJitter and
# AutoAugment dropped by ldc_diag_noaug.patch, applied after ldc.patch), on the protocol's first two tasks (the first
# 10 classes of the order), everything else as ldc.sh. Usage: DATA=... benchmarks/authors/ldc_diag.sh SEED (ran: 1)
. "$(dirname "${BASH_SOURCE[0]}")/ldc.sh"
S=${1:?usage: $0 SEED}
setup_authors_venv
make_data pycil10_100 --pycil-seed 1993 --num-classes 10 --train-per-class 100
checkout ldc-diag alviur/ldc $LDC_COMMIT ldc.patch ldc_diag_noaug.patch
ln -sfn ../../data/pycil10_100 "$W/ldc-diag/LDC_supervised/data"
ldc_json "$W/ldc-diag/LDC_supervised/exps/lwf_diag_s$S.json" $S diag_noaug_s$S weights/diag_s$S/ true
timed "ldc_diag_noaug authors $S" authors_python "$W/ldc-diag/LDC_supervised" "$W/runs/ldc_diag_noaug_s$S.log" \
  main.py --config exps/lwf_diag_s$S.json
