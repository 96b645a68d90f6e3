#!/usr/bin/python3
"""Before/after view of two attnlab results folders: per-point speed-ups.

    /usr/bin/python3 scripts/compare.py RUN_A RUN_B [--out DIR]

Joins the points both folders measured (status ok, same point id: kernel, shape, mask,
threads) and reports speed-up = time(A) / time(B) (> 1: B is faster), with each side's
min-max spread over repetitions, a two-sided Mann-Whitney U test over the repetitions (as
Google Benchmark's compare.py; from points/<id>.json or bench.json, scipy), plus the geometric-mean
speed-up per kernel. Flags what differs between the two runs' machines (CPU, default ISA,
measured peaks), since a speed-up across machines is not a code change. Prints the table as
Markdown and writes compare.md and compare.png to --out (default: RUN_B/compare-vs-<name of
RUN_A>). Reads the two results.csv files, points/ and machine.json.
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import best_peaks, kernel_order, load_results, ok_rows, repetition_times  # noqa: E402
from report.load import id_of_name  # noqa: E402,F401  (tests import it from here)

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(folder, machine):
    git = machine.get("git", {}).get("commit", "?")[:10]
    return f"{os.path.basename(os.path.abspath(folder))} ({git})"


ALPHA = 0.05  # significance level of the U test


def u_test(ta, tb):
    """Two-sided Mann-Whitney U p-value of two samples of repetition times; None without scipy or
    with fewer than 2 repetitions on a side."""
    if not ta or not tb or len(ta) < 2 or len(tb) < 2:
        return None
    try:
        from scipy.stats import mannwhitneyu
    except ImportError:
        return None
    return float(mannwhitneyu(ta, tb, alternative="two-sided").pvalue)


def machine_differences(ma, mb):
    """What differs between the two runs' machines (CPU, ISA, measured peaks > 10% apart)."""
    out = []
    for key in ("cpu_model", "cores"):
        if ma.get(key) != mb.get(key):
            out.append(f"{key}: {ma.get(key)} vs {mb.get(key)}")
    ia, ib = ma.get("isa", {}), mb.get("isa", {})
    if ia.get("default") != ib.get("default"):
        out.append(f"default ISA: {ia.get('default')} vs {ib.get('default')}")

    # Each run's peaks by the report's rule: the larger of the measurements before and after
    # its points (best_peaks), so one contended measurement is not flagged as another machine.
    pa, pb = best_peaks(ma), best_peaks(mb)
    for key in sorted(set(pa) & set(pb), key=str):
        for i, (field, unit, scale) in enumerate((("fma_flops", "GFLOP/s", 1e9), ("read_bytes", "GB/s", 1e9))):
            x, y = pa[key][i], pb[key][i]
            if x and y and abs(y / x - 1) > 0.10:
                out.append(f"{key[0]} {key[1]} threads {field}: {x / scale:.1f} vs {y / scale:.1f} {unit}")
    return out


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
    md = [f"# Compare: A = {la}, B = {lb}", ""]
    diff = machine_differences(mach_a or {}, mach_b or {})
    if diff:
        md += ["**The two runs' machines differ** (a speed-up here is not only the code): " + "; ".join(diff) + ".", ""]
    md += ["Speed-up = time(A) / time(B): above 1 means B is faster. p: two-sided Mann-Whitney U test over the "
           f"repetitions (as Google Benchmark's compare.py); 'within noise' marks points with p >= {ALPHA}, or, "
           "without a test (under 2 repetitions, no scipy), whose min-max ranges overlap.", "",
           "| point | A ms | B ms | speed-up | p | |", "|---|---|---|---|---|---|"]
    speedups, pvalues = {}, {}
    for i in common:
        ra, rb = a[i], b[i]
        s = ra["time_median_s"] / rb["time_median_s"]
        speedups.setdefault(rb["kernel"], []).append(s)
        p = u_test(repetition_times(run_a, i), repetition_times(run_b, i))
        pvalues[i] = p
        noise = overlaps(ra, rb) if p is None else p >= ALPHA
        md.append(f"| {i} | {ra['time_median_s'] * 1e3:.4g} | {rb['time_median_s'] * 1e3:.4g} | {s:.3f} | "
                  f"{'-' if p is None else f'{p:.3g}'} | {'within noise' if noise else ''} |")
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
    # Solid: significant (p < ALPHA); faded: within noise. Whiskers: the ratio's range from the
    # two sides' min-max times.
    alphas = [1.0 if pvalues[i] is not None and pvalues[i] < ALPHA else 0.35 for i in common]
    lo = [v - a[i]["time_min_s"] / b[i]["time_max_s"] for v, i in zip(vals, common)]
    hi = [a[i]["time_max_s"] / b[i]["time_min_s"] - v for v, i in zip(vals, common)]
    for y, v, c, al in zip(ys, vals, colors, alphas):
        ax.barh(y, v, color=c, alpha=al)
    ax.errorbar(vals, list(ys), xerr=[[max(0, x) for x in lo], [max(0, x) for x in hi]], fmt="none",
                ecolor="black", elinewidth=0.6, capsize=1.5)
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
           f"where B is faster; solid bars are significant (U test p < {ALPHA}), faded ones within noise; whiskers "
           "span the ratio's range from the two runs' min-max times.*", ""]
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
