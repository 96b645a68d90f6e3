"""Writes report.md and PNG plots for one attnlab results folder, from that folder only
(write_report), and the command line (main): /usr/bin/python3 scripts/report.py RESULTS_DIR."""

import argparse
import os

from .figures import Plots, fmt, fmt_bytes
from .load import default_target, kernel_order, load_results, ok_rows
from .peaks import PRODUCT_PEAKS, apply_best_peaks, label_targets, peak_targets
from .plot_masks import plot_masks, plot_sparse
from .plot_scaling import plot_ladder, plot_memory, plot_scaling, plot_throughput
from .plot_shapes import plot_decode, plot_gqa, plot_head_dim, plot_heads, plot_threads
from .plot_targets import plot_precision, plot_vector_width
from .plot_topk import long_context_section
from .tables import (arithmetic_section, kv_cache_section, model_table, paged_section, peer_section, shape_text,
                     summary_table, training_section)


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
           "Best % of roofline: the time a point cannot beat on this machine - its compulsory bytes over the "
           "read bandwidth measured beside it, or its products over the peak of the unit it multiplies on "
           "(vpdpbusd's for int8 products, the bf16 dot product's for bf16 ones), whichever is larger, the "
           "bound named - over its time: one figure of merit for decode, prefill and the narrow kernels "
           "alike (results.csv roofline_s, roofline_fraction, roofline_bound). "
           "Agreement: each point is checked against the float64 reference on sampled rows before it "
           "is timed. Rows marked (peer) are PyTorch, ONNX Runtime, OpenVINO, JAX or ggml run in the same sweep "
           "(drawn dashed in the plots; next section).", ""]
    md += peer_section(rows, ok, folder)
    md += training_section(rows, ok)
    md += kv_cache_section(rows, ok)
    md += arithmetic_section(rows, ok, folder)
    md += paged_section(rows, ok)
    md += long_context_section(plots, ok) if ok else []

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
