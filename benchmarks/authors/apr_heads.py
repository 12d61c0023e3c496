#!/usr/bin/env python3
"""Diagnostic (ours, not the authors'): a finished dfcil `apr` run of apr.sh scored by the three heads the authors'
code logs after every task, here for the final network only: Linear (the trained cosine head), NCM (the nearest
L2-normalised stored prototype) and Mahalanobis (the run's own precisions: reproduces its summary.json), per task of
5 classes of ORDER20 (all 100 test images a class). Run with the dfcil venv of apr.sh:
  $W/dfcil-apr/.venv/bin/python benchmarks/authors/apr_heads.py $W/runs/dfcil_apr_s1 $DATA"""

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dfcil.checkpoint import loads
from dfcil.model_file import network_from

ORDER20 = [68, 56, 78, 8, 23, 84, 90, 65, 74, 76, 40, 89, 3, 92, 55, 9, 26, 80, 43, 38]
MEAN, STD = torch.tensor((0.5071, 0.4867, 0.4408)), torch.tensor((0.2675, 0.2565, 0.2761))


def main(run: Path, root: Path) -> None:
    payload = loads((run / "model.pt").read_bytes(), "model.pt")
    net = network_from(payload)
    state = payload["method_state"]
    means, precisions = state["means"].float(), state["precisions"].float()
    d = np.load(root / "cifar100" / "test.npz")
    keep = np.isin(d["y"], ORDER20)
    y = torch.tensor([ORDER20.index(int(v)) for v in d["y"][keep]])
    x = ((torch.tensor(d["x"][keep]).float() / 255 - MEAN) / STD).permute(0, 3, 1, 2)
    with torch.no_grad():
        outs = [net(b) for b in x.split(250)]
    feats = F.normalize(torch.cat([o.features for o in outs]), dim=1)
    mu = F.normalize(means, dim=1)
    diff = feats[:, None] - mu[None]
    preds = {
        "Linear": torch.cat([o.logits for o in outs]).argmax(1),
        "NCM": torch.cdist(feats, mu).argmin(1),
        "Mahalanobis": torch.einsum("bcd,cde,bce->bc", diff, precisions, diff).argmin(1),
    }
    for name, p in preds.items():
        rows = [100 * float((p[y // 5 == t] == y[y // 5 == t]).float().mean()) for t in range(4)]
        print(f"{name} accuracy: {', '.join(f'{a:.2f}' for a in rows)}; all {100 * float((p == y).float().mean()):.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
