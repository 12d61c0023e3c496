#!/bin/bash
# Shared setup of the comparison with the authors' code (README.md); sourced by fecam.sh, ldc.sh, efc.sh and the
# diagnostics. Nothing of the authors' code is in this folder: their repositories are cloned at the recorded
# commits and patched with the diffs here.
#   W      work folder: clones, venvs, data folders, runs/ (default ~/dfcil-authors)
#   DATA   dfcil's data root, holding cifar100/{train,test}.npz or cifar-100-python/ (default $DFCIL_DATA)
# Every training: one thread, nice 10, one at a time (run the commands one after the other).
set -e
RECIPE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=${W:-$HOME/dfcil-authors}
DATA=${DATA:-${DFCIL_DATA:-}}
[ -n "$DATA" ] || { echo "set DATA (or DFCIL_DATA) to dfcil's data root (cifar100/{train,test}.npz)" >&2; exit 2; }
DFCIL_SRC=${DFCIL_SRC:-$(git -C "$RECIPE" rev-parse --show-toplevel)}  # a dfcil clone holding DFCIL_COMMIT
DFCIL_COMMIT=912541eed2ba356c3ac0150a45a6e9e88d12b8ca
FECAM_COMMIT=d2479b7bc9c3e704b0835ccd5928a2d7e0df5a09   # github.com/dipamgoswami/FeCAM
LDC_COMMIT=e3ea3e9f81ed698e97b3b108b814128297cb11a3     # github.com/alviur/ldc
EFC_COMMIT=3ef91722f57b4343cc424784ad000b0e336481cb     # github.com/simomagi/elastic_feature_consolidation
ADAGAUSS_COMMIT=2487d070e3a6159a0f21109e05d86f64514f4e7e  # github.com/grypesc/AdaGauss
DPCR_COMMIT=6e69f60382b88bd24bc46245f61b486bec9cee8b      # github.com/RHe502/ICML25-DPCR
APR_COMMIT=2b9d9b3b02886f37b5a9e7009060fa0a4c895648       # github.com/hirotomusiker/APR-EFCIL (MIT)
GITHUB=${GITHUB:-https://github.com}
PYTHON=${PYTHON:-python3.11}                             # 3.11.7 in the comparison
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
export PYCIL_CONVS=${PYCIL_CONVS:-$W/fecam/convs}        # PyCIL's cifar_resnet.py, for the diagnostic plugin
# the first 20 classes of PyCIL's CIFAR-100 order (np.random.seed(1993); np.random.permutation(100)), raw ids
ORDER20="[68, 56, 78, 8, 23, 84, 90, 65, 74, 76, 40, 89, 3, 92, 55, 9, 26, 80, 43, 38]"
ORDER10="[68, 56, 78, 8, 23, 84, 90, 65, 74, 76]"      # the diagnostics: the protocol's first two tasks
mkdir -p "$W/runs"

setup_authors_venv() {  # one venv for the three codes: CPU torch 2.13.0, PyPI torchvision 0.28.0 (no deps) + guard
  local V=$W/venv-authors
  [ -x "$V/bin/python" ] && return 0
  "$PYTHON" -m venv "$V"
  "$V/bin/pip" install -q torch==2.13.0 --index-url "$TORCH_INDEX"
  "$V/bin/pip" install -q --no-deps torchvision==0.28.0
  "$V/bin/pip" install -q -r "$RECIPE/requirements-authors.txt"
  local SITE
  SITE=$("$V/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  # torchvision's compiled ops are built for PyPI's (CUDA) torch: skip their registration (torchvision_guard.patch)
  patch -d "$SITE" -p1 -N --no-backup-if-mismatch < "$RECIPE/torchvision_guard.patch"
  cp "$RECIPE/sitecustomize.py" "$SITE/sitecustomize.py"
}

setup_dfcil() {  # dfcil at DFCIL_COMMIT in its own venv (CPU torch 2.13.0)
  [ -d "$W/dfcil-ref" ] || git clone -q "$DFCIL_SRC" "$W/dfcil-ref"
  git -C "$W/dfcil-ref" checkout -q $DFCIL_COMMIT
  if [ ! -x "$W/dfcil-ref/.venv/bin/dfcil" ]; then
    "$PYTHON" -m venv "$W/dfcil-ref/.venv"
    "$W/dfcil-ref/.venv/bin/pip" install -q torch==2.13.0 --index-url "$TORCH_INDEX"
    "$W/dfcil-ref/.venv/bin/pip" install -q -e "$W/dfcil-ref"
  fi
}

setup_dfcil_at() {  # setup_dfcil_at DIR COMMIT: a dfcil clone at COMMIT in DIR (from DFCIL_SRC) with its own venv; an
  # existing DIR must be at COMMIT without local changes under src/ and configs/
  local dir=$1 commit=$2
  if [ ! -d "$dir" ]; then
    git clone -q "$DFCIL_SRC" "$dir"
    git -C "$dir" checkout -q "$commit"
  fi
  [ "$(git -C "$dir" rev-parse HEAD)" = "$commit" ] && git -C "$dir" diff --quiet HEAD -- src configs || \
    { echo "$dir: not at $commit, or changed under src/ or configs/" >&2; exit 2; }
  if [ ! -x "$dir/.venv/bin/dfcil" ]; then
    "$PYTHON" -m venv "$dir/.venv"
    "$dir/.venv/bin/pip" install -q torch==2.13.0 --index-url "$TORCH_INDEX"
    "$dir/.venv/bin/pip" install -q -e "$dir"
  fi
}

make_data() {  # make_data NAME ARGS...: $W/data/NAME/cifar-100-python from DATA (make_cifar_pickles.py ARGS)
  local name=$1; shift
  [ -f "$W/data/$name/cifar-100-python/train" ] || \
    "$W/venv-authors/bin/python" "$RECIPE/make_cifar_pickles.py" --data-root "$DATA" --out "$W/data/$name" "$@"
}

checkout() {  # checkout NAME OWNER/REPO COMMIT [PATCH...]: $W/NAME, a clone at the recorded commit, patched
  local dst=$W/$1 repo=$2 commit=$3
  shift 3
  [ -d "$dst" ] && return 0
  git clone -q "$GITHUB/$repo" "$dst"
  git -C "$dst" checkout -q "$commit"
  local p
  for p in "$@"; do git -C "$dst" apply "$RECIPE/$p"; done
}

timed() {  # timed LABEL CMD...: runs CMD, appends "LABEL rc wall_s" to $W/runs/wall.tsv, returns CMD's rc
  local label=$1 t0 rc=0
  shift
  t0=$(date +%s)
  "$@" || rc=$?
  printf '%s\t%s\t%s\n' "$label" "$rc" "$(( $(date +%s) - t0 ))" >> "$W/runs/wall.tsv"
  return $rc
}

authors_python() {  # authors_python DIR LOG ARGS...: python ARGS in DIR with the authors' venv, nice 10, into LOG
  local dir=$1 log=$2
  shift 2
  (cd "$dir" && nice -n 10 "$W/venv-authors/bin/python" -u "$@") > "$log" 2>&1
}

dfcil_train() {  # dfcil_train OUT ARGS...: one dfcil run, nice 10, its output into OUT.log
  local out=$1
  shift
  (cd "$W/dfcil-ref" && nice -n 10 .venv/bin/dfcil train --data.root "$DATA" --device cpu "$@" --out "$out") \
    > "$out.log" 2>&1
}
