#!/bin/bash
# The authors' LwF + LDC on the full protocol (20 classes, 4 tasks of 5, as ldc.sh) with dfcil's augmentation:
# crop + flip only (ColorJitter and AutoAugment dropped by ldc_diag_noaug.patch, applied after ldc.patch). The
# authors' crop pads with black (torchvision); its dfcil counterpart is `ldc.sh`'s dfcil run with
# `--data.crop_fill black`. Together they put both codes on the same augmentation and border (docs/fidelity.md).
# Usage: DATA=... benchmarks/authors/ldc_cropflip.sh SEED   (ran: 1, 2)
. "$(dirname "${BASH_SOURCE[0]}")/ldc.sh"
S=${1:?usage: $0 SEED}
setup_authors_venv
make_data pycil20_100 --pycil-seed 1993 --num-classes 20 --train-per-class 100
checkout ldc-cropflip alviur/ldc $LDC_COMMIT ldc.patch ldc_diag_noaug.patch
ln -sfn ../../data/pycil20_100 "$W/ldc-cropflip/LDC_supervised/data"
ldc_json "$W/ldc-cropflip/LDC_supervised/exps/lwf_cropflip_s$S.json" $S cropflip_s$S weights/cropflip_s$S/ true
timed "ldc_cropflip authors $S" authors_python "$W/ldc-cropflip/LDC_supervised" "$W/runs/ldc_cropflip_s$S.log" \
  main.py --config exps/lwf_cropflip_s$S.json
