"""Long context: dense decode against query-aware sparse decode (Problem::topk_tokens; include/attnlab/
kv_summary.hpp) - time per token, speed-up, and what the choice of pages costs (recall, O's error
against dense), per cache type and context length."""

import collections

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .figures import fmt, fmt_bytes, int_ticks, log_y_labels


def _cache(r):
    kv = r.get("kv_dtype")
    return r["dtype"] if kv in (None, "", "dtype") else kv


def _budget(r):
    """The point's topk_tokens (0: dense; a folder whose schema.json predates the axis reads it as text)."""
    try:
        return int(r.get("topk_tokens") or 0)
    except (TypeError, ValueError):
        return 0


def _groups(ok):
    """{(kernel, cache, shape without kv_len and the budget): {kv_len: {budget: row}}}, only where a
    sparse point has its dense twin."""
    groups = collections.defaultdict(lambda: collections.defaultdict(dict))
    for r in ok:
        dense_key = (r["kernel"], _cache(r), r["batch"], r["q_heads"], r["kv_heads"], r["q_len"], r["head_dim"],
                     r["threads"])
        groups[dense_key][r["kv_len"]][_budget(r)] = r
    return {k: v for k, v in groups.items() if any(b for per in v.values() for b in per)}


def long_context_section(plots, ok):
    groups = _groups(ok)
    if not groups:
        return []
    md = ["## Long context: query-aware sparse decode", "",
          "Dense decode reads every key; a sparse point (`topk_tokens` N) ranks the cache's 64-key pages by the "
          "bound its query gets from each page's element-wise min and max of K (kept beside the cache, "
          "`include/attnlab/kv_summary.hpp`), then attends exactly over the best pages within N keys per "
          "sequence and kv head, always with the pages of the first `topk_sinks` and the last `topk_recent` keys. "
          "Its verdict is the agreement rule over the pages it chose; what the choice costs is measured, not "
          "judged: **recall** is the softmax mass the chosen keys hold under dense attention (smallest over the "
          "verified rows, and their mean), **error vs dense** its O's relative error against the dense float64 "
          "reference (the largest). Speed-up: the dense point's time over the sparse one's, same kernel, cache "
          "and length, this run. % of roofline: against the bytes the point reads (the budget's keys and every "
          "page's summary). Memory: the cache's K and V, and its summaries (2 x head_dim float32 per page).", ""]
    for (kernel, cache, b, hq, hkv, sq, d, t), per_len in sorted(groups.items()):
        md += [f"**{kernel}, {cache} cache, b{b} h{hq}/{hkv} q{sq} d{d} t{t}**", "",
               "| keys | cache | summaries | budget | ms/token | speed-up | recall min (mean) | error vs dense "
               "| % of roofline | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
        for n in sorted(per_len):
            pts = per_len[n]
            dense = pts.get(0)
            for budget in sorted(pts):
                r = pts[budget]
                t_ms = r["time_median_s"] * 1e3
                speed = dense["time_median_s"] / r["time_median_s"] if dense and budget else None
                pages = -(-n // 64)
                summ = b * hkv * pages * 2 * d * 4
                cache_bytes = dense["kv_bytes"] if dense else None
                recall = (f"{r['recall_min']:.3f} ({r['recall_mean']:.3f})" if r.get("recall_min") is not None
                          else "1 (dense)")
                roof = r.get("roofline_fraction")
                md.append(f"| {n} | {fmt_bytes(cache_bytes) if budget == 0 else ''} | "
                          f"{fmt_bytes(summ) if budget == 0 else ''} | {budget or 'dense'} | {t_ms:.3g} | "
                          f"{fmt(speed, '.1f') + 'x' if speed else '-'} | {recall} | "
                          f"{fmt(r.get('err_o_rel_dense'), '.2g') if budget else '-'} | "
                          f"{fmt(None if roof is None else 100 * roof, '.0f')} | {r['verdict']} |")
        md.append("")
    _plot(plots, groups)
    return md


def _plot(plots, groups):
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(15, 4.6))
    cmap = plt.get_cmap("tab10")
    lens = set()
    for gi, ((kernel, cache, *_), per_len) in enumerate(sorted(groups.items())):
        color = cmap(gi % 10)
        budgets = sorted({bud for pts in per_len.values() for bud in pts})
        for bi, budget in enumerate(budgets):
            xs = [n for n in sorted(per_len) if budget in per_len[n]]
            lens.update(xs)
            label = f"{kernel} {cache} " + (f"topk {budget}" if budget else "dense")
            style = {"color": color, "marker": "os^Dv"[bi % 5], "linestyle": "-" if budget == 0 else ":"}
            a1.plot(xs, [per_len[n][budget]["time_median_s"] * 1e3 for n in xs], label=label, **style)
            if budget:
                sp = [(n, per_len[n][0]["time_median_s"] / per_len[n][budget]["time_median_s"]) for n in xs
                      if 0 in per_len[n]]
                a2.plot([x for x, _ in sp], [y for _, y in sp], label=label, **style)
                a3.plot(xs, [per_len[n][budget]["recall_min"] for n in xs], label=label, **style)
    for a in (a1, a2, a3):
        a.set_xscale("log", base=2)
        int_ticks(a, sorted(lens))
        a.set_xlabel("keys in the cache")
        a.grid(True, which="both", alpha=0.3)
        for tick in a.get_xticklabels():
            tick.set_rotation(30)
    log_y_labels(a1)
    log_y_labels(a2)
    a1.set_ylabel("ms per token per layer (median, log)")
    a2.set_ylabel("speed-up over dense decode (log)")
    a3.set_ylabel("recall: chosen keys' dense softmax mass (min over rows)")
    a3.set_ylim(0, 1.02)
    a1.set_title("Time per token")
    a2.set_title("Speed-up of the sparse decode")
    a3.set_title("Recall")
    a1.legend(fontsize=6)
    plots.save(fig, "long_context.png", "Long context: sparse decode's speed and recall",
               "Dense decode (solid) and query-aware sparse decode (dotted, one line per token budget) per cache "
               "type against the cache's length: time per token per layer, the sparse decode's speed-up over "
               "dense in the same run, and its recall (the smallest over the verified rows). The table in the "
               "section above has each point's error against dense and its roofline fraction.")
