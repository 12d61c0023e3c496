#!/bin/bash
# APR: the authors' code (github.com/hirotomusiker/APR-EFCIL, MIT, libs/learners/apr.py) against dfcil's `apr`, on 20
# CIFAR-100 classes in 4 tasks of 5, 100 training images per class (README.md), at equal augmentation: crop + flip
# with a black border on both sides (their ColorJitter and AutoAugment switched off, dfcil's --data.crop_fill black).
# Usage: DATA=... benchmarks/authors/apr.sh setup | authors SEED [ARGS] | dfcil SEED [ARGS] | all   (seeds 1, 2)
# ARGS are appended to the command and override it (authors: more --cfg-options items, e.g. adc.do_adc=False; dfcil:
# options, e.g. --method.adc false); RUN names the runs ($W/runs/${RUN}_authors_s<seed>.log, dfcil_${RUN}_s<seed>/).
# The authors' side: their configs/cifar100/apr.yaml with --cfg-options: PyCIL's ResNet-32 (apr.patch registers it as
# backbone resnet32; setup copies PyCIL's convs/cifar_resnet.py from the FeCAM clone, as efc.sh), 5 classes a task,
# step schedules (their code's `type: step`; their yaml anneals by a cosine, dfcil's preset steps: a documented
# departure), loaders without workers, and the pseudo-replay's and ADC's counts at the authors' fractions of a task
# (200 and 1000 of 5000 images: 20 and 100 of 500), the pseudo-batch twice the real one (their 64 and 32: 50, 25).
# Their iCIFAR100 reads torchvision's CIFAR100 at ./data (the reduced folder pycil20_100, whose PyCIL shuffle with
# seed 1993 is ORDER20) and imports libs/ from the clone's root (PYTHONPATH=.).
# dfcil's apr is newer than DFCIL_COMMIT: its side runs a clone of its own at APR_DFCIL_COMMIT.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# The protocol's schedule (the other sections: 20 first-task epochs, 10 later) halved once more to fit the
# comparison's hour on the shared 2-core machine (a later APR epoch took 60 to 110 s on one thread there with
# another run beside it, ADC 5 to 8 min a run; 24 to 38 min a run): first task SGD lr 0.1, wd 5e-4, 10 epochs x0.1
# at 3, 6, 8 (the authors' 200 at 60, 120, 160 as PyCIL steps, / 20); later tasks SGD lr 0.01, wd 2e-4, 5 epochs
# x0.1 at 2, 4 (100 at 45, 90, / 20); momentum 0.9. INIT_EPOCHS=20 INIT_MILESTONES="[6, 12, 16]" EPOCHS=10
# MILESTONES="[5, 9]" give the prepared schedule of the other sections.
INIT_EPOCHS=${INIT_EPOCHS:-10}; INIT_MILESTONES=${INIT_MILESTONES:-"[3, 6, 8]"}
EPOCHS=${EPOCHS:-5}; MILESTONES=${MILESTONES:-"[2, 4]"}
INIT_BS=50; BS=25; P_BS=50; PER_CLASS=20; ADC_SAMPLES=100   # their 64, 32, 64, 200, 1000 (CIFAR-100, 500 a class)
APR_DFCIL_COMMIT=16cdaffd870b2c3e8591405b7cb7cb0119be0dbd
APR_DFCIL=${APR_DFCIL:-$W/dfcil-apr}   # a clone at APR_DFCIL_COMMIT with its .venv (setup makes it)
RUN=${RUN:-apr}
nospace() { echo "$1" | tr -d ' '; }   # "[3, 6, 8]" -> "[3,6,8]": one --cfg-options item

[ "${BASH_SOURCE[0]}" = "$0" ] || return 0   # sourced: the settings only
S=$2
case "$1" in
  setup)
    setup_authors_venv; setup_dfcil_at "$APR_DFCIL" $APR_DFCIL_COMMIT
    # tools/train.py reads its configs with omegaconf (not in requirements-authors.txt: the other codes do not use it)
    "$W/venv-authors/bin/python" -c "import omegaconf" 2>/dev/null || "$W/venv-authors/bin/pip" install -q omegaconf==2.4.0
    make_data pycil20_100 --pycil-seed 1993 --num-classes 20 --train-per-class 100   # as dpcr.sh
    checkout fecam dipamgoswami/FeCAM $FECAM_COMMIT fecam.patch   # as efc.sh; the patch leaves convs/ alone
    if [ ! -d "$W/apr" ]; then
      checkout apr hirotomusiker/APR-EFCIL $APR_COMMIT apr.patch
      git -C "$W/fecam" show $FECAM_COMMIT:convs/cifar_resnet.py > "$W/apr/libs/nets/backbones/pycil_cifar_resnet.py"
    fi
    ln -sfn ../data/pycil20_100 "$W/apr/data" ;;   # iCIFAR100 reads torchvision's CIFAR100 at ./data
  authors)
    shift 2
    export PYTHONPATH=.   # tools/train.py imports libs/ from the clone's root (their docker's working directory)
    timed "$RUN authors $S" authors_python "$W/apr" "$W/runs/${RUN}_authors_s$S.out" \
      tools/train.py configs/cifar100/apr.yaml --device cpu --seed $S --clsseed 1993 \
      --logfile "$W/runs/${RUN}_authors_s$S.log" --resultcsv "$W/runs/${RUN}_authors.csv" \
      --cfg-options net.backbone_type=resnet32 incremental.init_cls=5 incremental.increment=5 \
      init_scheduler.type=step init_scheduler.total_epochs=$INIT_EPOCHS "init_scheduler.milestones=$(nospace "$INIT_MILESTONES")" \
      incremental_scheduler.type=step incremental_scheduler.total_epochs=$EPOCHS \
      "incremental_scheduler.milestones=$(nospace "$MILESTONES")" \
      data.train.init_batch_size=$INIT_BS data.train.batch_size=$BS data.train.num_workers=0 data.test.num_workers=0 \
      apr.apr_sample_limit=$PER_CLASS apr.p_batchsize=$P_BS adc.adc_sample_limit=$ADC_SAMPLES \
      data.cifar10policy=False data.cifar10colorjitter=False apr.colorjitter=False apr.cifar10policy=False \
      log.interval=1 "$@" ;;
  dfcil)
    shift 2
    [ "$(git -C "$APR_DFCIL" rev-parse HEAD)" = $APR_DFCIL_COMMIT ] || { echo "$APR_DFCIL is not at $APR_DFCIL_COMMIT" >&2; exit 2; }
    out=$W/runs/dfcil_${RUN}_s$S
    timed "$RUN dfcil $S" bash -c 'cd "$1" && shift && exec nice -n 10 .venv/bin/dfcil train "$@"' _ "$APR_DFCIL" \
      --data.root "$DATA" --device cpu --config configs/cifar100/n10.yaml --config configs/cifar100/apr.yaml \
      --model.backbone resnet32_relu --data.crop_fill black \
      --data.num_classes 20 --data.num_tasks 4 --data.class_order "$ORDER20" --data.train_per_class 100 \
      --method.first.epochs $INIT_EPOCHS --method.first.milestones "$INIT_MILESTONES" --method.first.batch_size $INIT_BS \
      --train.epochs $EPOCHS --train.milestones "$MILESTONES" --train.batch_size $BS \
      --method.replay.per_class $PER_CLASS --method.replay.batch_size $P_BS --method.drift.samples $ADC_SAMPLES \
      --seed $S --no-estimate "$@" --out "$out" > "$out.log" 2>&1 ;;
  all)
    bash "$0" setup; for s in 1 2; do bash "$0" authors $s; bash "$0" dfcil $s; done ;;
  *) echo "usage: $0 setup | authors SEED [ARGS] | dfcil SEED [ARGS] | all" >&2; exit 2 ;;
esac
