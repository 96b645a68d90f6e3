#!/usr/bin/python3
"""Before/after view of two attnlab results folders: per-point speed-ups.

    /usr/bin/python3 scripts/compare.py RUN_A RUN_B [--out DIR]

Joins the points both folders measured (status ok, same point id: kernel, shape, mask,
threads) and reports speed-up = time(A) / time(B) (> 1: B is faster), with each side's
min-max spread over repetitions, plus the geometric-mean speed-up per kernel. Prints the
table as Markdown and writes compare.md and compare.png to --out (default:
RUN_B/compare-vs-<name of RUN_A>). Reads only the two results.csv files (and machine.json
for the commit of each run).
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import load_results, ok_rows, kernel_order  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(folder, machine):
    git = machine.get("git", {}).get("commit", "?")[:10]
    return f"{os.path.basename(os.path.abspath(folder))} ({git})"


def overlaps(a, b):
    """Whether the min-max ranges of two points overlap (the difference is within noise)."""
    return not (a["time_max_s"] < b["time_min_s"] or b["time_max_s"] < a["time_min_s"])


def compare(run_a, run_b, out):
    rows_a, mach_a, _, _ = load_results(run_a)
    rows_b, mach_b, _, _ = load_results(run_b)
    a = {r["id"]: r for r in ok_rows(rows_a)}
    b = {r["id"]: r for r in ok_rows(rows_b)}
    common = [i for i in (r["id"] for r in ok_rows(rows_b)) if i in a]
    if not common:
        raise SystemExit(f"compare: {run_a} and {run_b} have no measured point in common; allowed: two runs "
                         "of experiments sharing points (same kernel, shape, mask, threads)")
    kernels = kernel_order(rows_a + rows_b, mach_b or mach_a)
    common.sort(key=lambda i: (kernels.index(b[i]["kernel"]), b[i]["flops"], i))

    la, lb = label(run_a, mach_a), label(run_b, mach_b)
    md = [f"# Compare: A = {la}, B = {lb}", "",
          "Speed-up = time(A) / time(B): above 1 means B is faster. 'within noise' marks points whose min-max "
          "ranges over repetitions overlap.", "",
          "| point | A ms | B ms | speed-up | |", "|---|---|---|---|---|"]
    speedups = {}
    for i in common:
        ra, rb = a[i], b[i]
        s = ra["time_median_s"] / rb["time_median_s"]
        speedups.setdefault(rb["kernel"], []).append(s)
        md.append(f"| {i} | {ra['time_median_s'] * 1e3:.4g} | {rb['time_median_s'] * 1e3:.4g} | {s:.3f} | "
                  f"{'within noise' if overlaps(ra, rb) else ''} |")
    md += ["", "| kernel | points | geometric-mean speed-up | min | max |", "|---|---|---|---|---|"]
    for k in kernels:
        if k not in speedups:
            continue
        v = speedups[k]
        g = math.exp(sum(math.log(x) for x in v) / len(v))
        md.append(f"| {k} | {len(v)} | {g:.3f} | {min(v):.3f} | {max(v):.3f} |")
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    if only_a or only_b:
        md += ["", f"Measured in only one run: {len(only_a)} in A, {len(only_b)} in B (not compared)."]

    os.makedirs(out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, max(3, 0.28 * len(common) + 1.5)))
    ys = range(len(common))
    vals = [a[i]["time_median_s"] / b[i]["time_median_s"] for i in common]
    cmap = plt.get_cmap("tab10")
    colors = [cmap(kernels.index(b[i]["kernel"]) % 10) for i in common]
    ax.barh(list(ys), vals, color=colors)
    ax.axvline(1, color="gray", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(list(ys))
    ax.set_yticklabels(common, fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("speed-up time(A) / time(B) (log scale; > 1: B faster)")
    ax.set_title(f"A = {la}\nB = {lb}", fontsize=9)
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "compare.png"), dpi=110)
    plt.close(fig)
    md += ["", "![speed-ups](compare.png)", "",
           "*Per-point speed-up of B over A, coloured by kernel, on a log axis: bars right of the line are points "
           "where B is faster.*", ""]
    text = "\n".join(md)
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write(text)
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", help="results folder A (before)")
    ap.add_argument("run_b", help="results folder B (after)")
    ap.add_argument("--out", help="folder for compare.md and compare.png")
    args = ap.parse_args(argv)
    out = args.out or os.path.join(args.run_b, "compare-vs-" + os.path.basename(os.path.abspath(args.run_a)))
    print(compare(args.run_a, args.run_b, out))
    print(f"\nwritten: {os.path.join(out, 'compare.md')}, {os.path.join(out, 'compare.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
