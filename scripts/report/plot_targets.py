"""Plots across instruction-set targets and storage precisions."""

import collections

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from . import schema
from .figures import fmt
from .load import built_targets
from .peaks import best_peaks, peak_for
from .tables import shape_text


def plot_vector_width(plots, ok, machine):
    """What vector width buys: per kernel built per target, the speed-up of each target over
    scalar at each shape (same threads), beside the ratio of the two targets' measured FMA
    peaks at that thread count (what the wider vectors could buy at most)."""
    built = built_targets(machine)
    best = best_peaks(machine)
    by_kernel = collections.defaultdict(dict)  # name -> {(shape, isa): row}
    for r in ok:
        if r["isa"] in built:
            by_kernel[r["kernel_name"]][(tuple(r[k] for k in schema.SHAPE_KEYS), r["isa"])] = r
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
                        key=lambda sh: (sh[schema.SHAPE_KEYS.index("head_dim")], sh[schema.SHAPE_KEYS.index("q_len")], sh))
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
        ax.set_xticklabels([f"n {sh[schema.SHAPE_KEYS.index('q_len')]}\nd {sh[schema.SHAPE_KEYS.index('head_dim')]}"
                            f"\nt {sh[schema.SHAPE_KEYS.index('threads')]}" for sh in shapes], fontsize=7)
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
        shape = tuple(r[k] for k in schema.SHAPE_KEYS if k != "dtype")
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
