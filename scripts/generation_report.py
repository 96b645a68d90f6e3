#!/usr/bin/python3
"""Writes report.md and plots for one `attnlab generate` results folder, from that folder only.

    /usr/bin/python3 scripts/generation_report.py RESULTS_DIR [--out DIR]

Reads summary.csv (one row per configuration: name, heads, dtype, prompt, median times),
steps.csv (one row per generated token) and machine.json (the read bandwidth measured in the
same run). The question it answers: why GQA and MQA speed up generation. Every step reads the
whole KV cache once, so the time per token follows the KV bytes read per token, which fall
with the group size (q_heads / kv_heads); the plots show both against the context length and
against each other, with the measured read bandwidth as the floor.
"""

import argparse
import csv
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

INTS = {"q_heads", "kv_heads", "group", "head_dim", "head_dim_v", "prompt", "steps", "context", "threads",
        "verified", "failed", "step"}


def cache(r):
    """How a configuration stores its cache: the dtype, then the quantized layout, the paging and a
    shared latent cache where set (columns a folder written before them lacks)."""
    t = r["dtype"]
    if r.get("kv_dtype") not in (None, "", "dtype"):
        t += f", {r['kv_dtype']} cache"
    if r.get("kv_block"):
        t += f", paged {int(r['kv_block'])}"
    if str(r.get("kv_shared", "")).lower() == "true":
        t += ", V in K"
    return t


def read_csv(path):
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {}
            for k, v in raw.items():
                if k in INTS:
                    row[k] = int(v) if v else None
                else:
                    try:
                        row[k] = float(v) if v != "" else None
                    except ValueError:
                        row[k] = v
            rows.append(row)
    return rows


def fmt_bytes(b):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def series(summary):
    """name -> rows ascending by context."""
    out = {}
    for r in summary:
        out.setdefault(r["name"], []).append(r)
    for rows in out.values():
        rows.sort(key=lambda r: r["context"])
    return out


def plot_time_vs_context(out, by_name):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, rows in by_name.items():
        ax.plot([r["context"] for r in rows], [r["median_token_s"] * 1e3 for r in rows], marker="o",
                label=f"{name} ({rows[0]['q_heads']}/{rows[0]['kv_heads']} heads, {cache(rows[0])})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (keys in the cache)")
    ax.set_ylabel("ms per generated token (append + attention)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "generation_time.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.path.basename(path)


def floor_s(r, bw, peak):
    """The roofline's time for a step: its bytes at the read bandwidth or its FLOPs at the FMA
    peak, whichever is longer (None when neither was measured)."""
    t = [x for x in (r["kv_read_bytes_per_token"] / bw if bw else None,
                     r["flops_per_token"] / peak if peak else None) if x is not None]
    return max(t) if t else None


def plot_bytes_story(out, by_name, bw, peak):
    """Left: KV bytes read per token vs context (falls with the group size). Right: time per token
    against those bytes, with bytes / read bandwidth (the memory floor) as a line and each
    configuration's roofline floor (memory or compute, whichever is longer) dotted."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5))
    allb = []
    for name, rows in by_name.items():
        label = f"{name} (group {rows[0]['group']}, {cache(rows[0])})"
        a1.plot([r["context"] for r in rows], [r["kv_read_bytes_per_token"] / 2**20 for r in rows], marker="o", label=label)
        line, = a2.plot([r["kv_read_bytes_per_token"] / 2**20 for r in rows],
                        [r["median_attention_s"] * 1e3 for r in rows], marker="o", label=label)
        floors = [floor_s(r, bw, peak) for r in rows]
        if all(f is not None for f in floors):
            a2.plot([r["kv_read_bytes_per_token"] / 2**20 for r in rows], [f * 1e3 for f in floors], ":",
                    color=line.get_color(), lw=1)
        allb += [r["kv_read_bytes_per_token"] for r in rows]
    a1.set_xscale("log", base=2)
    a1.set_yscale("log")
    a1.set_xlabel("context (keys in the cache)")
    a1.set_ylabel("KV-cache MiB read per generated token (one layer)")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=8)
    if bw and allb:
        xs = sorted(allb)
        a2.plot([x / 2**20 for x in xs], [x / bw * 1e3 for x in xs], "k--", lw=1,
                label=f"bytes / read bandwidth ({bw / 1e9:.1f} GB/s, same run)")
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel("KV-cache MiB read per token")
    a2.set_ylabel("ms of attention per token (dotted: roofline floor)")
    a2.grid(True, which="both", alpha=0.3)
    a2.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out, "generation_bytes.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return os.path.basename(path)


def write_report(folder, out):
    summary = read_csv(os.path.join(folder, "summary.csv"))
    if not summary:
        raise SystemExit(f"generation_report: {folder}/summary.csv has no rows")
    with open(os.path.join(folder, "machine.json")) as f:
        machine = json.load(f)
    gen_path = os.path.join(folder, "generation.json")
    experiment = ""
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            experiment = json.load(f).get("experiment", "")
    os.makedirs(out, exist_ok=True)
    by_name = series(summary)
    threads = summary[0]["threads"]
    bw = (machine.get("read_bandwidth") or {}).get(str(threads))
    peak = (machine.get("fma_flops") or {}).get(str(threads))
    p1 = plot_time_vs_context(out, by_name)
    p2 = plot_bytes_story(out, by_name, bw, peak)
    git = machine.get("git", {})
    md = ["# attnlab report: generation loop", ""]
    if experiment:
        md += [f"Experiment `{experiment}`; regenerate this report with "
               f"`/usr/bin/python3 scripts/generation_report.py {os.path.basename(os.path.abspath(folder))}`.", ""]
    md += [f"Machine: {machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores; commit `{git.get('commit', '?')}`"
           + (" (uncommitted changes)" if git.get("dirty") else "") + "; read bandwidth measured in this run: "
           + (f"{bw / 1e9:.1f} GB/s read bandwidth" if bw else "no read bandwidth")
           + (f", {peak / 1e9:.0f} GFLOP/s FMA peak" if peak else "") + f" at {threads} thread(s).", "",
           f"Each configuration: a cache holding `prompt` tokens, then {summary[0]['steps']} generated tokens, each = append its "
           "K/V rows + decode against the whole cache (`attnlab generate`, src/bench/generation/generation.hpp). Times "
           "are medians over the generated tokens; context is the median token's. The steady decode is the "
           "same decode call repeated right after each step without appending (interleaved, so the "
           "machine's drift hits both): the loop's attention time should match it (same work). Roofline "
           "floor: the step's KV bytes at the read bandwidth or its FLOPs at the FMA peak, whichever is "
           "longer; with q_heads / kv_heads query rows per K/V row, decode does 2 (d + d_v) FLOP per "
           "K/V element per query head, so large groups (MQA) meet the compute roof before the memory one.", "",
           "## Time per token follows the KV bytes read", "", f"![time per token]({p1})", "",
           f"![bytes per token]({p2})", "",
           "*Left: every generated token reads the whole cache, kv_heads x context x (d + d_v) x element bytes: "
           "at a fixed number of query heads, a group of G query heads per K/V head reads G x less than MHA, "
           "and a bf16 cache half. "
           "Right: the attention time per token against those bytes; the dashed line is the time the bytes "
           "take at the measured read bandwidth.*", "",
           "| config | heads q/kv | storage | context | KV bytes/token (cache memory) | cache | KV read per token | "
           "ms/token | append ms | attention ms | steady decode ms | loop / steady | tokens/s | % of read bandwidth | "
           "% of FMA peak | roofline floor ms (% reached) | prefill | verified |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for name, rows in by_name.items():
        for r in rows:
            if r.get("prefill_s") is not None:
                pre = f"{r['prefill_s'] * 1e3:.0f} ms"
            elif r.get("prefill_note"):
                if r["prefill_note"] not in notes:
                    notes.append(r["prefill_note"])
                pre = f"[{notes.index(r['prefill_note']) + 1}]"
            else:
                pre = "-"
            bwf = f"{100 * r['bw_fraction']:.0f}" if r.get("bw_fraction") is not None else "-"
            pkf = f"{100 * r['peak_fraction']:.0f}" if r.get("peak_fraction") is not None else "-"
            fl = floor_s(r, bw, peak)
            flt = f"{fl * 1e3:.3g} ({100 * fl / r['median_attention_s']:.0f}%)" if fl else "-"
            ver = f"{r['verified'] - r['failed']}/{r['verified']} PASS" if r["verified"] else "-"
            md.append(f"| {name} | {r['q_heads']}/{r['kv_heads']} | {cache(r)} | {r['context']} | "
                      f"{r['kv_bytes_per_token']:.0f} | {fmt_bytes(r['cache_bytes'])} | "
                      f"{fmt_bytes(r['kv_read_bytes_per_token'])} | {r['median_token_s'] * 1e3:.3g} | "
                      f"{r['median_append_s'] * 1e3:.2g} | {r['median_attention_s'] * 1e3:.3g} | "
                      f"{r['steady_decode_s'] * 1e3:.3g} | {r['loop_vs_steady']:.2f} | {r['tokens_per_s']:.0f} | "
                      f"{bwf} | {pkf} | {flt} | {pre} | {ver} |")
    md.append("")
    md += [f"[{i + 1}] prefill {n}" for i, n in enumerate(notes)] + ([""] if notes else [])
    # Speed-up of each config over the first (MHA) at the same context and dtype.
    names = list(by_name)
    base = by_name[names[0]]
    md += [f"Speed-up per token over {names[0]} at the same context (attention only), against the ratio of "
           "the KV bytes read:", "", "| config | context | speed-up | bytes ratio |", "|---|---|---|---|"]
    for name in names[1:]:
        for r in by_name[name]:
            b = next((x for x in base if x["context"] == r["context"]), None)
            if b:
                md.append(f"| {name} | {r['context']} | {b['median_attention_s'] / r['median_attention_s']:.2f}x | "
                          f"{b['kv_read_bytes_per_token'] / r['kv_read_bytes_per_token']:.1f}x |")
    md.append("")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(md))
    return os.path.join(out, "report.md")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    print(write_report(a.folder, a.out or a.folder))


if __name__ == "__main__":
    main()
