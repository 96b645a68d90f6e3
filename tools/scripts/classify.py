#!/usr/bin/env python3
"""Sort a `perf report --no-children --sort sym` listing into the tile engine's parts.

Usage: classify.py REPORT.txt -> the share of each part in the kernel's samples (the sweep's
own set-up - random inputs, the float64 reference, the peak loops - left out)."""
import re, sys
parts = [("GEMM 1 (score_panel / score_rows)", r"score_panel|score_rows|score_block|score_vectors"),
         ("GEMM 2 (pv_panel)", r"pv_panel|pv_keys|pv_run|pv_rows|pv_pairs"),
         ("softmax epilogue (softmax_rows)", r"softmax_rows"),
         ("tile loop (attend_tiles: next-tile prefetch, masks, dispatch)", r"attend_tiles|process_panel"),
         ("K packing (pack_k_transposed)", r"pack_k"),
         ("Q packing, state reset (begin_rows)", r"begin_rows|pack_rows"),
         ("first-tile reads (touch_rows)", r"touch_rows"),
         ("normalize, LSE (finish_rows, scale_row)", r"finish_rows|scale_row"),
         ("oneTBB, scheduling", r"tbb::|parallel_tasks|thread_scratch")]
setup = r"dot_chains|fma_chains|amx_rounds|amx_tile_rounds|i8_chains|read_buffer|exp_rounds|stream_sum|measure_peaks|reference_row|baseline_errors|random_tensors|peak|Peak|exc_page_fault|clear_page|memset|memcg|_raw_spin|ieee754|verify|fill_random|Xoshiro|normal_dist"
share = {name: 0.0 for name, _ in parts}
other = 0.0
for line in open(sys.argv[1]):
    m = re.match(r"\s*([0-9.]+)%\s+\[[.k]\]\s+(.*)", line)
    if not m:
        continue
    pct, sym = float(m.group(1)), m.group(2)
    if re.search(setup, sym):
        continue
    for name, pat in parts:
        if re.search(pat, sym):
            share[name] += pct
            break
    else:
        other += pct
total = sum(share.values()) + other
for name, _ in parts:
    print(f"{name:64s} {100 * share[name] / total:5.1f}%")
print(f"{'other':64s} {100 * other / total:5.1f}%")
gemm = sum(v for k, v in share.items() if k.startswith("GEMM")) / total
print(f"GEMM share of the kernel's time: {100 * gemm:.1f}%")
