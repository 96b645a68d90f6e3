"""Plots of masks and sparse patterns."""

import collections
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from . import schema
from .figures import fmt, fmt_bytes, int_ticks, log_y_labels
from .load import describe_fixed, hold_fixed, is_prefill


def plot_masks(plots, ok, kernels):
    if len({r["mask"] for r in ok}) < 2:
        return
    rows, fixed = hold_fixed(ok, {"mask"})
    masks = []
    for r in sorted(rows, key=lambda r: -r["visible_pairs"]):
        if r["mask"] not in masks:
            masks.append(r["mask"])
    full = max(r["visible_pairs"] for r in rows)
    present = [k for k in kernels if any(r["kernel"] == k for r in rows)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    width = 0.8 / max(1, len(present))
    for i, k in enumerate(present):
        t = {r["mask"]: r for r in rows if r["kernel"] == k}
        xs = [j + (i - (len(present) - 1) / 2) * width for j, m in enumerate(masks) if m in t]
        a1.bar(xs, [t[m]["time_median_s"] * 1e3 for m in masks if m in t], width=width, **plots.bar_style(k), label=k)
        a2.bar(xs, [t[m]["gflops"] for m in masks if m in t], width=width, **plots.bar_style(k), label=k)
    vis = {r["mask"]: r["visible_pairs"] / full for r in rows}
    labels = [f"{m}\n({100 * vis[m]:.0f}% visible)" for m in masks]
    for a in (a1, a2):
        a.set_xticks(range(len(masks)))
        a.set_xticklabels(labels, fontsize=7, rotation=30, ha="right")
        log_y_labels(a)
        a.grid(True, axis="y", which="both", alpha=0.3)
    a1.set_ylabel("time (ms, median, log)")
    a2.set_ylabel("GFLOP/s (visible pairs only, log)")
    a1.set_title("Time per mask")
    a2.set_title("Throughput per mask")
    a1.legend(fontsize=7)
    plots.save(fig, "masks.png", "Masks",
               "Time and GFLOP/s per mask, masks ordered by the fraction of query-key pairs they leave visible. "
               "FLOPs count visible pairs only, so a kernel that skips fully masked tiles keeps its GFLOP/s "
               "while its time falls with the visible fraction; one that computes everything and masks "
               f"afterwards loses GFLOP/s instead. Held fixed: {describe_fixed(fixed)}.")


def pattern_family(mask):
    """A mask name without the parts that follow n: an experiment's {"spread": N} globals and
    {"mean": M} documents are lists that change with n, so each n gets its own name (e.g.
    global16h25a94191, docs17h33cc0ce5 or docs512.1536); a family (global16, docs) is one line."""
    mask = re.sub(r"docs(\d+h[0-9a-f]{8}|\d+(\.\d+)*)", "docs", mask)
    # globalNhHASH: N positions (a long list); globalA.B.C: the positions themselves.
    return re.sub(r"global(\d+)(h[0-9a-f]{8}|(\.\d+)*)",
                  lambda m: "global" + (m.group(1) if m.group(2).startswith("h")
                                        else str(1 + m.group(2).count("."))), mask)


def plot_sparse(plots, ok):
    """Sparse patterns (results with a `pattern` column set): time vs n per mask with each
    pattern's fitted exponent, and the skipping efficiency = dense time x density / time at the
    same n (1.0: the kernel pays only for visible pairs)."""
    if not any(r.get("pattern") for r in ok):
        return
    pre = [r for r in ok if is_prefill(r)]
    series = collections.defaultdict(dict)  # (kernel, shape without q_len/kv_len/mask) -> family -> n -> row
    for r in pre:
        shape = tuple(r[k] for k in schema.SHAPE_KEYS if k not in ("q_len", "kv_len", "mask"))
        series[(r["kernel"], shape)].setdefault(pattern_family(r["mask"]), {})[r["q_len"]] = r
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(15, 5.8))
    cmap = plt.get_cmap("tab10")
    table = ["| kernel | mask | fitted exponent (n >= 4096) | density at each n | skipping efficiency at each n | "
             "GFLOP/s, % of peak at the largest n | plan memory at the largest n |",
             "|---|---|---|---|---|---|---|"]
    all_n = set()
    for (kernel, shape), by_mask in sorted(series.items()):
        dense = by_mask.get("none", {})
        masks = sorted(by_mask, key=lambda m: (m != "none", m != "causal", m))
        for mi, m in enumerate(masks):
            pts = by_mask[m]
            ns = sorted(pts)
            all_n.update(ns)
            big = [n for n in ns if n >= 4096]
            slope = None
            if len(big) >= 2:
                slope = float(np.polyfit(np.log(big), np.log([pts[n]["time_median_s"] for n in big]), 1)[0])
            label = f"{kernel} {m}" + (f": n^{slope:.2f}" if slope is not None else "")
            color = cmap(mi % 10)
            a1.plot(ns, [pts[n]["time_median_s"] * 1e3 for n in ns], marker="o", color=color, label=label)
            eff = {n: dense[n]["time_median_s"] * pts[n]["density"] / pts[n]["time_median_s"]
                   for n in ns if n in dense and pts[n].get("density")}
            if eff and m != "none":
                en = sorted(eff)
                a2.plot(en, [eff[n] for n in en], marker="o", color=color, label=f"{kernel} {m}")
            last = pts[ns[-1]]
            table.append(
                f"| {kernel} | {m} | {fmt(slope, '.2f')} | "
                + ", ".join(f"{n}: {100 * pts[n]['density']:.3g}%" for n in ns if pts[n].get("density") is not None)
                + " | " + (", ".join(f"{n}: {eff[n]:.2f}" for n in sorted(eff)) or "-")
                + f" | n {ns[-1]}: {fmt(last['gflops'], '.1f')}, "
                  f"{fmt(None if last['peak_fraction'] is None else 100 * last['peak_fraction'], '.1f')}% | "
                  f"{fmt_bytes(last.get('plan_bytes') or 0)} |")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        int_ticks(a, sorted(all_n))
        a.set_xlabel("sequence length n = q_len = kv_len (tokens)")
        a.grid(True, which="both", alpha=0.3)
    log_y_labels(a1)
    ns = sorted(all_n)
    a1.set_ylabel("time per forward pass (ms, median, log)")
    a1.set_title("Time vs n per pattern (fitted exponent over n >= 4096)")
    a1.legend(fontsize=6, loc="upper left")
    a2.axhline(1.0, color="gray", linewidth=1)
    a2.axhline(0.8, color="gray", linewidth=1, linestyle="--")
    a2.set_ylabel("skipping efficiency: dense time x density / time")
    a2.set_title("What skipping buys (1.0 = pays only for visible pairs)")
    a2.legend(fontsize=6)
    fig.tight_layout()
    plots.save(fig, "sparse.png", "Sparse patterns: block skipping",
               "Left: time per call against the sequence length for each mask (pattern), log-log; the legend "
               "gives each one's fitted exponent over n >= 4096 (dense ~2, window-like patterns ~1). Right: "
               "skipping efficiency = (time of the dense problem at the same n x the pattern's density) / the "
               "pattern's time, where density is the fraction of query-key pairs the pattern leaves visible: "
               "1.0 means the kernel pays only for the visible pairs, below it the partial tiles (masked "
               "element by element) and the per-tile overheads cost extra; the dashed line is 0.8. Plan memory "
               "is the block map built once per problem outside the timed region.", table + [""])
