"""Plots of the O(n^2) story: time vs seq_len with the fitted exponent, GFLOP/s and % of peak,
the speed-up ladder, memory growth."""


import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from .figures import fit_exponent, fmt_bytes, int_ticks, log_y_labels, series_by_kernel
from .load import describe_fixed, hold_fixed, is_peer, is_prefill


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
