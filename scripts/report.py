#!/usr/bin/python3
"""Writes report.md and PNG plots for one attnlab results folder, from that folder only.

    /usr/bin/python3 scripts/report.py RESULTS_DIR [--out DIR]

Reads RESULTS_DIR/results.csv (tidy, one row per point), machine.json (machine, build,
measured peaks), experiment.json and sweep.json (the plan). Writes report.md and *.png to
--out (default: RESULTS_DIR). Needs matplotlib and numpy only, so a committed results
folder can be re-reported anywhere without re-running the sweep.

Each plot is drawn when the data vary along its axis (a seq_len plot needs >= 3 sequence
lengths, a GQA plot >= 2 group sizes, ...). Parameters that are not on a plot's axis are
held at their most common value, and the caption says which values those are.

Instruction-set targets: every row names the target its kernel ran (`isa`: scalar, avx2,
avx512, neon for the SIMD kernels, "baseline" or "cuda" for kernels built once (cuda rows are
measured against the GPU's FP32 peak, machine.json's peaks "gpu"); rows of
folders written before the column existed take the machine's default target). Every % of
peak is against the FMA peak of the row's own target (peak_for, the rule of the C++
Peaks::ref). When a kernel ran on several targets, it appears as kernel[isa] throughout,
and the section "What vector width buys" sets each target's speed-up over scalar beside
the ratio of the targets' measured FMA peaks.
"""

import argparse
import collections
import csv
import json
import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

# A point's fields come from the folder's schema.json (src/bench/point_schema.hpp: the one
# table the sweep writes ids, names, counters and results.csv from). Folders written before
# schema.json held these fields, frozen here as they were:
LEGACY_SCHEMA = {
    "schema": "attnlab-point-1",
    "fields": [{"name": n, "type": t, "shape": sh} for n, t, sh in (
        ("batch", "int", True), ("q_heads", "int", True), ("kv_heads", "int", True), ("gqa_group", "int", False),
        ("q_len", "int", True), ("kv_len", "int", True), ("head_dim", "int", True), ("head_dim_v", "int", True),
        ("mask", "text", True), ("causal", "int", False), ("window_left", "int", False),
        ("window_right", "int", False), ("pattern", "text", False), ("density", "real", False),
        ("layout", "text", True), ("dtype", "text", True), ("threads", "int", True), ("model", "text", True))],
    "id": [{"key": k, "id_prefix": i, "name_prefix": f"/{k}:"} for k, i in (
        ("b", "-b"), ("hq", "-hq"), ("hkv", "-hkv"), ("sq", "-sq"), ("sk", "-sk"), ("d", "-d"), ("dv", "v"),
        ("mask", "-"), ("layout", "-"), ("dtype", "-"), ("t", "-t"), ("isa", "-"), ("model", "-"))],
}
# The measurement's columns (not point fields).
MEASURED_INT_COLS = {"visible_pairs", "extra_bytes", "plan_bytes", "memory_bytes", "repetitions", "rounds",
                     "iterations", "verify_rows"}
MEASURED_FLOAT_COLS = {"flops", "bytes", "kv_bytes", "kv_bytes_per_token", "time_median_s", "time_min_s",
                       "time_max_s", "time_mean_s", "time_stddev_s", "time_cv", "gflops", "gbytes_per_s",
                       "peak_gflops", "peak_fraction", "read_bw_gbs", "bw_fraction", "err_o_rel", "tol_o_rel",
                       "err_lse", "tol_lse", "seconds_spent", "err_o_rel_f32_inputs"}


def load_schema(folder):
    """The folder's schema.json, else LEGACY_SCHEMA."""
    path = os.path.join(folder, "schema.json")
    if not os.path.isfile(path):
        return LEGACY_SCHEMA
    with open(path) as f:
        schema = json.load(f)
    if not str(schema.get("schema", "")).startswith("attnlab-point-") or "fields" not in schema:
        raise SystemExit(f"report: {path} is not a point schema (written by attnlab sweep)")
    return schema


def use_schema(schema):
    """Sets DIMS (the shape fields plots slice on and hold fixed), SHAPE_KEYS (the same, for
    grouping rows of one shape) and the typed columns from a schema."""
    global DIMS, SHAPE_KEYS, INT_COLS, FLOAT_COLS
    fields = schema["fields"]
    DIMS = [f["name"] for f in fields if f.get("shape")]
    SHAPE_KEYS = tuple(DIMS)
    INT_COLS = MEASURED_INT_COLS | {f["name"] for f in fields if f.get("type") == "int"}
    FLOAT_COLS = MEASURED_FLOAT_COLS | {f["name"] for f in fields if f.get("type") == "real"}


use_schema(LEGACY_SCHEMA)
DECODE_MAX_Q = 16  # q_len at most this (and below kv_len) counts as decode
# What users run instead (attnlab sweep --peers; src/bench/peers.hpp), in report order.
PEERS = ("torch_sdpa", "torch_flex", "ort_mha", "ort_gqa", "jax_dpa")
PEER_COLORS = {"torch_sdpa": "black", "torch_flex": "dimgray", "ort_mha": "darkgoldenrod", "ort_gqa": "saddlebrown",
               "jax_dpa": "mediumvioletred"}


def is_peer(kernel):
    return kernel in PEERS


# ----------------------------------------------------------------------------- loading

def load_results(folder):
    """The folder's points (list of dicts with typed values), machine, experiment, plan."""
    path = os.path.join(folder, "results.csv")
    if not os.path.isfile(path):
        raise SystemExit(f"report: {path} not found; allowed: a folder written by attnlab sweep")
    use_schema(load_schema(folder))
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for key, value in raw.items():
                if key in INT_COLS:
                    row[key] = int(value) if value not in ("", None) else None
                elif key in FLOAT_COLS:
                    row[key] = float(value) if value not in ("", None) else None
                else:
                    row[key] = value
            # Folders written before 16-bit storage: float32 inputs, no separate error.
            if not row.get("dtype"):
                row["dtype"] = "f32"
            if row.get("err_o_rel_f32_inputs") is None:
                row["err_o_rel_f32_inputs"] = row.get("err_o_rel")
            # Folders written before sparse patterns: interval masks only.
            row.setdefault("pattern", "")
            # Folders written before d_v != d_qk and model labels.
            if row.get("head_dim_v") is None:
                row["head_dim_v"] = row["head_dim"]
            row.setdefault("model", "")
            if row.get("plan_bytes") is None:
                row["plan_bytes"] = 0
            rows.append(row)

    def read_json(name):
        p = os.path.join(folder, name)
        if not os.path.isfile(p):
            return {}
        with open(p) as f:
            return json.load(f)

    return rows, read_json("machine.json"), read_json("experiment.json"), read_json("sweep.json")


def kernel_order(rows, machine):
    """The kernels (labels) present in rows, in the registry's order, each one's targets
    narrowest first."""
    names = [k["name"] for k in machine.get("kernels", [])]
    targets = built_targets(machine)

    def key(r):
        name = r.get("kernel_name", r["kernel"])
        n = names.index(name) if name in names else len(names) + (PEERS.index(name) if name in PEERS else 0)
        t = targets.index(r.get("isa")) if r.get("isa") in targets else -1
        return (n, name, t)

    seen = []
    for r in sorted(rows, key=key):
        if r["kernel"] not in seen:
            seen.append(r["kernel"])
    return seen


# ----------------------------------------------------------------------------- targets and peaks

def built_targets(machine):
    """The targets the build compiled its SIMD kernels for, narrowest first ([] when the
    machine.json predates them)."""
    return list(machine.get("isa", {}).get("targets_built", []))


def default_target(machine):
    """The target the SIMD kernels ran when none was named, and whose read bandwidth and
    FMA peak the kernels built once are measured against."""
    isa = machine.get("isa", {})
    return (machine.get("peaks", {}).get("simd_arch") or isa.get("default") or isa.get("simd_arch") or "?")


def peak_targets(block):
    """isa -> rows of one peaks block of machine.json: attnlab-peak-2 lists "targets";
    attnlab-peak-1 is one target, the one its "simd_arch" names."""
    if not block:
        return {}
    if "targets" in block:
        return {t["isa"]: t.get("rows", []) for t in block["targets"]}
    return {block.get("simd_arch", "?"): block.get("rows", [])}


# The bf16-product kernels' isa labels and the peak figure (in the default target's rows of
# machine.json) their % of peak is against (src/bench/peak.hpp, Peaks::ref).
PRODUCT_PEAKS = {"avx512_bf16": "bf16_dot_flops", "amx_bf16": "amx_bf16_flops"}


def best_peaks(machine):
    """(isa, threads) -> (FLOP/s, read bytes/s): the larger of the medians measured before and
    after the points. Other jobs on the machine only ever lower a peak measurement, so the
    larger one is the better estimate of what the hardware can do. The bf16 dot-product and AMX
    peaks appear under their kernels' isa labels (PRODUCT_PEAKS)."""
    best = {}

    def keep(key, f, b):
        f0, b0 = best.get(key, (0.0, 0.0))
        best[key] = (max(f0, f), max(b0, b))

    for key in ("peaks", "peaks_after"):
        for isa, rows in peak_targets(machine.get(key, {})).items():
            for r in rows:
                keep((isa, r["threads"]), r["fma_flops"], r["read_bytes"])
                for label, field in PRODUCT_PEAKS.items():
                    if r.get(field):
                        keep((label, r["threads"]), r[field], r["read_bytes"])
    return best


def peak_for(row, best, machine):
    """The one rule for % of peak (src/bench/peak.hpp, Peaks::ref): (FMA FLOP/s, read bytes/s)
    a row is measured against at its thread count. FMA: the peak of the row's own target for
    a kernel built per target, the default target's for kernels built once (baseline);
    read bandwidth: the default target's. CUDA kernels (isa cuda): the GPU's FP32 peak and memory
    bandwidth (machine.json's peaks "gpu"), never the CPU's. None where not measured."""
    default = default_target(machine)
    isa = row.get("isa") or default
    if isa == "cuda":
        gpu = machine.get("peaks", {}).get("gpu", {})
        return gpu.get("fp32_flops") or None, gpu.get("read_bytes") or None
    fma_isa = isa if isa in built_targets(machine) or isa in PRODUCT_PEAKS else default
    f = best.get((fma_isa, row["threads"]), (None, None))[0]
    b = best.get((default, row["threads"]), (None, None))[1]
    return f or None, b or None


def label_targets(rows, machine):
    """Fills a missing isa with the machine's default target; when some kernel ran on more
    than one target, names its rows kernel[isa] (the raw name stays in kernel_name)."""
    default = default_target(machine)
    for r in rows:
        if not r.get("isa"):
            r["isa"] = default
        r["kernel_name"] = r["kernel"]
    per_kernel = collections.defaultdict(set)
    for r in rows:
        per_kernel[r["kernel"]].add(r["isa"])
    built = built_targets(machine)
    for r in rows:
        if len(per_kernel[r["kernel_name"]]) > 1 and r["isa"] in built:
            r["kernel"] = f"{r['kernel_name']}[{r['isa']}]"


def ok_rows(rows):
    return [r for r in rows if r["status"] == "ok" and r.get("time_median_s")]


def is_prefill(r):
    return r["q_len"] == r["kv_len"]


def is_decode(r):
    return r["q_len"] <= DECODE_MAX_Q and r["q_len"] < r["kv_len"]


def modal(rows, key):
    """Most common value; ties go to the largest (the longest sequence, the most threads)."""
    counts = collections.Counter(r[key] for r in rows)
    return max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0] if counts else None


def hold_fixed(rows, free):
    """Rows whose parameters outside `free` equal their most common value, and those values.
    The dimensions are fixed one after the other among the rows still kept, so the result is
    never empty (an experiment of several grids need not hold every combination)."""
    fixed = {}
    kept = rows
    for d in DIMS:
        if d in free:
            continue
        fixed[d] = modal(kept, d)
        kept = [r for r in kept if r[d] == fixed[d]]
    return kept, fixed


def describe_fixed(fixed):
    parts = [f"{k} {v}" for k, v in fixed.items()
             if v not in (None, "") and not (k == "head_dim_v" and v == fixed.get("head_dim"))]
    return ", ".join(parts)


def int_ticks(ax, values, axis="x"):
    """Plain integer tick labels at the data values (log2 axes otherwise show 2^k)."""
    values = sorted(set(values))
    if len(values) > 12:
        values = values[:: math.ceil(len(values) / 12)]
    if axis == "x":
        ax.set_xticks(values)
        ax.set_xticklabels([str(v) for v in values])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    else:
        ax.set_yticks(values)
        ax.set_yticklabels([str(v) for v in values])


def log_y_labels(ax):
    """Log y axis labelled at 1, 2, 5 x 10^k in plain numbers (decades alone leave most plots unlabelled)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def fit_exponent(ns, ts):
    """Least-squares slope of log t vs log n over the large-n points: the upper half of the
    distinct sizes, at least 3 when there are 3. None with fewer than 2 points."""
    pts = sorted(zip(ns, ts))
    if len(pts) < 2:
        return None, []
    k = min(len(pts), max(3, math.ceil(len(pts) / 2)))
    use = pts[-k:]
    x = np.log([p[0] for p in use])
    y = np.log([p[1] for p in use])
    slope = float(np.polyfit(x, y, 1)[0])
    return slope, [p[0] for p in use]


def fmt_bytes(b):
    if b is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b:.0f} B"


def fmt(v, spec=".3g", none="-"):
    return none if v is None else format(v, spec)


# ----------------------------------------------------------------------------- plotting

class Plots:
    """Collects figures and their captions."""

    def __init__(self, out, kernels):
        self.out = out
        self.items = []  # (title, file, caption)
        # Peers (torch, ONNX Runtime, JAX) stand apart: their own colors (not tab10's), dashed
        # lines, their own markers, hatched bars.
        lab = [k for k in kernels if not is_peer(k)]
        peers = [k for k in kernels if is_peer(k)]
        cmap = plt.get_cmap("tab10")
        self.color = {k: cmap(i % 10) for i, k in enumerate(lab)}
        self.color.update({k: PEER_COLORS[k] for k in peers})
        self.marker = {k: "osD^v<>ph*"[i % 10] for i, k in enumerate(lab)}
        self.marker.update({k: "XP*dH"[i % 5] for i, k in enumerate(peers)})

    def style(self, k):
        """Line-plot style of a kernel: color and marker; peers dashed with larger markers."""
        if is_peer(k):
            return {"color": self.color[k], "marker": self.marker[k], "linestyle": "--", "markersize": 8}
        return {"color": self.color[k], "marker": self.marker[k]}

    def bar_style(self, k):
        return {"color": self.color[k], "hatch": "//", "edgecolor": "white"} if is_peer(k) else {"color": self.color[k]}

    def save(self, fig, name, title, caption, extra=None):
        """`extra`: markdown lines placed after the caption (a table belonging to the plot)."""
        fig.tight_layout()
        fig.savefig(os.path.join(self.out, name), dpi=110)
        plt.close(fig)
        self.items.append((title, name, caption, extra or []))


def series_by_kernel(rows, kernels, x, y):
    out = {}
    for k in kernels:
        pts = sorted((r[x], y(r)) for r in rows if r["kernel"] == k and y(r) is not None)
        if pts:
            out[k] = pts
    return out


def scaling_slice(ok):
    """Prefill points, q_len = kv_len varying, everything else at its common value."""
    pre = [r for r in ok if is_prefill(r)]
    if len({r["q_len"] for r in pre}) < 3:
        return None, None
    return hold_fixed(pre, {"q_len", "kv_len"})


def plot_scaling(plots, ok, kernels, fits):
    rows, fixed = scaling_slice(ok)
    if rows is None:
        return
    fig, ax = plt.subplots(figsize=(7.5, 5))
    data = series_by_kernel(rows, kernels, "q_len", lambda r: r["time_median_s"] * 1e3)
    for k, pts in data.items():
        ns, ts = zip(*pts)
        slope, used = fit_exponent(ns, ts)
        fits[k] = slope
        label = f"{k}: n^{slope:.2f}" if slope is not None else k
        ax.plot(ns, ts, **plots.style(k), label=label)
        # Spread over repetitions, as error bars.
        lo = [r["time_min_s"] * 1e3 for r in sorted(rows, key=lambda r: r["q_len"]) if r["kernel"] == k]
        hi = [r["time_max_s"] * 1e3 for r in sorted(rows, key=lambda r: r["q_len"]) if r["kernel"] == k]
        if len(lo) == len(ns):
            ax.fill_between(ns, lo, hi, color=plots.color[k], alpha=0.15, linewidth=0)
    all_n = sorted({r["q_len"] for r in rows})
    slowest = max(data.items(), key=lambda kv: kv[1][-1][1])[1]
    n0, t0 = slowest[-1]
    guide = [t0 * (n / n0) ** 2 for n in all_n]
    ax.plot(all_n, guide, "--", color="gray", linewidth=1, label="n^2 guide")
    ax.set_xscale("log", base=2)
    int_ticks(ax, all_n)
    log_y_labels(ax)
    ax.set_xlabel("sequence length n = q_len = kv_len (tokens)")
    ax.set_ylabel("time per forward pass (ms, median)")
    ax.set_title("Time vs sequence length (log-log)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plots.save(fig, "scaling_time.png", "Time vs sequence length",
               "Median time per call on log-log axes; the shaded band is the min-max over repetitions. "
               "The legend gives each kernel's fitted exponent (least squares of log time vs log n over "
               "the larger half of the sizes); the dashed line has slope 2. Parallel lines at slope 2 mean "
               "every kernel does the same O(n^2) work and the optimizations change only the constant. "
               f"Held fixed: {describe_fixed(fixed)}.")


def plot_throughput(plots, ok, kernels):
    rows, fixed = scaling_slice(ok)
    if rows is None:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    g = series_by_kernel(rows, kernels, "q_len", lambda r: r["gflops"])
    p = series_by_kernel(rows, kernels, "q_len",
                         lambda r: 100 * r["peak_fraction"] if r["peak_fraction"] is not None else None)
    for k, pts in g.items():
        a1.plot(*zip(*pts), **plots.style(k), label=k)
    for k, pts in p.items():
        a2.plot(*zip(*pts), **plots.style(k), label=k)
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        int_ticks(a, [r["q_len"] for r in rows])
        a.set_xlabel("sequence length n (tokens)")
        a.grid(True, which="both", alpha=0.3)
    log_y_labels(a1)
    a1.set_ylabel("GFLOP/s (visible pairs only)")
    a1.set_title("Throughput")
    a2.set_ylabel("% of measured FMA peak (same threads and target)")
    a2.set_title("Fraction of peak")
    a1.legend(fontsize=8)
    plots.save(fig, "scaling_gflops.png", "Throughput and fraction of peak",
               "Left: GFLOP/s (2 (head_dim + head_dim_v) FLOP per visible query-key pair, Problem::flops), log scale. "
               "Right: the same as a percentage of the FMA peak measured by `attnlab peak` for the thread "
               "count and instruction-set target of the point. Curves that rise with n are amortizing per-call or per-row overheads. "
               f"Held fixed: {describe_fixed(fixed)}.")


def plot_ladder(plots, ok, kernels):
    rows, fixed = scaling_slice(ok)
    if rows is None:
        return
    base = "naive" if any(r["kernel"] == "naive" for r in rows) else kernels[0]
    base_t = {r["q_len"]: r["time_median_s"] for r in rows if r["kernel"] == base}
    ns = sorted(base_t)
    others = [k for k in kernels if k != base and any(r["kernel"] == k for r in rows)]
    if not ns or not others:
        return
    fig, ax = plt.subplots(figsize=(8, 4.8))
    width = 0.8 / len(others)
    for i, k in enumerate(others):
        t = {r["q_len"]: r["time_median_s"] for r in rows if r["kernel"] == k}
        xs = [j + (i - (len(others) - 1) / 2) * width for j, n in enumerate(ns) if n in t]
        ys = [base_t[n] / t[n] for n in ns if n in t]
        bars = ax.bar(xs, ys, width=width, **plots.bar_style(k), label=k)
        for b, y in zip(bars, ys):
            ax.annotate(f"{y:.0f}x" if y >= 10 else f"{y:.1f}x", (b.get_x() + b.get_width() / 2, y),
                        ha="center", va="bottom", fontsize=6)
    ax.axhline(1, color="gray", linewidth=1)
    ax.set_xticks(range(len(ns)))
    ax.set_xticklabels([str(n) for n in ns])
    log_y_labels(ax)
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel(f"speed-up over {base} (x, log scale)")
    ax.set_title(f"The ladder: speed-up of each kernel over {base}")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plots.save(fig, "ladder.png", "The ladder",
               f"Time of {base} divided by the time of each kernel at the same shape (higher is better). "
               f"Sizes where {base} was skipped (time cap) have no bars. Each rung's factor is explained in "
               f"the kernel's header comment. Held fixed: {describe_fixed(fixed)}.")


def plot_memory(plots, rows_all, kernels):
    # A peer's extra memory is measured (peak RSS growth over its inputs, scripts/peers/serve.py)
    # on its timed points only; 0 there means it was not measured (folders from before).
    pre = [r for r in rows_all if is_prefill(r) and r["extra_bytes"] is not None and
           (r["status"] == "ok" or r["reason"].startswith(("time cap", "memory"))) and
           not (is_peer(r["kernel"]) and (r["status"] != "ok" or not r["extra_bytes"]))]
    if len({r["q_len"] for r in pre}) < 3:
        return
    rows, fixed = hold_fixed(pre, {"q_len", "kv_len"})
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drawn = False
    for k in kernels:
        pts = sorted((r["q_len"], r["extra_bytes"], r["status"]) for r in rows if r["kernel"] == k)
        if not pts:
            continue
        ns = [p[0] for p in pts]
        bs = [max(p[1], 1) for p in pts]
        ax.plot(ns, bs, **plots.style(k), label=k)
        skipped = [(n, b) for (n, _, s), b in zip(pts, bs) if s != "ok"]
        if skipped:
            ax.scatter(*zip(*skipped), s=80, facecolors="none", edgecolors=plots.color[k])
        drawn = True
    if not drawn:
        plt.close(fig)
        return
    ax.set_xscale("log", base=2)
    int_ticks(ax, [r["q_len"] for r in rows])
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: fmt_bytes(v)))
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel("extra memory: kernel workspace (log scale; 0 drawn as 1 B)")
    ax.set_title("Extra memory vs sequence length")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    plots.save(fig, "extra_memory.png", "Extra memory",
               "Workspace each kernel asks for beyond Q, K, V and O. A kernel that materializes the score "
               "matrix grows as n^2 (slope 2 here); tiled kernels need O(tile) per thread, flat in n. "
               "Hollow circles: points skipped by the time cap or memory budget (their memory is still known). "
               "Peers (dashed): their measured peak RSS growth over the inputs during the timed calls. "
               f"Held fixed: {describe_fixed(fixed)}.")


def plot_decode(plots, ok, kernels, machine, fits_decode):
    dec = [r for r in ok if is_decode(r)]
    if len({r["kv_len"] for r in dec}) < 3:
        return
    rows, fixed = hold_fixed(dec, {"kv_len"})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for k, pts in series_by_kernel(rows, kernels, "kv_len", lambda r: r["gbytes_per_s"]).items():
        a1.plot(*zip(*pts), **plots.style(k), label=k)
    for k, pts in series_by_kernel(rows, kernels, "kv_len", lambda r: r["time_median_s"] * 1e3).items():
        ns, ts = zip(*pts)
        slope, _ = fit_exponent(ns, ts)
        fits_decode[k] = slope
        a2.plot(ns, ts, **plots.style(k),
                label=f"{k}: n^{slope:.2f}" if slope is not None else k)
    bw = {r["threads"]: r["read_bw_gbs"] for r in rows if r["read_bw_gbs"]}
    for t, v in sorted(bw.items()):
        a1.axhline(v, linestyle="--", color="gray", linewidth=1)
        a1.annotate(f"measured read bandwidth, {t} thread(s): {v:.1f} GB/s", (rows[0]["kv_len"], v),
                    fontsize=7, va="bottom", color="gray")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        int_ticks(a, [r["kv_len"] for r in rows])
    a1.set_xlabel("KV cache length (tokens)")
    a1.set_ylabel("GB/s (compulsory Q, K, V, O bytes / time)")
    a1.set_title("Decode bandwidth")
    log_y_labels(a2)
    a2.set_xlabel("KV cache length (tokens)")
    a2.set_ylabel("time per decode step (ms)")
    a2.set_title("Decode time (log-log)")
    for a in (a1, a2):
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    plots.save(fig, "decode.png", "Decode: bandwidth against the KV cache length",
               "One query token (or a few) against a growing KV cache. Left: bytes that must be read "
               "(K and V once per kv head, plus Q and O) per second; the dashed line is the streaming read "
               "bandwidth measured by `attnlab peak`. Caches that fit in L2/L3 can exceed it. Right: time, "
               "which should grow linearly (fitted exponent ~1) once the cache is memory-resident. "
               f"Held fixed: {describe_fixed(fixed)}.")


def plot_gqa(plots, ok, kernels):
    if len({r["gqa_group"] for r in ok}) < 2:
        return
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    drawn = False
    for col, (name, pick) in enumerate((("prefill", is_prefill), ("decode", is_decode))):
        sub = [r for r in ok if pick(r)]
        if len({r["gqa_group"] for r in sub}) < 2:
            axes[0][col].set_visible(False)
            axes[1][col].set_visible(False)
            continue
        rows, fixed = hold_fixed(sub, {"kv_heads"})
        for k, pts in series_by_kernel(rows, kernels, "gqa_group", lambda r: r["time_median_s"] * 1e3).items():
            axes[0][col].plot(*zip(*pts), **plots.style(k), label=k)
        for k, pts in series_by_kernel(rows, kernels, "gqa_group", lambda r: r["gbytes_per_s"]).items():
            axes[1][col].plot(*zip(*pts), **plots.style(k), label=k)
        groups = sorted({r["gqa_group"] for r in rows})
        mb = {r["gqa_group"]: r["bytes"] / 1e6 for r in rows}
        twin = axes[1][col].twinx()
        twin.plot(groups, [mb[g] for g in groups], "k--", linewidth=1, label="compulsory bytes")
        twin.set_ylabel("compulsory bytes per call (MB, dashed)")
        log_y_labels(twin)
        axes[0][col].set_title(f"{name}: time ({describe_fixed({k: fixed[k] for k in ('q_heads', 'q_len', 'kv_len')})})",
                               fontsize=9)
        axes[0][col].set_ylabel("time (ms, median)")
        axes[1][col].set_ylabel("achieved GB/s")
        axes[1][col].set_title(f"{name}: bytes moved and achieved bandwidth", fontsize=9)
        for a in (axes[0][col], axes[1][col]):
            a.set_xscale("log", base=2)
            int_ticks(a, groups)
            a.set_xlabel("GQA group size = q_heads / kv_heads (1 = MHA, q_heads = MQA)")
            a.grid(True, which="both", alpha=0.3)
            a.legend(fontsize=7, loc="upper left")
        log_y_labels(axes[0][col])
        drawn = True
    if not drawn:
        plt.close(fig)
        return
    plots.save(fig, "gqa.png", "GQA groups: prefill and decode",
               "Top: time against the number of query heads sharing one K/V head, at a fixed number of query "
               "heads (so the FLOP count is the same everywhere). Bottom: achieved GB/s (solid) and the "
               "compulsory bytes per call (dashed, right axis; K and V counted once per kv head), which fall "
               "by the group factor. Prefill is compute bound and barely moves; decode is bandwidth bound and "
               "gets faster as K/V shrink, as long as the kernel reads each K/V byte once per group.")


def plot_heads(plots, ok, kernels):
    if len({r["q_heads"] for r in ok}) < 2 or len({r["gqa_group"] for r in ok}) > 1:
        return
    rows, fixed = hold_fixed(ok, {"q_heads", "kv_heads", "head_dim"})
    if len({r["q_heads"] for r in rows}) < 2:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for k, pts in series_by_kernel(rows, kernels, "q_heads", lambda r: r["time_median_s"] * 1e3).items():
        a1.plot(*zip(*pts), **plots.style(k), label=k)
    for k, pts in series_by_kernel(rows, kernels, "q_heads", lambda r: r["gflops"]).items():
        a2.plot(*zip(*pts), **plots.style(k), label=k)
    heads = sorted({r["q_heads"] for r in rows})
    dims = {r["q_heads"]: r["head_dim"] for r in rows}
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(heads)
        a.set_xticklabels([f"{h}\n(d={dims[h]})" for h in heads])
        a.set_xlabel("query heads (head_dim)")
        a.grid(True, which="both", alpha=0.3)
        log_y_labels(a)
    a1.set_ylabel("time (ms, median)")
    a2.set_ylabel("GFLOP/s")
    a1.legend(fontsize=8)
    same_flops = len({r["flops"] for r in rows}) == 1
    plots.save(fig, "heads.png", "Heads",
               "Time and GFLOP/s against the number of heads"
               + (" at a fixed model width (heads x head_dim constant, so the FLOP count is the same at every "
                  "point: differences are per-head overheads and how well each head_dim fills the vectors). "
                  if same_flops else ". ")
               + f"Held fixed: {describe_fixed({k: v for k, v in fixed.items()})}.")


def plot_threads(plots, ok, kernels):
    if len({r["threads"] for r in ok}) < 2:
        return
    rows, fixed = hold_fixed(ok, {"threads", "mask"})
    if len({r["threads"] for r in rows}) < 2:  # thread counts vary only across other axes
        return
    masks = sorted({r["mask"] for r in rows})
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    tmax = max(r["threads"] for r in rows)
    for k in kernels:
        for i, m in enumerate(masks):
            pts = sorted((r["threads"], r["time_median_s"]) for r in rows if r["kernel"] == k and r["mask"] == m)
            if len(pts) < 2:
                continue
            t1 = pts[0][1]
            ax.plot([p[0] for p in pts], [t1 / p[1] for p in pts], **dict(plots.style(k), linestyle=styles[i % 4]),
                    label=f"{k} ({m})" if len(masks) > 1 else k)
    ax.plot([1, tmax], [1, tmax], color="gray", linewidth=1, linestyle=":", label="ideal")
    int_ticks(ax, [r["threads"] for r in rows])
    ax.set_xlabel("threads")
    ax.set_ylabel("speed-up over the kernel's smallest thread count (x)")
    ax.set_title("Thread scaling")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    plots.save(fig, "threads.png", "Thread scaling",
               "Speed-up of each kernel over itself at the smallest thread count. Single-threaded kernels stay "
               "at 1; parallel ones should follow the dotted ideal line up to the number of physical cores and "
               "flatten (or drop) beyond it. Line styles distinguish masks when more than one was measured. "
               f"Held fixed: {describe_fixed(fixed)}.")


def plot_head_dim(plots, ok, kernels):
    if len({r["head_dim"] for r in ok}) < 2 or len({r["q_heads"] for r in ok}) > 1:
        return
    rows, fixed = hold_fixed(ok, {"head_dim"})
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
    for k, pts in series_by_kernel(rows, kernels, "head_dim", lambda r: r["gflops"]).items():
        a1.plot(*zip(*pts), **plots.style(k), label=k)
    for k, pts in series_by_kernel(rows, kernels, "head_dim",
                                   lambda r: 100 * r["peak_fraction"] if r["peak_fraction"] else None).items():
        a2.plot(*zip(*pts), **plots.style(k), label=k)
    dims = sorted({r["head_dim"] for r in rows})
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xticks(dims)
        a.set_xticklabels([str(d) for d in dims])
        a.set_xlabel("head_dim")
        a.grid(True, which="both", alpha=0.3)
    log_y_labels(a1)
    a1.set_ylabel("GFLOP/s")
    a2.set_ylabel("% of measured FMA peak")
    a1.legend(fontsize=8)
    plots.save(fig, "head_dim.png", "head_dim",
               "GFLOP/s and % of peak against head_dim. Each score costs 2 (head_dim + head_dim_v) FLOP but one exp, so "
               "larger heads spend a smaller share on the softmax; sizes that are not a multiple of the "
               f"vector width (16 floats) need tails. Held fixed: {describe_fixed(fixed)}.")


def plot_vector_width(plots, ok, machine):
    """What vector width buys: per kernel built per target, the speed-up of each target over
    scalar at each shape (same threads), beside the ratio of the two targets' measured FMA
    peaks at that thread count (what the wider vectors could buy at most)."""
    built = built_targets(machine)
    best = best_peaks(machine)
    by_kernel = collections.defaultdict(dict)  # name -> {(shape, isa): row}
    for r in ok:
        if r["isa"] in built:
            by_kernel[r["kernel_name"]][(tuple(r[k] for k in SHAPE_KEYS), r["isa"])] = r
    names = [k["name"] for k in machine.get("kernels", [])]
    kernels = sorted((k for k, v in by_kernel.items()
                      if any(isa == "scalar" for _, isa in v) and len({isa for _, isa in v}) > 1),
                     key=lambda k: names.index(k) if k in names else len(names))
    if not kernels:
        return
    wider = [t for t in built if t != "scalar" and any(isa == t for k in kernels for _, isa in by_kernel[k])]
    cmap = plt.get_cmap("tab10")
    color = {t: cmap((i + 1) % 10) for i, t in enumerate(wider)}
    most = max(len({sh for sh, isa in by_kernel[k] if isa == "scalar"}) for k in kernels)
    fig, axes = plt.subplots(len(kernels), 1, figsize=(max(7.5, 1.4 * most + 2), 3.6 * len(kernels)), squeeze=False)
    # GB/s and % of the read bandwidth too: for a memory-bound kernel (decode) they, not the
    # FMA peak, say how close a target gets.
    table = ["| kernel | shape | threads | target | GFLOP/s | % of the target's peak | GB/s | % of read BW | "
             "speed-up over scalar | FMA peak ratio over scalar | speed-up / peak ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for ax, k in zip(axes[:, 0], kernels):
        rows = by_kernel[k]
        shapes = sorted({sh for sh, isa in rows if isa == "scalar"},
                        key=lambda sh: (sh[SHAPE_KEYS.index("head_dim")], sh[SHAPE_KEYS.index("q_len")], sh))
        width = 0.8 / max(1, 2 * len(wider))
        top = 1.0
        for j, sh in enumerate(shapes):
            base = rows[(sh, "scalar")]
            base_peak = peak_for(base, best, machine)[0]
            for t in ["scalar"] + wider:
                r = rows.get((sh, t))
                if r is None:
                    continue
                speed = base["time_median_s"] / r["time_median_s"]
                peak = peak_for(r, best, machine)[0]
                ratio = peak / base_peak if peak and base_peak else None
                table.append(f"| {k} | {shape_text(r)} {r['mask']} | {r['threads']} | {t} | {fmt(r['gflops'], '.1f')} | "
                             f"{fmt(None if r['peak_fraction'] is None else 100 * r['peak_fraction'], '.1f')} | "
                             f"{fmt(r.get('gbytes_per_s'), '.2f')} | "
                             f"{fmt(None if r.get('bw_fraction') is None else 100 * r['bw_fraction'], '.1f')} | "
                             f"{speed:.2f}x | {fmt(ratio, '.2f')}{'x' if ratio else ''} | "
                             f"{fmt(None if not ratio else 100 * speed / ratio, '.0f')}{'%' if ratio else ''} |")
                if t == "scalar":
                    continue
                i = wider.index(t)
                x = j + (2 * i - (2 * len(wider) - 1) / 2) * width
                top = max(top, speed, ratio or 0)
                b = ax.bar(x, speed, width=width, color=color[t], label=f"{t}: measured" if j == 0 else None)
                ax.annotate(f"{speed:.1f}x", (b[0].get_x() + width / 2, speed), ha="center", va="bottom", fontsize=6)
                if ratio:
                    b = ax.bar(x + width, ratio, width=width, color=color[t], alpha=0.35, hatch="//",
                               edgecolor=color[t], label=f"{t}: FMA peak ratio" if j == 0 else None)
                    ax.annotate(f"{ratio:.1f}x", (b[0].get_x() + width / 2, ratio), ha="center", va="bottom",
                                fontsize=6)
        ax.axhline(1, color="gray", linewidth=1)
        ax.set_ylim(0, top * 1.3)  # room for the legend above the bars
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([f"n {sh[SHAPE_KEYS.index('q_len')]}\nd {sh[SHAPE_KEYS.index('head_dim')]}"
                            f"\nt {sh[SHAPE_KEYS.index('threads')]}" for sh in shapes], fontsize=7)
        ax.set_ylabel("speed-up over scalar (x)")
        ax.set_title(f"{k}: speed-up of each target over scalar, beside the ratio of their FMA peaks", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", ncol=2 * len(wider))
    plots.save(fig, "vector_width.png", "What vector width buys",
               "Per kernel compiled once per instruction-set target, the time of its scalar build divided by the "
               "time of each wider build at the same shape and thread count (solid bars), beside the ratio of "
               "the two targets' FMA peaks measured by `attnlab peak` at that thread count (hatched bars): what "
               "the wider vectors could buy if the kernel were bound by FMA throughput alone. A speed-up below "
               "the peak ratio means something other than the FMAs (the exp, loads, reductions, tails, memory) "
               "takes a larger share at the wider width. The table gives the numbers; % of the target's peak is "
               "against the FMA peak of the row's own target.", table + [""])


DTYPE_ORDER = ["f32", "bf16", "f16"]
# Kernels that compute on bf16 only (bf16 products): their speed-up is over this kernel's float32 point.
F32_BASE_KERNEL = {"flash_bf16": "flash", "flash_amx": "flash"}


def plot_precision(plots, ok):
    """The precision/speed frontier: per kernel and shape measured at several storage dtypes,
    the speed-up over its float32 point against the output's error relative to float64 on the
    float32 inputs before rounding (what the storage dtype costs end to end)."""
    if len({r["dtype"] for r in ok}) < 2:
        return
    groups = collections.defaultdict(dict)  # (kernel, shape without dtype) -> dtype -> row
    for r in ok:
        shape = tuple(r[k] for k in SHAPE_KEYS if k != "dtype")
        groups[(r["kernel"], shape)][r["dtype"]] = r
    for (k, shape), by in groups.items():
        base = groups.get((F32_BASE_KERNEL.get(k), shape), {}).get("f32")
        if "f32" not in by and base:
            by["f32"] = base
    groups = {g: v for g, v in groups.items() if "f32" in v and len(v) > 1}
    if not groups:
        return
    table = ["| kernel | shape | mask | threads | dtype | time ms (median) | speed-up over f32 | GB/s | "
             "% of read BW | GFLOP/s | % of peak | peak GFLOP/s | O error vs float64 (stored inputs) | "
             "O error vs float64 (float32 inputs) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5))
    cmap = plt.get_cmap("tab10")
    color = {d: cmap(i) for i, d in enumerate(DTYPE_ORDER)}
    kernel_names = sorted({g[0] for g in groups})
    marker = {k: "osv^DPX*<>"[i % 10] for i, k in enumerate(kernel_names)}
    keys = sorted(groups, key=lambda g: (g[0], g[1]))
    labels = []
    for gi, g in enumerate(keys):
        by = groups[g]
        base = by["f32"]
        labels.append(f"{g[0]} {shape_text(base)} {base['mask']} t{base['threads']}")
        for d in [d for d in DTYPE_ORDER if d in by]:
            r = by[d]
            speed = base["time_median_s"] / r["time_median_s"]
            table.append(f"| {r['kernel']} | {shape_text(base)} | {r['mask']} | {r['threads']} | {d} | "
                         f"{r['time_median_s'] * 1e3:.4g} | {speed:.2f}x | {fmt(r['gbytes_per_s'], '.1f')} | "
                         f"{fmt(None if r.get('bw_fraction') is None else 100 * r['bw_fraction'], '.0f')} | "
                         f"{fmt(r['gflops'], '.1f')} | "
                         f"{fmt(None if r['peak_fraction'] is None else 100 * r['peak_fraction'], '.1f')} | "
                         f"{fmt(r.get('peak_gflops'), '.0f')} | "
                         f"{fmt(r['err_o_rel'], '.2g')} | {fmt(r['err_o_rel_f32_inputs'], '.2g')} |")
            x = gi + (DTYPE_ORDER.index(d) - 1) * 0.27
            axes[0].bar(x, speed, width=0.25, color=color[d], label=d if gi == 0 else None)
            axes[0].annotate(f"{speed:.2f}", (x, speed), ha="center", va="bottom", fontsize=5)
            err = max(r["err_o_rel_f32_inputs"] or 0, 1e-9)
            axes[1].scatter(r["time_median_s"] / base["time_median_s"], err, marker=marker[g[0]], color=color[d], s=36,
                            alpha=0.8)
    axes[0].axhline(1, color="gray", linewidth=1)
    axes[0].set_xticks(range(len(keys)))
    axes[0].set_xticklabels(labels, fontsize=6, rotation=40, ha="right")
    axes[0].set_ylabel("speed-up over float32 storage (x)")
    axes[0].set_title("speed-up of 16-bit storage over f32, same kernel and shape", fontsize=9)
    axes[0].legend(fontsize=7)
    axes[0].grid(True, axis="y", alpha=0.3)
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    axes[1].axvline(1, color="gray", linewidth=1)
    axes[1].set_xlabel("time relative to the same kernel and shape with f32 storage (log)")
    axes[1].set_ylabel("O error vs float64 on the float32 inputs")
    axes[1].set_title("precision/speed frontier (lower left is better)", fontsize=9)
    axes[1].grid(True, alpha=0.3)
    from matplotlib.lines import Line2D
    handles = [Line2D([], [], linestyle="", marker="o", color=color[d], label=d) for d in DTYPE_ORDER] + \
              [Line2D([], [], linestyle="", marker=marker[k], color="gray", label=k) for k in kernel_names]
    axes[1].legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    plots.save(fig, "precision.png", "Precision and speed: storage dtypes",
               "Each kernel and shape measured with Q, K and V stored as float32, bf16 and f16 (O and LSE are "
               "float32 always; every kernel widens the stored values exactly to float32 where it loads them and "
               "computes in float32). Left: speed-up over the same kernel and shape with float32 storage. Right: "
               "time (relative to float32) against the output's error relative to float64 computed on the "
               "float32 inputs BEFORE they were rounded to the storage dtype: the end-to-end price of the "
               "dtype (bf16 keeps 8 significant bits, f16 11). The table also gives the error against float64 "
               "on the stored values, which is what each point's verdict checks (the kernel's own arithmetic). "
               "% of read BW counts the bytes actually stored (2 per element for 16-bit). The bf16-product "
               "kernels (flash_bf16: AVX512_BF16 dot products; flash_amx: AMX tiles) run on bf16 storage only; "
               "their speed-up is over float32 flash on the same shape, their % of peak against the bf16 "
               "dot-product resp. AMX tile peak measured in the same run (peak GFLOP/s).", table + [""])


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
        shape = tuple(r[k] for k in SHAPE_KEYS if k not in ("q_len", "kv_len", "mask"))
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


# ----------------------------------------------------------------------------- report

def agreement(rows_k):
    verified = [r for r in rows_k if r["verdict"] in ("PASS", "FAIL")]
    fails = [r for r in verified if r["verdict"] == "FAIL"]
    if fails:
        return f"FAIL ({len(fails)} of {len(verified)} shapes)"
    if verified:
        return f"PASS ({len(verified)}/{len(verified)} shapes)"
    skipped = [r for r in rows_k if r["status"] == "skipped"]
    if skipped:
        reason = skipped[0]["reason"]
        return "not run: " + (reason if len(reason) <= 90 else reason[:87] + "...")
    return "not verified"


def model_table(rows, experiment):
    """Per model (rows with a model label, in the experiment's grid order): its configuration, prefill
    GFLOP/s and % of peak at each measured context, decode time per token at 4k and 32k, the KV
    bytes per token, and every point that did not run with its reason."""
    labelled = list(dict.fromkeys(r["model"] for r in rows if r.get("model")))
    if not labelled:
        return []
    in_file = [g["model"] for g in experiment.get("grids", []) if isinstance(g, dict) and g.get("model")]
    models = list(dict.fromkeys([m for m in in_file if m in labelled] + labelled))
    md = ["## Models", "",
          "One attention layer of each configuration (batch 1, every head, float32). Prefill: q_len = kv_len "
          "(causal unless the model is an encoder), or the cross-attention shape; decode: one new token "
          "against a cache of 4k / 32k keys. KV bytes per token: what one token adds to one layer's cache "
          "(kv_heads x (d_qk + d_v) x 4 bytes) - multiply by the layer count for the model. (MLA's real "
          "cache keeps one 576-wide latent row per token, V being its first 512 columns: 2304 bytes; the lab "
          "stores V apart, so its decode reads the 4352 listed.) A decode above 100% of the read bandwidth "
          "had its cache in the CPU caches.", "",
          "| model | heads q/kv | d_qk / d_v | mask | prefill (context: GFLOP/s, % of FMA peak) | decode at 4k: "
          "ms/token (% of read bandwidth, % of FMA peak) | decode at 32k | KV bytes/token/layer |",
          "|---|---|---|---|---|---|---|---|"]
    skipped = []
    for m in models:
        rm = [r for r in rows if r.get("model") == m]
        ok_m = [r for r in rm if r["status"] == "ok" and r.get("time_median_s")]
        skipped += [r for r in rm if r["status"] != "ok"]
        pre = sorted((r for r in ok_m if not is_decode(r)), key=lambda r: (r["kv_len"], r["q_len"]))
        pre_text = "; ".join(
            (f"{r['q_len']}x{r['kv_len']}" if r["q_len"] != r["kv_len"] else f"{r['q_len']}")
            + f": {fmt(r['gflops'], '.0f')}, {fmt(None if r['peak_fraction'] is None else 100 * r['peak_fraction'], '.0f')}%"
            for r in pre) or "-"
        dec = {r["kv_len"]: r for r in ok_m if is_decode(r)}

        def decode_cell(n):
            if n not in dec:
                return "-"
            r = dec[n]
            pct = [fmt(None if r[k] is None else 100 * r[k], ".0f") + "% " + w
                   for k, w in (("bw_fraction", "BW"), ("peak_fraction", "peak"))]
            return f"{fmt(r['time_median_s'] * 1e3, '.3g')} ({', '.join(pct)})"

        masks = sorted({r["mask"] for r in rm})
        md.append(f"| {m} | " + " ; ".join(dict.fromkeys(f"{r['q_heads']}/{r['kv_heads']}" for r in rm)) + " | "
                  + " ; ".join(dict.fromkeys(f"{r['head_dim']} / {r['head_dim_v']}" for r in rm)) + " | "
                  f"{', '.join(masks)} | {pre_text} | {decode_cell(4096)} | {decode_cell(32768)} | "
                  + " ; ".join(fmt(x, ".0f") for x in dict.fromkeys(r.get("kv_bytes_per_token") for r in rm)) + " |")
    md.append("")
    if skipped:
        md += ["Model points that did not run (not shrunk to fit): "
               + "; ".join(f"{shape_text(r)}: {r['status']} ({r['reason']})" for r in skipped), ""]
    return md


def summary_table(rows, ok, kernels, fits, fits_decode):
    lines = ["| kernel | fitted exponent | best GFLOP/s | best % of peak | best % of read bandwidth | agreement | "
             "points ok / failed / skipped |",
             "|---|---|---|---|---|---|---|"]
    for k in kernels:
        rk = [r for r in rows if r["kernel"] == k]
        ok_k = [r for r in ok if r["kernel"] == k]
        if fits.get(k) is not None:
            exp = f"{fits[k]:.2f} (time vs n)"
        elif fits_decode.get(k) is not None:
            exp = f"{fits_decode[k]:.2f} (time vs kv_len)"
        else:
            exp = "-"
        best_g = max((r["gflops"] for r in ok_k if r["gflops"]), default=None)
        best_p = max((r["peak_fraction"] for r in ok_k if r["peak_fraction"]), default=None)
        best_bw = max((r["bw_fraction"] for r in ok_k if r["bw_fraction"]), default=None)
        counts = collections.Counter(r["status"] for r in rk)
        name = f"{k} (peer)" if is_peer(k) else k
        lines.append(f"| {name} | {exp} | {fmt(best_g, '.1f')} | "
                     f"{fmt(None if best_p is None else 100 * best_p, '.1f')} | "
                     f"{fmt(None if best_bw is None else 100 * best_bw, '.0f')} | {agreement(rk)} | "
                     f"{counts['ok']} / {counts['failed']} / {counts['skipped']} |")
    return lines


def shape_key(r):
    return tuple(r.get(d) for d in DIMS) + (r.get("pattern", ""),)


def peer_section(rows, ok):
    """Peers beside the lab: each peer's version and how it was driven, then per shape the best
    lab kernel against the best peer (same run, same inputs, both verified), with the ratio."""
    present = [k for k in PEERS if any(r["kernel"] == k for r in rows)]
    if not present:
        return []
    md = ["## Peers: the lab's best against what users run", "",
          "Peers ran in the same sweep on the same inputs (`attnlab sweep --peers`; scripts/peers/), at the "
          "same thread count, timed like the lab's points (warm-up, then repetitions of >= min_time each; "
          "medians), and their O was checked against the same float64 reference with the same tolerance "
          "policy before its times were kept (a peer that disagrees is failed, not timed). % of peak is "
          "against the default target's FMA peak.", "",
          "| peer | version | points ok / failed / skipped | how it was driven (distinct settings) |",
          "|---|---|---|---|"]
    for k in present:
        rk = [r for r in rows if r["kernel"] == k]
        counts = collections.Counter(r["status"] for r in rk)
        versions = sorted({r.get("version") for r in rk if r.get("version")})
        hows = sorted({r.get("how") for r in rk if r["status"] == "ok" and r.get("how")})
        md.append(f"| {k} | {', '.join(versions) or '-'} | {counts['ok']} / {counts['failed']} / "
                  f"{counts['skipped']} | {'<br>'.join(h.replace('|', '/') for h in hows) or '-'} |")
    md.append("")
    best = collections.defaultdict(dict)  # shape -> {"lab": row, "peer": row}
    for r in ok:
        side = "peer" if is_peer(r["kernel"]) else "lab"
        cur = best[shape_key(r)].get(side)
        if cur is None or r["time_median_s"] < cur["time_median_s"]:
            best[shape_key(r)][side] = r
    pairs = [(v["lab"], v["peer"]) for v in best.values() if "lab" in v and "peer" in v]
    if pairs:
        pairs.sort(key=lambda lp: (lp[0]["flops"], lp[0]["mask"], lp[0]["threads"]))
        ratios = [p["time_median_s"] / lab["time_median_s"] for lab, p in pairs]
        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))

        def cell(r):
            pf = r.get("peak_fraction")
            return f"{fmt(r['gflops'], '.1f')} ({fmt(None if pf is None else 100 * pf, '.0f')}%)"

        md += [f"Best lab kernel against the best peer, per shape ({len(pairs)} shapes where both ran): "
               f"the lab is {gm:.2f}x the best peer's speed (geometric mean; from {min(ratios):.2f}x to "
               f"{max(ratios):.2f}x). Speed-up = best peer's median time / best lab kernel's.", "",
               "| shape | mask | threads | best lab kernel | GFLOP/s (% peak) | best peer | GFLOP/s (% peak) | "
               "lab speed-up |", "|---|---|---|---|---|---|---|---|"]
        for (lab, p), x in zip(pairs, ratios):
            md.append(f"| {shape_text(lab)} | {lab['mask']} | {lab['threads']} | {lab['kernel']} | {cell(lab)} | "
                      f"{p['kernel']} | {cell(p)} | {x:.2f}x |")
        md.append("")
    return md


def shape_text(r):
    s = f"b{r['batch']} h{r['q_heads']}/{r['kv_heads']} q{r['q_len']} kv{r['kv_len']} d{r['head_dim']}"
    if r.get("head_dim_v", r["head_dim"]) != r["head_dim"]:
        s += f"/{r['head_dim_v']}"
    if r.get("model"):
        s = f"{r['model']}: " + s
    if r["layout"] != "bhsd":
        s += f" {r['layout']}"
    if r.get("dtype", "f32") != "f32":
        s += f" {r['dtype']}"
    return s


def apply_best_peaks(rows, machine):
    """Recomputes peak_fraction / bw_fraction (and the peak columns) against best_peaks(), by
    peak_for (the row's own target)."""
    best = best_peaks(machine)
    for r in rows:
        if not r.get("time_median_s"):
            continue
        f, b = peak_for(r, best, machine)
        if f:
            r["peak_gflops"] = f / 1e9
            r["peak_fraction"] = r["flops"] / r["time_median_s"] / f
        if b:
            r["read_bw_gbs"] = b / 1e9
            r["bw_fraction"] = r["bytes"] / r["time_median_s"] / b


def write_report(folder, out):
    rows, machine, experiment, plan = load_results(folder)
    label_targets(rows, machine)
    apply_best_peaks(rows, machine)
    os.makedirs(out, exist_ok=True)
    kernels = kernel_order(rows, machine)
    ok = ok_rows(rows)
    plots = Plots(out, kernels)
    fits, fits_decode = {}, {}
    if ok:
        plot_scaling(plots, ok, kernels, fits)
        plot_throughput(plots, ok, kernels)
        plot_ladder(plots, ok, kernels)
        plot_decode(plots, ok, kernels, machine, fits_decode)
        plot_gqa(plots, ok, kernels)
        plot_heads(plots, ok, kernels)
        plot_threads(plots, ok, kernels)
        plot_head_dim(plots, ok, kernels)
        plot_masks(plots, ok, kernels)
        plot_vector_width(plots, ok, machine)
        plot_precision(plots, ok)
        plot_sparse(plots, ok)
    plot_memory(plots, rows, kernels)

    name = plan.get("experiment") or (rows[0]["experiment"] if rows else os.path.basename(folder.rstrip("/")))
    md = [f"# attnlab report: {name}", ""]
    if experiment.get("description"):
        md += [f"> {experiment['description']}", ""]
    planned = len(plan.get("plan", [])) if plan else None
    md += [f"Results folder `{os.path.basename(os.path.abspath(folder))}`: every figure below comes from "
           "`results.csv` (tidy, one row per point) in this folder; raw Google Benchmark output is in "
           "`bench.json`, the machine and its measured peaks in `machine.json`, the question in "
           "`experiment.json`. Regenerate with `/usr/bin/python3 scripts/report.py <this folder>`.", ""]
    if planned is not None:
        shard = plan.get("shard", [0, 1])
        note = f" (shard {shard[0]}/{shard[1]})" if shard and shard[1] > 1 else ""
        md += [f"Points decided: {len(rows)} of {planned} planned{note}.", ""]
    rounds = experiment.get("rounds", 1)
    if rounds > 1:
        md += [f"Timed in {rounds} passes (the experiment's `rounds`): every point once per pass, the passes one "
               "after the other, so points compared with each other saw the same (drifting) machine; each "
               "point's median is over all its passes' repetitions (results.csv `rounds`: the passes it has).", ""]

    md += ["## Summary", ""]
    md += summary_table(rows, ok, kernels, fits, fits_decode)
    md += ["", "Fitted exponent: slope of log(time) against log(sequence length) over the larger half of the "
           "sizes (at least 3) of the sequence-length slice (prefill, q_len = kv_len), or against the KV "
           "length for decode experiments. Best GFLOP/s and % of peak: the best point of the kernel in this "
           "run. % of read bandwidth: compulsory bytes per second against the measured streaming read "
           "bandwidth (the figure of merit for decode; above 100% means the data sat in cache). "
           "Agreement: each point is checked against the float64 reference on sampled rows before it "
           "is timed. Rows marked (peer) are PyTorch, ONNX Runtime or JAX run in the same sweep "
           "(drawn dashed in the plots; next section).", ""]
    md += peer_section(rows, ok)

    if machine:
        git = machine.get("git", {})
        isa = machine.get("isa", {})
        md += ["## Machine", "",
               f"- CPU: {machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, "
               f"{fmt_bytes(machine.get('memory_bytes'))} RAM"
               + (", virtual machine" if machine.get("virtual_machine") else "")
               + (f"; transparent huge pages `{machine['transparent_hugepages']}` (tensors of 4 MiB and more are "
                  "advised as huge-page memory, as numpy does: used unless this says never)"
                  if machine.get("transparent_hugepages") else ""),
               f"- SIMD: default target {isa.get('default', isa.get('simd_arch', '?'))} "
               f"({isa.get('float_lanes', '?')} float lanes)"
               + (f"; targets built: {', '.join(isa['targets_built'])}; this CPU runs: "
                  f"{', '.join(isa.get('targets_cpu_runs', []))}" if isa.get("targets_built") else "")
               + f"; CPU flags: {isa.get('cpu_simd_flags', '?')}",
               f"- Compiler: {machine.get('compiler', '?')}; build {machine.get('build_type', '?')}; "
               f"flags `{machine.get('flags', '?').strip()}`",
               f"- Libraries: " + ", ".join(f"{k} {v}" for k, v in machine.get("libraries", {}).items()),
               f"- Commit: `{git.get('commit', '?')}`" + (" (with uncommitted changes)" if git.get("dirty") else ""),
               f"- Measured: {machine.get('date', '?')}; load average at start "
               f"{', '.join(str(x) for x in machine.get('load_avg', [])) or '?'}", ""]
        peaks = machine.get("peaks", {})
        before = peak_targets(peaks)
        after = {(isa, r["threads"]): r for isa, target_rows in peak_targets(machine.get("peaks_after", {})).items()
                 for r in target_rows}
        if any(before.values()):
            md += [f"Machine peaks (`attnlab peak`, median of {peaks.get('repeats')} runs; exp = "
                   f"{peaks.get('exp_function')}), per instruction-set target, measured before the points"
                   + (" and again after them (in brackets), to show the drift on this shared machine. "
                      "Every % of peak and % of read bandwidth in this report is relative to the larger of "
                      "the two (other jobs only ever lower a peak measurement; results.csv and bench.json "
                      "keep the fraction of the first)" if after else "")
                   + f". % of peak is against the FMA peak of the row's own target (the default target "
                   f"{default_target(machine)}'s for kernels built once); % of read bandwidth against the default "
                   "target's read bandwidth:", "",
                   "| target | threads | FMA GFLOP/s | read GB/s | exp Gexp/s |", "|---|---|---|---|---|"]

            def cell(isa, r, key, scale, spec):
                a = after.get((isa, r["threads"]))
                text = format(r[key] / scale, spec)
                return text + (f" ({format(a[key] / scale, spec)})" if a else "")

            for isa, target_rows in before.items():
                for r in target_rows:
                    md.append(f"| {isa}{' (default)' if isa == default_target(machine) else ''} | {r['threads']} | "
                              f"{cell(isa, r, 'fma_flops', 1e9, '.1f')} | {cell(isa, r, 'read_bytes', 1e9, '.1f')} | "
                              f"{cell(isa, r, 'exp_per_s', 1e9, '.2f')} |")
            md.append("")
            # The bf16-product peaks (default target's rows), what flash_bf16 and flash_amx are against.
            product = [(label, field, isa, r) for isa, target_rows in before.items() for r in target_rows
                       for label, field in PRODUCT_PEAKS.items() if r.get(field)]
            if product:
                md += ["bf16-product peaks (`attnlab peak`: `vdpbf16ps` for the avx512_bf16 kernels, AMX "
                       "`TDPBF16PS` tiles for amx_bf16), against which flash_bf16 resp. flash_amx rows are measured:",
                       "", "| kernel isa | threads | GFLOP/s | x the float32 FMA peak |", "|---|---|---|---|"]
                for label, field, isa, r in product:
                    md.append(f"| {label} | {r['threads']} | {cell(isa, r, field, 1e9, '.1f')} | "
                              f"{r[field] / r['fma_flops']:.2f}x |")
                md.append("")
        md += ["**Noise.** This machine is shared: other jobs build and benchmark on the same cores while a "
               "sweep runs (see the load average above), so absolute times and even the measured peaks move "
               "by tens of percent between runs. Read ratios measured in the same run (speed-ups, exponents, "
               "% of the peak measured in this run), and use the min-max spread in the table below.", ""]

    md += model_table(rows, experiment)

    for title, fname, caption, extra in plots.items:
        md += [f"## {title}", "", f"![{title}]({fname})", "", f"*{caption}*", ""] + extra

    if ok:
        md += ["## All measured points", "",
               "| kernel | shape | mask | threads | time ms (median) | min-max ms | GFLOP/s | % peak | GB/s | "
               "extra memory | verify |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in ok:
            md.append(f"| {r['kernel']} | {shape_text(r)} | {r['mask']} | {r['threads']} | "
                      f"{r['time_median_s'] * 1e3:.4g} | {r['time_min_s'] * 1e3:.4g}-{r['time_max_s'] * 1e3:.4g} | "
                      f"{fmt(r['gflops'], '.1f')} | "
                      f"{fmt(None if r['peak_fraction'] is None else 100 * r['peak_fraction'], '.1f')} | "
                      f"{fmt(r['gbytes_per_s'], '.2f')} | {fmt_bytes(r['extra_bytes'])} | {r['verdict']} |")
        md.append("")
    other = [r for r in rows if r["status"] != "ok"]
    if other:
        md += ["## Failed and skipped points", "", "| kernel | shape | mask | threads | status | reason |",
               "|---|---|---|---|---|---|"]
        for r in other:
            md.append(f"| {r['kernel']} | {shape_text(r)} | {r['mask']} | {r['threads']} | {r['status']} | "
                      f"{r['reason'].replace('|', '/')} |")
        md.append("")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md))
    return os.path.join(out, "report.md"), [p[1] for p in plots.items]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results folder written by attnlab sweep")
    ap.add_argument("--out", help="where to write report.md and the plots (default: the results folder)")
    args = ap.parse_args(argv)
    path, pngs = write_report(args.results, args.out or args.results)
    print(path)
    for p in pngs:
        print(os.path.join(args.out or args.results, p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
