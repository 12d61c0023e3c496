#!/bin/bash
# Checks the recipe without training: the scripts parse, the Python compiles, and every patch applies to a fresh
# clone of its repository at the recorded commit (the diagnostics' patches after the faithful ones).
# Usage: benchmarks/authors/check.sh [DIR]   (DIR: where to clone, default a temporary folder; needs the network,
# or GITHUB=... pointing to a folder of OWNER/REPO clones)
set -e
RECIPE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
eval "$(grep -E '^(FECAM|LDC|EFC|ADAGAUSS|DPCR|APR)_COMMIT=' "$RECIPE/common.sh")"
GITHUB=${GITHUB:-https://github.com}
T=${1:-$(mktemp -d)}
for f in "$RECIPE"/*.sh; do bash -n "$f"; done
for f in "$RECIPE"/*.py; do python3 -c "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')" "$f"; done
fresh() {  # fresh NAME OWNER/REPO COMMIT PATCH...: clone at COMMIT, then git apply --check (and apply) each patch
  local name=$1 dst=$T/$1 repo=$2 commit=$3 p
  shift 3
  rm -rf "$dst"
  git clone -q "$GITHUB/$repo" "$dst"
  git -C "$dst" checkout -q "$commit"
  for p in "$@"; do
    git -C "$dst" apply --check "$RECIPE/$p"
    git -C "$dst" apply "$RECIPE/$p"
    echo "applies: $p ($name at ${commit:0:7})"
  done
}
fresh fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch fecam_diag.patch
fresh ldc alviur/ldc $LDC_COMMIT ldc.patch ldc_diag_noaug.patch
fresh efc simomagi/elastic_feature_consolidation $EFC_COMMIT efc.patch
fresh adagauss grypesc/AdaGauss $ADAGAUSS_COMMIT adagauss.patch
fresh dpcr RHe502/ICML25-DPCR $DPCR_COMMIT dpcr.patch dpcr_diag_noaug.patch
fresh apr hirotomusiker/APR-EFCIL $APR_COMMIT apr.patch
git -C "$T/fecam" cat-file -e $FECAM_COMMIT:convs/cifar_resnet.py && echo "found: convs/cifar_resnet.py at FeCAM ${FECAM_COMMIT:0:7}"
echo "all checks passed ($T)"
