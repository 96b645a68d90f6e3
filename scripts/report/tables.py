"""The report's tables: agreement, per-model, summary, the peers beside the lab."""

import collections
import math

from . import schema
from .figures import fmt, fmt_bytes
from .load import NARROW_TWINS, PEERS, is_decode, is_peer, pass_ratio_text, pass_ratios


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
          "cache keeps one 576-wide latent row per token, V being its first 512 columns: 2304 bytes, the row "
          "marked kv_shared; without it the lab stores V apart and decode reads 4352.) A model measured with "
          "another storage (dtype, kv_dtype, kv_shared) has a row per storage. A decode above 100% of the read "
          "bandwidth had its cache in the CPU caches.", "",
          "| model | heads q/kv | d_qk / d_v | mask | prefill (context: GFLOP/s, % of FMA peak) | decode at 4k: "
          "ms/token (% of read bandwidth, % of FMA peak) | decode at 32k | KV bytes/token/layer |",
          "|---|---|---|---|---|---|---|---|"]
    skipped = []

    def storage(r):
        return (r.get("dtype") or "f32", r.get("kv_dtype") or "dtype", str(r.get("kv_shared") or 0))

    def label(m, s):
        parts = ([s[0]] if s[0] != "f32" else []) + ([s[1] + " cache"] if s[1] != "dtype" else []) + \
            (["kv_shared: V = K's first d_v columns"] if s[2] not in ("0", "") else [])
        return m + (f" ({', '.join(parts)})" if parts else "")

    variants = [(m, s) for m in models
                for s in dict.fromkeys(storage(r) for r in rows if r.get("model") == m)]
    for m, s in variants:
        rm = [r for r in rows if r.get("model") == m and storage(r) == s]
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
        md.append(f"| {label(m, s)} | " + " ; ".join(dict.fromkeys(f"{r['q_heads']}/{r['kv_heads']}" for r in rm)) + " | "
                  + " ; ".join(dict.fromkeys(f"{r['head_dim']} / {r['head_dim_v']}" for r in rm)) + " | "
                  f"{', '.join(masks)} | {pre_text} | {decode_cell(4096)} | {decode_cell(32768)} | "
                  + " ; ".join(fmt(x, ".0f") for x in dict.fromkeys(r.get("kv_bytes_per_token") for r in rm)) + " |")
    md.append("")
    if skipped:
        md += ["Model points that did not run (not shrunk to fit): "
               + "; ".join(f"{shape_text(r)}: {r['status']} ({r['reason']})" for r in skipped), ""]
    return md


def roof(r):
    """The point's % of its roofline (results.csv roofline_fraction: the time it cannot beat, the larger
    of its bytes over the read bandwidth beside it and its products over its unit's peak) and the
    bound that holds; "-" for a run from before the roofline."""
    v = r.get("roofline_fraction")
    return "-" if v is None else f"{100 * v:.0f}% ({r.get('roofline_bound') or '?'})"


def summary_table(rows, ok, kernels, fits, fits_decode):
    lines = ["| kernel | fitted exponent | best GFLOP/s | best % of peak | best % of read bandwidth | "
             "best % of roofline | agreement | points ok / failed / skipped |",
             "|---|---|---|---|---|---|---|---|"]
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
        best_roof = max((r for r in ok_k if r.get("roofline_fraction")), key=lambda r: r["roofline_fraction"],
                        default={})
        counts = collections.Counter(r["status"] for r in rk)
        name = f"{k} (peer)" if is_peer(k) else k
        lines.append(f"| {name} | {exp} | {fmt(best_g, '.1f')} | "
                     f"{fmt(None if best_p is None else 100 * best_p, '.1f')} | "
                     f"{fmt(None if best_bw is None else 100 * best_bw, '.0f')} | {roof(best_roof)} | {agreement(rk)} | "
                     f"{counts['ok']} / {counts['failed']} / {counts['skipped']} |")
    return lines


def shape_key(r):
    return tuple(r.get(d) for d in schema.DIMS) + (r.get("pattern", ""),)


def peer_section(rows, ok, folder=None):
    """Peers beside the lab: each peer's version and how it was driven, then per shape the best
    lab kernel against the best peer (same run, same inputs, both verified), with the ratio -
    over all passes, and pass by pass where the folder keeps the repetitions (pass_ratios)."""
    present = [k for k in PEERS if any(r["kernel"] == k for r in rows)]
    if not present:
        return []
    md = ["## Peers: the lab's best against what users run", "",
          "Peers ran in the same sweep on the same inputs (`attnlab sweep --peers`; scripts/peers/), at the "
          "same thread count, timed like the lab's points (warm-up, then repetitions of >= min_time each; "
          "medians), and their O was checked against the same float64 reference with the same tolerance "
          "policy before its times were kept (a peer that disagrees is failed, not timed; ggml_fa on its own "
          "f16/q8_0/q4_0 caches with the tolerance its arithmetic implies, stated in its how). % of peak is "
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

        per_pass = [pass_ratios(folder, lab, p) for lab, p in pairs]
        passes = any(per_pass)

        md += [f"Best lab kernel against the best peer, per shape ({len(pairs)} shapes where both ran): "
               f"the lab is {gm:.2f}x the best peer's speed (geometric mean; from {min(ratios):.2f}x to "
               f"{max(ratios):.2f}x). Speed-up = best peer's median time / best lab kernel's."
               + (" Per pass: the same ratio from each pass's repetitions alone (the two points ran minutes "
                  "apart within a pass), median [min, max] over the passes - a ratio that moves between "
                  "passes moved with the host, not the code." if passes else ""), "",
               "| shape | mask | threads | best lab kernel | GFLOP/s (% peak) | best peer | GFLOP/s (% peak) | "
               "lab speed-up |" + (" per pass |" if passes else ""),
               "|---|---|---|---|---|---|---|---|" + ("---|" if passes else "")]
        for (lab, p), x, pp in zip(pairs, ratios, per_pass):
            md.append(f"| {shape_text(lab)} | {lab['mask']} | {lab['threads']} | {lab['kernel']} | {cell(lab)} | "
                      f"{p['kernel']} | {cell(p)} | {x:.2f}x |" + (f" {pass_ratio_text(pp)} |" if passes else ""))
        md.append("")
    return md


# The fields shape_text writes in its own words.
SHAPE_TEXT_FIELDS = {"batch", "q_heads", "kv_heads", "q_len", "kv_len", "head_dim", "head_dim_v", "model", "layout",
                     "dtype", "mask", "threads"}


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
    # Any other shape field of the folder's schema away from its default (kv_dtype, a new axis).
    for name, default in schema.DEFAULTS.items():
        if name not in SHAPE_TEXT_FIELDS and r.get(name) is not None and str(r[name]) != str(default):
            s += f" {name} {r[name]}"
    return s


def kv_cache_section(rows, ok):
    """Decode per KV-cache storage (dtype, kv_dtype) on each shape: time per token, the bytes each
    type stores per token, the speed-up over the float32 cache in the same run, % of the read
    bandwidth measured beside the point (the probe's median and best), and what the storage costs
    in accuracy (O's error against float64 on the float values before rounding or quantizing)."""
    dec = [r for r in ok if is_decode(r) and r.get("kv_dtype") not in (None, "")]
    types = {(r.get("dtype", "f32"), r["kv_dtype"]) for r in dec}
    if len(types) < 2:
        return []

    def storage(r):
        return r["dtype"] if r["kv_dtype"] == "dtype" else r["kv_dtype"]

    def shape(r):
        return tuple((k, r.get(k)) for k in schema.DIMS if k not in ("dtype", "kv_dtype"))

    md = ["## KV cache: decode per cache type", "",
          "Each row is one decode point (q_len <= 16) with its K/V cache stored as the row says: float32, "
          "16-bit, or a quantized layout (include/attnlab/kv_quant.hpp: ggml's q8_0/q4_0 blocks, "
          "OpenVINO's u8/u4 rows, fp8). Bytes per token: K and V of one token, all KV heads. vs f32: "
          "the float32 cache's time on the same shape in this run over this row's. % of read bandwidth "
          "against the probe measured beside the point (before and after each pass of its repetitions: "
          "median, and best); the probe's range shows how much the machine moved meanwhile. Error: O's "
          "relative error against float64 on the float values the cache was written from (what the "
          "storage costs), next to its error against the cache as stored (the kernel's own, judged by "
          "the tolerance). % of roofline: the time the point cannot beat - its bytes over the probe's "
          "bandwidth or its products over its unit's peak, whichever is larger (named) - over its time.", ""]
    groups = collections.defaultdict(list)
    for r in dec:
        groups[shape(r)].append(r)
    for key, rs in groups.items():
        base = next((r for r in rs if storage(r) == "f32" and r["kernel_name"] == rs[0]["kernel_name"]), None)
        md += [f"**{shape_text(dict(rs[0], dtype='f32', kv_dtype='dtype'))}**", "",
               "| kernel | cache | bytes/token | ms/token | vs f32 | GB/s | % of read BW (probe median / best) "
               "| % of roofline | probe GB/s min-max | error vs unquantized / vs stored |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(rs, key=lambda r: (r["kernel"], r["kv_bytes_per_token"] or 0)):
            t = r["time_median_s"]
            speed = base["time_median_s"] / t if base and r["kernel_name"] == base["kernel_name"] else None
            gbs = r["kv_bytes"] / t / 1e9 if r.get("kv_bytes") else None
            pm, pb = r.get("bw_fraction_probe_median"), r.get("bw_fraction_probe_best")
            bw = (f"{fmt(100 * pm, '.0f')} / {fmt(100 * pb, '.0f')}" if pm is not None and pb is not None
                  else f"{fmt(None if r.get('bw_fraction') is None else 100 * r['bw_fraction'], '.0f')} (sweep peak)")
            probe = (f"{fmt(r['probe_read_gbs_min'], '.1f')}-{fmt(r['probe_read_gbs_max'], '.1f')}"
                     if r.get("probe_read_gbs_min") is not None else "-")
            md.append(f"| {r['kernel']} | {storage(r)} | {fmt(r['kv_bytes_per_token'], '.0f')} | "
                      f"{fmt(t * 1e3, '.3g')} | {fmt(speed, '.2f')}x | {fmt(gbs, '.1f')} | {bw} | {roof(r)} | {probe} | "
                      f"{fmt(r.get('err_o_rel_f32_inputs'), '.1e')} / {fmt(r.get('err_o_rel'), '.1e')} |")
        md.append("")
    return md


# A narrow-arithmetic kernel and the float32 kernel it narrows (the same driver, the same bytes).


def arithmetic_section(rows, ok, folder=None):
    """A narrow-arithmetic kernel against its float32 twin on the same point (same shape, cache and
    target, same run): the time of each, the speed-up (and pass by pass with paired rounds), % of
    the read bandwidth each reached against the probe beside it, and what each costs in accuracy:
    O's error against float64 on the unrounded inputs, and the tolerance its arithmetic is held to."""
    fields = sorted(set(schema.DIMS) | {"dtype", "kv_dtype", "kv_block", "kv_shared", "threads", "isa"})

    def key(r):
        return tuple((k, str(r.get(k))) for k in fields)

    def raw(r):  # the kernel's own name (label_targets writes kernel[isa] into "kernel")
        return r.get("kernel_name") or r["kernel"]

    floats = {(raw(r), key(r)): r for r in ok}

    def twin(r):
        name, isa = NARROW_TWINS[raw(r)]
        return floats.get((name, key(dict(r, isa=isa) if isa else r)))

    pairs = [(r, twin(r)) for r in ok if raw(r) in NARROW_TWINS]
    pairs = [(n, f) for n, f in pairs if f]
    if not pairs:
        return []
    md = ["## Arithmetic: narrow products against float32", "",
          "Each row: a narrow-arithmetic kernel and its float32 twin on the same point in this run "
          "(decode_i8: Q rounded to int8 once per row, K.Q as int32 dot products on the cache's codes, "
          "P times V's scales rounded to 8 bits per whole 64-key tile and P.V as int32 sums on V's codes "
          "(where the CPU has VNNI), against decode, every code widened to float32; flash_int8: K smoothed "
          "by its mean and rounded "
          "per key, Q per row, Q.K^T as int32 dot products, against float32 flash on the same target; "
          "flash_int8_amx: the same on the AMX tiles with a bf16 P.V, against flash on avx512). Speed-up: the twin's "
          "median time over the narrow kernel's, and pass by pass (median [min, max]) where the sweep ran "
          "paired rounds. % of peak: against the float32 FMA peak of the point's target for both (the "
          "narrow kernels' softmax is float32); % of read BW: against the probe measured beside "
          "each point (median; decode's figure of merit). Error: O's relative error against float64 on "
          "the unrounded inputs (the end-to-end price of the arithmetic), with the tolerance each is held "
          "to (int8 products: 4x the textbook's error on the Q, K and P it multiplies, rounded as it rounds "
          "them). % of roofline: each point's time it cannot beat (its bytes over the read bandwidth, or "
          "its products over the peak of the unit it multiplies on - vpdpbusd's for int8 products - "
          "whichever is larger, named) over its time: one figure of merit for both.", "",
          "| shape | cache | isa | float32 ms | narrow ms | speed-up | per pass | % of FMA peak f32 / narrow "
          "| % of read BW f32 / narrow | % of roofline f32 / narrow | error f32 / narrow | tolerance narrow |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def pct(r):
        v = r.get("bw_fraction_probe_median")
        return fmt(None if v is None else 100 * v, ".0f")

    def peak(r):
        v = r.get("peak_fraction")
        return fmt(None if v is None else 100 * v, ".0f")

    def label(r):  # the shape and, when there is one, its mask (a dense and a causal twin differ only there)
        mask = r.get("mask")
        return shape_text(dict(r, kv_dtype="dtype")) + (f" {mask}" if mask and mask != "none" else "")

    def order(nf):
        return label(nf[0]), str(nf[0].get("kv_dtype")), nf[0].get("isa") or ""

    for n, f in sorted(pairs, key=order):
        cache = n["dtype"] if n.get("kv_dtype") in (None, "", "dtype") else n["kv_dtype"]
        md.append(f"| {label(n)} | {cache} | {n.get('isa') or '-'} | "
                  f"{fmt(f['time_median_s'] * 1e3, '.3g')} | {fmt(n['time_median_s'] * 1e3, '.3g')} | "
                  f"{fmt(f['time_median_s'] / n['time_median_s'], '.2f')}x | "
                  f"{pass_ratio_text(pass_ratios(folder, n, f))} | "
                  f"{peak(f)} / {peak(n)} | "
                  f"{pct(f)} / {pct(n)} | {roof(f)} / {roof(n)} | "
                  f"{fmt(f.get('err_o_rel'), '.1e')} / {fmt(n.get('err_o_rel'), '.1e')} | "
                  f"{fmt(n.get('tol_o_rel'), '.1e')} |")
    md.append("")
    return md


def paged_section(rows, ok):
    """Paged caches against their contiguous twin (the same point with kv_block 0, same run): the
    time ratio per block size, and % of the read bandwidth each reached against the probe measured
    beside it; a mixed-length batch (kv_lens) shows its bandwidth on its total bytes."""
    paged = [r for r in ok if int(r.get("kv_block") or 0) > 0]
    if not paged:
        return []

    def twin_key(r):
        return tuple((k, str(r.get(k))) for k in schema.DIMS if k != "kv_block") + (("kernel", r["kernel"]),)

    contiguous = {twin_key(r): r for r in ok if int(r.get("kv_block") or 0) == 0}
    md = ["## KV cache: paged against contiguous", "",
          "A paged cache (kv_block > 0) keeps K and V in a pool of blocks of kv_block tokens (each all KV heads), "
          "each sequence's blocks scattered over the pool through a block table (vLLM's and OpenVINO's "
          "PagedAttention). Each row is a paged point and its contiguous twin (kv_block 0, same shape, same "
          "run; paired rounds when the experiment has rounds > 1). time ratio: paged over contiguous (1.00 = "
          "no cost). A row with kv_lens is a mixed-length batch: its bytes are its sequences' own.", "",
          "| shape | cache | kv_block | ms contiguous | ms paged | paged / contiguous | "
          "% of read BW contiguous / paged (probe median) |", "|---|---|---|---|---|---|---|"]

    def bw(r):
        pm = r.get("bw_fraction_probe_median")
        return fmt(None if pm is None else 100 * pm, ".0f")

    for r in sorted(paged, key=lambda r: (shape_text(dict(r, kv_block=0)), str(r.get("dtype")),
                                          str(r.get("kv_dtype")), int(r["kv_block"]))):
        c = contiguous.get(twin_key(r))
        cache = r["dtype"] if r.get("kv_dtype") in (None, "", "dtype") else r["kv_dtype"]
        tc = c["time_median_s"] if c else None
        ratio = r["time_median_s"] / tc if tc else None
        md.append(f"| {shape_text(dict(r, kv_block=0, dtype='f32', kv_dtype='dtype'))} | {cache} | {r['kv_block']} | "
                  f"{fmt(None if tc is None else tc * 1e3, '.3g')} | {fmt(r['time_median_s'] * 1e3, '.3g')} | "
                  f"{fmt(ratio, '.3f')} | {bw(c) if c else '-'} / {bw(r)} |")
    md.append("")
    return md



PASSES = ("forward", "backward", "forward_backward")


def training_section(rows, ok):
    """The backward pass (rows whose `pass` is not the forward; experiments/training.json): per
    shape, each kernel's and peer's time and % of the FMA peak per pass, backward / forward, the
    backward's extra memory beside the n^2 a materialized P would take; then flash's backward
    against the peers' and what a causal mask saves each pass."""
    if not any(r.get("pass") not in (None, "", "forward") for r in rows):
        return []

    def shape(r):
        return tuple((k, str(r.get(k))) for k in schema.DIMS if k != "pass")

    cells = collections.defaultdict(dict)  # shape -> kernel -> pass -> row
    for r in ok:
        cells[shape(r)].setdefault(r["kernel"], {})[r.get("pass") or "forward"] = r
    md = ["## Training: forward, backward and both", "",
          "Each point is one pass of attention: the forward (O, LSE), the backward (dQ, dK, dV from a random dO and "
          "the kernel's own forward's O and LSE, the forward outside the timed call) or both in turn (a training "
          "step's attention). FLOPs of the backward: 2.5x the forward's (FlashAttention's convention: five n^2 "
          "GEMMs against two), both 3.5x, so % of peak compares like with like. Gradients are checked before "
          "timing on sampled rows (dQ) and keys (dK, dV) against float64 of the same formulas (results.csv "
          "err_dq/err_dk/err_dv against tol_*). Peers: PyTorch SDPA's autograd (torch.autograd.grad on a "
          "retained graph) and jax.vjp's function, jitted. Extra memory: the lab's workspace (declared), a peer's "
          "peak RSS growth over its inputs (measured); n^2: one float32 P matrix of the shape, what a "
          "materialized backward holds at least.", "",
          "| shape | mask | kernel | forward ms (% peak) | backward ms (% peak) | both ms (% peak) | backward / "
          "forward | backward's extra memory (n^2: P) |", "|---|---|---|---|---|---|---|---|"]

    def cell(r):
        if r is None:
            return "-"
        pf = r.get("peak_fraction")
        return f"{fmt(r['time_median_s'] * 1e3, '.4g')} ({fmt(None if pf is None else 100 * pf, '.0f')}%)"

    vs_peer = collections.defaultdict(list)  # peer -> [peer backward time / flash backward time]
    def order(key):  # numbers as numbers (1024 < 2048 < 16384), then text
        return [(0, int(v), "") if v.lstrip("-").isdigit() else (1, 0, v) for _, v in key]

    for key in sorted(cells, key=order):
        by_kernel = cells[key]
        for k, passes in by_kernel.items():
            any_row = next(iter(passes.values()))
            f, b = passes.get("forward"), passes.get("backward")
            ratio = b["time_median_s"] / f["time_median_s"] if f and b else None
            n2 = 4 * any_row["batch"] * any_row["q_heads"] * any_row["q_len"] * any_row["kv_len"]
            mem = f"{fmt_bytes(b['extra_bytes'])} ({fmt_bytes(n2)})" if b and b.get("extra_bytes") is not None else "-"
            name = f"{k} (peer)" if is_peer(k) else k
            md.append(f"| {shape_text(dict(any_row, **{'pass': 'forward'}))} | {any_row['mask']} | {name} | "
                      f"{cell(f)} | {cell(b)} | {cell(passes.get('forward_backward'))} | {fmt(ratio, '.2f')} | {mem} |")
            if is_peer(k) and b and "flash" in by_kernel and "backward" in by_kernel["flash"]:
                vs_peer[k].append(b["time_median_s"] / by_kernel["flash"]["backward"]["time_median_s"])
    md.append("")
    for peer, xs in vs_peer.items():
        gm = math.exp(sum(math.log(x) for x in xs) / len(xs))
        md.append(f"- flash's backward against {peer}'s: {gm:.2f}x its speed (geometric mean over {len(xs)} shapes; "
                  f"{min(xs):.2f}x to {max(xs):.2f}x).")
    # The causal saving: per kernel and pass, time without a mask over time with the causal mask.
    saving = collections.defaultdict(list)
    for key, by_kernel in cells.items():
        d = dict(key)
        if d.get("mask") != "causal":
            continue
        twin = cells.get(tuple((k, "none" if k == "mask" else v) for k, v in key), {})
        for k, passes in by_kernel.items():
            for p, r in passes.items():
                t = twin.get(k, {}).get(p)
                if t:
                    saving[(k, p)].append(t["time_median_s"] / r["time_median_s"])
    if saving:
        md.append("- The causal saving (time without a mask / time with the causal mask, same shape; half the pairs "
                  "are visible, so 2x is the ideal): " + "; ".join(
                      f"{k} {p} {min(xs):.2f}-{max(xs):.2f}x" for (k, p), xs in sorted(saving.items())) + ".")
    md.append("")
    return md
