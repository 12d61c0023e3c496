# Installed by common.sh into the authors' venv (site-packages/sitecustomize.py), not into any authors' file.
# 1. one CPU thread for every process (as every run of the comparison; common.sh sets OMP_NUM_THREADS=1 too)
# 2. torchvision's CIFAR-100 reads the local cifar-100-python/ folder written by make_cifar_pickles.py: there is no
#    network where it first ran, and a reduced folder cannot match the official archive's md5 anyway, so the
#    integrity check and the download are skipped (the pickles are read exactly as torchvision reads the official ones).
import os

if os.environ.get("AUTHORS_CPU_SHIM", "1") == "1":
    try:
        import torch

        torch.set_num_threads(1)
        import torchvision.datasets.cifar as _c

        _c.CIFAR10._check_integrity = lambda self: True
        _c.CIFAR10.download = lambda self: None
        _c.check_integrity = lambda *a, **k: True  # meta file md5 (module-level helper in cifar.py)
    except Exception as e:  # never break the interpreter
        print("sitecustomize shim failed:", e)
