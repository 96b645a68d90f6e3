"""Plots along the other shape axes: decode (KV cache), GQA groups, heads, threads, head_dim."""


import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from .figures import fit_exponent, int_ticks, log_y_labels, series_by_kernel
from .load import describe_fixed, hold_fixed, is_decode, is_prefill


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
