#!/usr/bin/env python3
"""Collect the per-task accuracy rows A_t (accuracy % on all classes seen after task t) of every run under runs/.
authors' FeCAM: the log's last 'FeCAM top1 curve'; authors' LDC: the last 'CNN top1 curve' (with NCM: true that
is the nearest-mean classifier's accuracy); authors' EFC: the task-agnostic accuracy matrix in its output folder,
averaged over the seen tasks (every task has 500 test images, so that is the accuracy on all seen classes);
authors' DPCR: the last 'CNN top1 curve' (its ridge head); authors' AdaGauss: FACIL's task-agnostic accuracy
matrix (results/acc_tag-*.txt, one row per training task, one column per test task) averaged over the seen tasks;
authors' APR: the log's 'Mahalanobis accuracy list' (and its 'Mahalanobis accuracy' rows: one per task, one column
per task's classes, for old/new); dfcil: summary.json's acc_per_task. Wall times: runs/wall.tsv (common.sh's
`timed`). Prints a markdown table and writes runs/results.json. AdaGauss's runs are named by adagauss.sh's RUN
(ADAGAUSS_RUN here, the same default).
Usage: W=... python benchmarks/authors/collect.py"""

import glob
import json
import os
import re

METHODS = ("fecam", "ldc", "efc", "dpcr", "adagauss", "apr")
W = os.environ.get("W", os.path.expanduser("~/dfcil-authors"))
R = os.path.join(W, "runs")
RUNS = {"adagauss": os.environ.get("ADAGAUSS_RUN", "adagauss_ad100")}  # a method's run name, where not its own


def run(m):
    return RUNS.get(m, m)


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def lines(log):
    return read(log).replace("\r", "\n").splitlines()


def floats(s):
    return [float(x) for x in re.findall(r"(?:np\.float64\()?(-?\d+(?:\.\d+)?)\)?", s)]


def pycil_curve(log, key):
    rows = [line for line in lines(log) if key in line]
    return floats(rows[-1].split(key, 1)[1]) if rows else None


def efc_rows(folder):
    """EFC's logger/acc_tag.out: row t = task-agnostic accuracy (%) on each task's test set after task t."""
    files = sorted(glob.glob(os.path.join(folder, "*", "logger", "acc_tag.out")))
    if not files:
        return None
    m = [[float(x) for x in line.split(",")] for line in read(files[-1]).splitlines() if line.strip()]
    rows = [round(sum(r[: t + 1]) / (t + 1), 2) for t, r in enumerate(m) if any(r[: t + 1]) or t == 0]
    return rows if len(rows) == len(m) else None  # a run still going (rows of zeros) gives none


def facil_tag(folder):
    """FACIL's results/acc_tag-*.txt under ``folder`` (AdaGauss): the matrix acc_tag[t][u], the task-agnostic
    accuracy (a fraction) on test task u after training task t (main_incremental.py fills acc_tag[t, u]), or None
    while a run has not written it."""
    files = sorted(glob.glob(os.path.join(folder, "*", "results", "acc_tag-*.txt")))
    if not files:
        return None
    return [[float(x) for x in line.split()] for line in read(files[-1]).splitlines() if line.strip()]


def facil_rows(folder):
    """A_t (%): row t's mean over the test tasks seen so far (every task has as many test images)."""
    m = facil_tag(folder)
    return [round(100 * sum(m[t][: t + 1]) / (t + 1), 2) for t in range(len(m))] if m else None


def facil_old_new(folder):
    """(old, new) accuracy (%) after each task t: row t's mean over the earlier test tasks, and test task t."""
    m = facil_tag(folder) or []
    return [(round(100 * sum(m[t][:t]) / t, 2) if t else None, round(100 * m[t][t], 2)) for t in range(len(m))]


def apr_rows(log):
    """APR's A_t (%) from its last 'Mahalanobis accuracy list: a, b, ..., avg: ...' line."""
    rows = [line for line in lines(log) if "Mahalanobis accuracy list:" in line]
    return floats(rows[-1].split("accuracy list:", 1)[1].split("avg:", 1)[0]) if rows else None


def apr_old_new(log):
    """(old, new) accuracy (%) after each task from APR's 'Mahalanobis accuracy   : ...' rows (5 classes a task)."""
    res = []
    for line in lines(log):
        if "Mahalanobis accuracy   :" in line:
            row = floats(line.split(":", 3)[-1])
            t = len(res)
            res.append((round(sum(row[:t]) / t, 2) if t else None, row[t]))
    return res


def summary(d):
    p = os.path.join(d, "summary.json")
    return json.loads(read(p)) if os.path.exists(p) else None


def dfcil_rows(d):
    s = summary(d)
    return [round(float(x), 2) for x in s["acc_per_task"]] if s else None


def pycil_old_new(log, key):
    """(old, new) accuracy after each task from PyCIL's grouped dict lines ('FeCAM: {...}' / 'CNN: {...}')."""
    res = []
    for line in lines(log):
        if key in line and "'old'" in line:
            d = line.split(key, 1)[1].replace("np.float64(", "").replace(")", "")
            old, new = re.search(r"'old': ([0-9.]+)", d), re.search(r"'new': ([0-9.]+)", d)
            res.append((float(old.group(1)) if old else None, float(new.group(1)) if new else None))
    return res


def walltimes():
    """(wall_s, rc) of each run from runs/wall.tsv, lines "METHOD SIDE SEED<TAB>rc<TAB>wall_s" (the last counts)."""
    t = {}
    if os.path.exists(f"{R}/wall.tsv"):
        for line in read(f"{R}/wall.tsv").splitlines():
            label, rc, wall = line.split("\t")
            m, side, seed = label.split()
            t[f"{m}/{side}/s{seed}"] = (int(wall), int(rc))
    return t


def main():
    out, extra = {}, {}
    for m in METHODS:
        for s in (1, 2):
            log = f"{R}/{m}_authors_s{s}.log"
            a = None
            if m == "fecam" and os.path.exists(log):
                a = pycil_curve(log, "FeCAM top1 curve:")
            if m in ("ldc", "dpcr") and os.path.exists(log):
                a = pycil_curve(log, "CNN top1 curve:")
            if m == "efc":
                a = efc_rows(f"{R}/efc_authors_s{s}")
            if m == "adagauss":
                a = facil_rows(f"{R}/{run(m)}_authors_s{s}")
            if m == "apr" and os.path.exists(log):
                a = apr_rows(log)
            out[f"{m}/authors/s{s}"] = a
            out[f"{m}/dfcil/s{s}"] = dfcil_rows(f"{R}/dfcil_{run(m)}_s{s}")
    for m, key in (("fecam", "FeCAM: {"), ("ldc", "CNN: {"), ("dpcr", "CNN: {")):
        for s in (1, 2):
            if os.path.exists(f"{R}/{m}_authors_s{s}.log"):
                extra[f"{m}/authors/s{s}"] = pycil_old_new(f"{R}/{m}_authors_s{s}.log", key)
    for s in (1, 2):
        if facil_tag(f"{R}/{run('adagauss')}_authors_s{s}"):
            extra[f"adagauss/authors/s{s}"] = facil_old_new(f"{R}/{run('adagauss')}_authors_s{s}")
    for s in (1, 2):
        if os.path.exists(f"{R}/apr_authors_s{s}.log"):
            extra[f"apr/authors/s{s}"] = apr_old_new(f"{R}/apr_authors_s{s}.log")
    for m in METHODS:
        for s in (1, 2):
            j = summary(f"{R}/dfcil_{run(m)}_s{s}")
            if j:
                extra[f"{m}/dfcil/s{s}"] = list(zip(j["old_acc"], j["new_acc"], strict=True))
    wt = walltimes()
    with open(f"{R}/results.json", "w") as f:
        json.dump({"A_t": out, "old_new": extra, "wall_s": wt}, f, indent=1)
    for m in METHODS:
        print(f"\n{m}: A_t after tasks 1..4 (%), wall time")
        for side in ("authors", "dfcil"):
            rows = [out[f"{m}/{side}/s{s}"] for s in (1, 2)]
            for s, v in zip((1, 2), rows, strict=True):
                w = wt.get(f"{run(m)}/{side}/s{s}", ("?", "?"))[0]
                cells = " | ".join(f"{x:.2f}" for x in v) if v else "— | — | — | —"
                print(f"| {side} seed {s} | {cells} | {w} s |")
            if all(rows) and len({len(r) for r in rows}) == 1:  # a run still going has a shorter row
                means = " | ".join(f"{(a + b) / 2:.2f}" for a, b in zip(*rows, strict=True))
                print(f"| {side} mean | {means} | |")
        for k in (f"{m}/authors/s1", f"{m}/authors/s2", f"{m}/dfcil/s1", f"{m}/dfcil/s2"):
            if k in extra:
                print("  old/new", k, list(extra[k]))


if __name__ == "__main__":
    main()
