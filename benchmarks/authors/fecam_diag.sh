#!/bin/bash
# DIAGNOSTIC, PREPARED AND NEVER RUN (FeCAM agreed without it): the authors' FeCAM with dfcil's augmentation
# (crop + flip) and dfcil's step schedule (x0.1 at 6, 12, 16 of 20 epochs instead of cosine annealing):
# fecam_diag.patch, applied after fecam.patch; otherwise as fecam.sh.
# Usage: DATA=... benchmarks/authors/fecam_diag.sh SEED
. "$(dirname "${BASH_SOURCE[0]}")/fecam.sh"
S=${1:?usage: $0 SEED}
setup_authors_venv
make_data pycil20_250 --pycil-seed 1993 --num-classes 20 --train-per-class 250
checkout fecam-diag dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch fecam_diag.patch
ln -sfn ../data/pycil20_250 "$W/fecam-diag/data"
fecam_json "$W/fecam-diag/exps/FeCAM_diag_s$S.json" $S diag_s$S "\"diag_milestones\": $MILESTONES"
timed "fecam_diag authors $S" authors_python "$W/fecam-diag" "$W/runs/fecam_diag_s$S.log" \
  main.py --config exps/FeCAM_diag_s$S.json
