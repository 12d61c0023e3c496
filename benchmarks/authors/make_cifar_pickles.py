#!/usr/bin/env python3
"""Write a torchvision-style `cifar-100-python/` folder (train, test, meta pickles) holding a few CIFAR-100 classes.

Read from dfcil's data root (`--data-root`, the folder given to dfcil as `--data.root`): its prepared arrays
`cifar100/{train,test}.npz` (x, y, y_coarse, fine_names, coarse_names), or else the official `cifar-100-python/`.

The folder holds only K classes, relabelled 0..K-1, and the first `--train-per-class` training images of each
(in the official file order, which is the npz order; dfcil's `data.train_per_class` takes the same ones), and all
100 test images of each.

`--pycil-seed S --num-classes K`: the classes are the first K of PyCIL's class order for CIFAR-100
(np.random.seed(S); np.random.permutation(100)), and the reduced labels are assigned so that PyCIL's own shuffle
of the K-class folder (np.random.seed(S); np.random.permutation(K)) puts them back in exactly that order. So a PyCIL
code (FeCAM, LDC) run unchanged on the folder with seed S trains the first K classes of its usual CIFAR-100 order.
`--raw-order a,b,c,...`: reduced label j is raw class a_j (for codes that take the order as given).

Test images keep the source's order within each class (the npz holds the test set sorted by class, the official
file interleaves the classes; no accuracy depends on it). Keys are str (what torchvision's loader,
pickle.load(f, encoding="latin1"), yields from the official py2 pickles).
Prints the class order in raw CIFAR-100 ids (what to pass to dfcil as --data.class_order).
"""

import argparse
import json
import os
import pickle

import numpy as np


def load_split(root, split):
    """x (uint8 [N, 32, 32, 3]), y, y_coarse, fine_names, coarse_names of a split: npz, else the official pickles."""
    npz = os.path.join(root, "cifar100", f"{split}.npz")
    if os.path.exists(npz):
        return np.load(npz)
    official = os.path.join(root, "cifar-100-python")
    with open(os.path.join(official, split), "rb") as f:
        entry = pickle.load(f, encoding="latin1")
    with open(os.path.join(official, "meta"), "rb") as f:
        meta = pickle.load(f, encoding="latin1")
    x = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return {
        "x": x,
        "y": np.asarray(entry["fine_labels"]),
        "y_coarse": np.asarray(entry["coarse_labels"]),
        "fine_names": meta["fine_label_names"],
        "coarse_names": meta["coarse_label_names"],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-root", required=True, help="holds cifar100/{train,test}.npz or cifar-100-python/")
    ap.add_argument("--out", required=True, help="folder that will hold cifar-100-python/")
    ap.add_argument("--pycil-seed", type=int)
    ap.add_argument("--num-classes", type=int, default=20)
    ap.add_argument("--raw-order", type=str)
    ap.add_argument("--train-per-class", type=int, default=500)
    a = ap.parse_args()

    if a.raw_order:
        reduced_to_raw = [int(c) for c in a.raw_order.split(",")]
        order_raw = list(reduced_to_raw)
    else:
        np.random.seed(a.pycil_seed)
        order_raw = np.random.permutation(100).tolist()[: a.num_classes]  # PyCIL's order, first K classes
        np.random.seed(a.pycil_seed)
        o_k = np.random.permutation(a.num_classes).tolist()  # what PyCIL's shuffle does to a K-class folder
        reduced_to_raw = [None] * a.num_classes
        for k, lab in enumerate(o_k):  # PyCIL's k-th class is reduced label o_k[k]: make it raw order_raw[k]
            reduced_to_raw[lab] = order_raw[k]
    raw_to_reduced = {r: j for j, r in enumerate(reduced_to_raw)}

    tr, te = load_split(a.data_root, "train"), load_split(a.data_root, "test")
    names = [str(n) for n in tr["fine_names"]]
    coarse_names = [str(n) for n in tr["coarse_names"]]
    dst = os.path.join(a.out, "cifar-100-python")
    os.makedirs(dst, exist_ok=True)

    for split, d in (("train", tr), ("test", te)):
        x, y, yc = d["x"], d["y"], d["y_coarse"]
        keep, seen = [], {}
        for i, c in enumerate(y.tolist()):  # file order kept
            if c in raw_to_reduced:
                if split == "train" and seen.get(c, 0) >= a.train_per_class:
                    continue
                seen[c] = seen.get(c, 0) + 1
                keep.append(i)
        keep = np.array(keep)
        data = x[keep].transpose(0, 3, 1, 2).reshape(len(keep), 3072)  # HWC -> CHW flattened, as the pickles
        entry = {
            "filenames": [f"{split}_{i}.png" for i in keep.tolist()],
            "batch_label": f"{split} (reduced: {len(reduced_to_raw)} classes)",
            "fine_labels": [raw_to_reduced[c] for c in y[keep].tolist()],
            "coarse_labels": yc[keep].tolist(),
            "data": np.ascontiguousarray(data, dtype=np.uint8),
        }
        with open(os.path.join(dst, split), "wb") as f:
            pickle.dump(entry, f)
        print(split, len(keep), "images")
    meta = {"fine_label_names": [names[r] for r in reduced_to_raw], "coarse_label_names": list(coarse_names)}
    with open(os.path.join(dst, "meta"), "wb") as f:
        pickle.dump(meta, f)
    info = {
        "class_order_raw": order_raw,
        "reduced_label_to_raw": reduced_to_raw,
        "names_in_order": [names[r] for r in order_raw],
        "train_per_class": a.train_per_class,
    }
    with open(os.path.join(a.out, "classes.json"), "w") as f:
        json.dump(info, f, indent=1)
    print("class_order_raw", json.dumps(order_raw))


if __name__ == "__main__":
    main()
