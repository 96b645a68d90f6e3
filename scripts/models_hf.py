#!/usr/bin/env python3
"""Generation end to end in a transformers model: the model's attention on SDPA or on the lab
(attnlab.hf), its KV cache transformers' (DynamicCache, QuantizedCache) or the lab's (attnlab.hf.LabCache
per cache type), time to first token and time per output token per context length, the share of
each step spent in attention and in the cache, and the tokens against SDPA's.

    .venv-peers/bin/python scripts/models_hf.py --out results/DATE-models_hf [--contexts 1024,4096]
        [--implementations sdpa,attnlab,lab:q8_0,hqq:4]      (PYTHONPATH=build/python or pip install .)
    /usr/bin/python3 scripts/models_hf.py --plot results/DATE-models_hf   (summary.md and the plot again)
    scripts/lab report models_hf [ARGS]     (the venv, the build, this script, its plot)

The model: a Llama-architecture decoder with a real model's attention shape (32 query / 8 key-value
heads, head_dim 128, hidden 4096, MLP 14336, vocabulary 32000; --layers of them, random weights made
here: no download), float32. The implementations (--implementations, default all; "sdpa" always
runs, first, as the reference):
  sdpa            transformers' SDPA over DynamicCache (float32)
  attnlab         the lab's attention (flash for the prompt, decode per token) over DynamicCache
  lab:TYPE        the lab's attention over attnlab.hf.LabCache(kv_dtype=TYPE): f32, bf16, f16, q8_0,
                  q4_0, u8, u4, fp8_e4m3, fp8_e5m2; lab:TYPE/paged (16-token blocks), lab:TYPE/i8
                  (decode_i8: integer dot products)
  hqq:N, quanto:N SDPA over transformers' QuantizedCache (HQQ / optimum-quanto, N bits; each step
                  dequantizes the cache), fp8: its FP8 backend
Per context n: SDPA runs the prompt of n random tokens (time to first token), then --steps greedy
tokens one at a time (time per output token: the median step); every other implementation then runs
the same prompt and is fed SDPA's tokens (teacher forcing), so each step's logits are compared with
SDPA's on the same history: the steps whose greedy token is SDPA's, and the largest logit error
relative to SDPA's largest logit. Attention's time (the attention function) and the cache's (its
update: the append, and QuantizedCache's (de)quantization) are measured inside the model with
timers, so their shares of a step are measured, not modelled. Rows are added to --out's
models_hf.csv (an implementation measured again at a context replaces its row), written whole after
each point, with summary.md.
"""
import argparse
import csv
import io
import os
import statistics
import sys
import time

FIELDS = ["implementation", "context", "layers", "q_heads", "kv_heads", "head_dim", "threads", "ttft_s",
          "prefill_attention_s", "tpot_s", "step_attention_s", "step_cache_s", "attention_share", "cache_share",
          "cache_bytes", "steps", "tokens_agree", "logits_rel_err"]
LAB_TYPES = ("f32", "bf16", "f16", "q8_0", "q4_0", "u8", "u4", "fp8_e4m3", "fp8_e5m2")
DEFAULT = ["sdpa", "attnlab", "lab:f32", "lab:bf16", "lab:q8_0", "lab:q4_0", "lab:u8", "lab:u4", "lab:fp8_e4m3",
           "lab:q8_0/paged", "lab:q8_0/i8", "lab:u8/i8", "hqq:4", "quanto:4", "fp8"]


def make_cache(name, config):
    """(attention implementation, cache) for an implementation's name (see the docstring)."""
    import attnlab.hf
    from transformers import DynamicCache, QuantizedCache

    if name in ("sdpa", "attnlab"):
        return name, DynamicCache()
    if name.startswith("lab:"):
        kind, _, variant = name[4:].partition("/")
        if variant not in ("", "paged", "i8"):
            raise ValueError(f"{name}: variant '{variant}'; allowed: paged, i8")
        return "attnlab", attnlab.hf.LabCache(config, kv_dtype=kind, block=16 if variant == "paged" else 0,
                                              decode_kernel="decode_i8" if variant == "i8" else "decode")
    backend, _, bits = name.partition(":")
    if backend in ("hqq", "quanto") and bits.isdigit():
        return "sdpa", QuantizedCache(backend, config, nbits=int(bits))
    if name == "fp8":
        return "sdpa", QuantizedCache("fp8", config)
    raise ValueError(f"--implementations: '{name}'; allowed: sdpa, attnlab, lab:TYPE[/paged|/i8] (TYPE one of "
                     f"{', '.join(LAB_TYPES)}), hqq:N, quanto:N, fp8")


def cache_bytes(cache):
    """The bytes a cache's K and V take: LabCache's storage, DynamicCache's tensors; "" for
    QuantizedCache (its backends' objects)."""
    if hasattr(cache, "nbytes"):
        return cache.nbytes()
    if type(cache).__name__ == "DynamicCache":
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    return ""


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def measure(args, rows):
    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    import attnlab.hf

    torch.set_num_threads(args.threads)
    clock = {"attention": 0.0, "cache": 0.0}

    def timed(fn, part):
        def run(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            clock[part] += time.perf_counter() - t0
            return out
        return run

    AttentionInterface.register("sdpa_timed", timed(sdpa_attention_forward, "attention"))
    AttentionMaskInterface.register("sdpa_timed", sdpa_mask)
    attnlab.hf.register()
    AttentionInterface.register("attnlab_timed", timed(attnlab.hf.attention_forward, "attention"))
    AttentionMaskInterface.register("attnlab_timed", attnlab.hf._mask)

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                                      max_position_embeddings=max(args.contexts) + args.steps + 16)
    model = transformers.LlamaForCausalLM(config).eval()
    names = ["sdpa"] + [x for x in args.implementations if x != "sdpa"]
    for name in names:
        make_cache(name, config)  # every name understood before the first point

    def run(name, ids, forced=None):
        """The prompt, then args.steps tokens - greedy, or `forced`'s; (row, tokens, logits)."""
        impl, cache = make_cache(name, config)
        model.set_attn_implementation(impl + "_timed")
        cache.update = timed(cache.update, "cache")
        with torch.no_grad():
            clock.update(attention=0.0, cache=0.0)
            t0 = time.perf_counter()
            out = model(ids, cache=cache, use_cache=True, logits_to_keep=1)  # the last position's logits only
            ttft = time.perf_counter() - t0
            prefill_attention = clock["attention"]
            logits = [out.logits[0, -1].clone()]
            tokens = [int(logits[-1].argmax())] if forced is None else forced
            steps, attention, cached = [], [], []
            for i in range(args.steps):
                clock.update(attention=0.0, cache=0.0)
                t0 = time.perf_counter()
                out = model(torch.tensor([[tokens[i]]]), cache=cache, use_cache=True)
                steps.append(time.perf_counter() - t0)
                attention.append(clock["attention"])
                cached.append(clock["cache"])
                logits.append(out.logits[0, -1].clone())
                if forced is None:
                    tokens.append(int(logits[-1].argmax()))
        tpot, step_attention, step_cache = (statistics.median(x) for x in (steps, attention, cached))
        row = {"implementation": name, "context": len(ids[0]), "layers": args.layers, "q_heads": 32, "kv_heads": 8,
               "head_dim": 128, "threads": args.threads, "ttft_s": f"{ttft:.6g}",
               "prefill_attention_s": f"{prefill_attention:.6g}", "tpot_s": f"{tpot:.6g}",
               "step_attention_s": f"{step_attention:.6g}", "step_cache_s": f"{step_cache:.6g}",
               "attention_share": f"{step_attention / tpot:.4f}", "cache_share": f"{step_cache / tpot:.4f}",
               "cache_bytes": cache_bytes(cache), "steps": args.steps, "tokens_agree": "", "logits_rel_err": ""}
        print(f"{name:16s} n {len(ids[0]):6d}: first token {ttft:8.3f} s (attention {prefill_attention:7.3f} s), "
              f"per token {tpot * 1e3:8.2f} ms (attention {step_attention * 1e3:7.2f} ms, cache "
              f"{step_cache * 1e3:7.2f} ms)", flush=True)
        return row, tokens, torch.stack(logits)

    run("sdpa", torch.zeros(1, 64, dtype=torch.long))  # warm-up: first-call allocations, thread pools
    run("attnlab", torch.zeros(1, 64, dtype=torch.long))
    for n in args.contexts:
        ids = torch.randint(0, config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        ref, tokens, want = run("sdpa", ids)
        ref["tokens_agree"], ref["logits_rel_err"] = f"{args.steps + 1}/{args.steps + 1}", "0"
        points = [ref]
        for name in names[1:]:
            row, _, got = run(name, ids, forced=tokens)
            row["tokens_agree"] = f"{int((got.argmax(-1) == want.argmax(-1)).sum())}/{len(want)}"
            row["logits_rel_err"] = f"{float((got - want).abs().max() / want.abs().max()):.3g}"
            points.append(row)
        for p in points:  # a point measured again replaces its row
            rows[:] = [r for r in rows if (r["implementation"], int(r["context"])) != (p["implementation"], n)]
            rows.append(p)
        rows.sort(key=lambda r: (int(r["context"]), names.index(r["implementation"])
                                 if r["implementation"] in names else len(names)))
        text = io.StringIO()
        w = csv.DictWriter(text, FIELDS)
        w.writeheader()
        w.writerows(rows)
        write_atomic(os.path.join(args.out, "models_hf.csv"), text.getvalue())
    return rows


def summary(rows):
    """One table per context: each implementation's first token and step, their attention and cache
    parts, the cache's size and the tokens against SDPA's."""
    md = []

    def f(x):  # (a CSV written before a column existed reads as 0 there)
        return float(x or 0)
    for n in sorted({int(r["context"]) for r in rows}):
        at = [r for r in rows if int(r["context"]) == n]
        ref = next((r for r in at if r["implementation"] == "sdpa"), None)
        md += [f"### context {n}", "",
               "| implementation | first token | per token | SDPA / it per token | attention per token | "
               "cache per token | K/V bytes | greedy tokens as SDPA's | largest logit error |",
               "|---|---|---|---|---|---|---|---|---|"]
        for r in at:
            speed = f"{f(ref['tpot_s']) / f(r['tpot_s']):.2f}x" if ref else "-"
            size = f"{int(r['cache_bytes']) / 2**20:.0f} MiB" if r.get("cache_bytes") else "-"
            md.append(f"| {r['implementation']} | {f(r['ttft_s']):.2f} s | {1e3 * f(r['tpot_s']):.1f} ms | {speed} | "
                      f"{1e3 * f(r['step_attention_s']):.2f} ms ({100 * f(r['attention_share']):.1f}%) | "
                      f"{1e3 * f(r.get('step_cache_s')):.2f} ms ({100 * f(r.get('cache_share')):.1f}%) | {size} | "
                      f"{r['tokens_agree']} | {f(r.get('logits_rel_err')):.2g} |")
        md.append("")
    return "\n".join(md)


def plot(folder):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(folder, "models_hf.csv")) as f:
        rows = list(csv.DictReader(f))
    names = list(dict.fromkeys(r["implementation"] for r in rows))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5))
    cmap = plt.get_cmap("tab20")
    for i, name in enumerate(names):
        rs = sorted((r for r in rows if r["implementation"] == name), key=lambda r: int(r["context"]))
        n = [int(r["context"]) for r in rs]
        style = dict(color="black" if name == "sdpa" else cmap(i % 20), marker="o",
                     linestyle="-" if name.startswith(("sdpa", "attnlab", "lab:")) else "--")
        a1.plot(n, [1e3 * (float(r["step_attention_s"]) + float(r.get("step_cache_s") or 0)) for r in rs], label=name,
                **style)
        a2.plot(n, [float(r["ttft_s"]) for r in rs], label=name, **style)
    for a, t in ((a1, "attention + cache per output token (ms, median step)"), (a2, "time to first token (s)")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("context (tokens)")
        a.set_title(t)
        a.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    out = os.path.join(folder, "generation.png")
    fig.savefig(out + ".tmp.png", dpi=110)
    os.replace(out + ".tmp.png", out)
    print(out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the results folder (made if absent)")
    ap.add_argument("--contexts", default="1024,2048,4096,8192")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--implementations", default=",".join(DEFAULT), help="comma-separated; see above")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--plot", metavar="FOLDER", help="FOLDER's summary.md and plot from its models_hf.csv "
                                                     "(matplotlib) and exit")
    args = ap.parse_args(argv)
    if args.plot:  # (no torch needed: the CSV's summary and plot)
        with open(os.path.join(args.plot, "models_hf.csv")) as f:
            write_atomic(os.path.join(args.plot, "summary.md"), summary(list(csv.DictReader(f))))
        plot(args.plot)
        return 0
    if not args.out:
        ap.error("--out: required (a results folder)")
    try:
        args.contexts = [int(x) for x in args.contexts.split(",")]
    except ValueError:
        ap.error(f"--contexts: '{args.contexts}'; allowed: comma-separated integers")
    if args.steps < 1 or args.layers < 1 or any(n < 1 for n in args.contexts):
        ap.error("--steps, --layers and every context: >= 1")
    args.implementations = [x for x in args.implementations.split(",") if x]
    os.makedirs(args.out, exist_ok=True)
    rows = []
    path = os.path.join(args.out, "models_hf.csv")
    if os.path.exists(path):  # earlier points of this folder: kept unless measured again
        with open(path) as f:
            rows = [r for r in csv.DictReader(f) if r.get("step_cache_s") is not None]
    rows = measure(args, rows)
    write_atomic(os.path.join(args.out, "summary.md"), summary(rows))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
