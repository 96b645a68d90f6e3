"""Which measured peak a row is held against: its own target's FMA peak (bf16 products: their
own), the best of the folder's runs (the rule of the C++ Peaks::ref)."""

import collections

from .load import built_targets, default_target


def peak_targets(block):
    """isa -> rows of one peaks block of machine.json: attnlab-peak-2 lists "targets";
    attnlab-peak-1 is one target, the one its "simd_arch" names."""
    if not block:
        return {}
    if "targets" in block:
        return {t["isa"]: t.get("rows", []) for t in block["targets"]}
    return {block.get("simd_arch", "?"): block.get("rows", [])}


# The bf16-product kernels' isa labels and the peak figure (in the default target's rows of
# machine.json) their % of peak is against (src/peaks/peak.hpp, Peaks::ref).
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
    """The one rule for % of peak (src/peaks/peak.hpp, Peaks::ref): (FMA FLOP/s, read bytes/s)
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
