"""Writes report.md and PNG plots for one attnlab results folder, from that folder only.

    /usr/bin/python3 scripts/report.py RESULTS_DIR [--out DIR]   (the entry point; this package is its body)

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
# The package, by concern: schema (the point fields a folder was written with), load (rows,
# machine, plan; peers, prefill, decode; holding parameters fixed), peaks (which measured peak a
# row is held against), figures (shared drawing helpers), plot_scaling / plot_shapes /
# plot_targets / plot_masks (one module per plot family), tables, main (report.md; the CLI).

from . import schema
from .load import (PEERS, is_decode, is_peer, is_prefill, kernel_order, load_results, ok_rows, pass_ratios, pass_times,
                   repetition_times)
from .main import main, write_report
from .peaks import best_peaks, label_targets, peak_for
from .schema import LEGACY_SCHEMA, load_schema, use_schema

__all__ = ["LEGACY_SCHEMA", "PEERS", "best_peaks", "is_decode", "is_peer", "is_prefill", "kernel_order", "label_targets",
           "load_results", "load_schema", "main", "ok_rows", "pass_ratios", "pass_times", "peak_for", "repetition_times",
           "schema", "use_schema", "write_report"]


def __getattr__(name):
    """DIMS, SHAPE_KEYS, INT_COLS, FLOAT_COLS: those of the folder loaded last (schema.use_schema)."""
    if name in ("DIMS", "SHAPE_KEYS", "INT_COLS", "FLOAT_COLS"):
        return getattr(schema, name)
    raise AttributeError(f"module 'report' has no attribute '{name}'")
