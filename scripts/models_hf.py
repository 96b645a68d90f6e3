#!/usr/bin/env python3
"""Generation end to end in a transformers model: the model's attention on SDPA or on the lab
(attnlab.hf), time to first token and time per output token per context length, and attention's
share of each.

    .venv-peers/bin/python scripts/models_hf.py --out results/DATE-models_hf [--contexts 1024,4096]
    /usr/bin/python3 scripts/models_hf.py --plot results/DATE-models_hf      (matplotlib)

The model: a Llama-architecture decoder with a real model's attention shape (32 query / 8 key-value
heads, head_dim 128, hidden 4096, MLP 14336, vocabulary 32000; --layers of them, random weights made
here: no download), float32, transformers' DynamicCache. Per context n and implementation, in turn
(both on the same drifting host, minutes apart at most): the prompt of n
random tokens through the model (time to first token: the prefill), then --steps greedy tokens one at
a time (time per output token: the median step); which implementation goes first alternates per
context, after a warm-up of both. Attention's time is measured inside the model -
each implementation wrapped by a timer around its attention function, registered as
"sdpa_timed" / "attnlab_timed" with the same mask builder - so its share of a step is measured, not
modelled. The greedy tokens of the two are compared (the same tokens, or the first step they differ).
Writes models_hf.csv (whole, after every point) and summary.md into --out.
"""
import argparse
import csv
import io
import os
import statistics
import sys
import time

FIELDS = ["implementation", "context", "layers", "q_heads", "kv_heads", "head_dim", "threads", "ttft_s",
          "prefill_attention_s", "tpot_s", "step_attention_s", "attention_share", "steps", "tokens_agree"]


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def measure(args):
    import torch
    import transformers
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    import attnlab.hf

    torch.set_num_threads(args.threads)
    clock = {"attention": 0.0}

    def timed(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            out = fn(*a, **kw)
            clock["attention"] += time.perf_counter() - t0
            return out
        return run

    AttentionInterface.register("sdpa_timed", timed(sdpa_attention_forward))
    AttentionMaskInterface.register("sdpa_timed", sdpa_mask)
    attnlab.hf.register()
    AttentionInterface.register("attnlab_timed", timed(attnlab.hf.attention_forward))
    AttentionMaskInterface.register("attnlab_timed", attnlab.hf._mask)

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                                      num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=8,
                                      max_position_embeddings=max(args.contexts) + args.steps + 16)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # warm-up: first-call allocations and thread pools out of the first point
        for impl in ("sdpa_timed", "attnlab_timed"):
            model.set_attn_implementation(impl)
            out = model(torch.zeros(1, 64, dtype=torch.long), use_cache=True, logits_to_keep=1)
            model(out.logits[:, -1:].argmax(-1), past_key_values=out.past_key_values, use_cache=True)
    rows = []
    for i, n in enumerate(args.contexts):
        ids = torch.randint(0, config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        tokens = {}
        order = ("sdpa_timed", "attnlab_timed") if i % 2 == 0 else ("attnlab_timed", "sdpa_timed")
        for impl in order:
            model.set_attn_implementation(impl)
            with torch.no_grad():
                clock["attention"] = 0.0
                t0 = time.perf_counter()
                out = model(ids, use_cache=True, logits_to_keep=1)  # the last position's logits only
                ttft = time.perf_counter() - t0
                prefill_attention = clock["attention"]
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                steps, attention, seq = [], [], [int(nxt)]
                for _ in range(args.steps):
                    clock["attention"] = 0.0
                    t0 = time.perf_counter()
                    out = model(nxt, past_key_values=past, use_cache=True)
                    steps.append(time.perf_counter() - t0)
                    attention.append(clock["attention"])
                    past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                    seq.append(int(nxt))
            tokens[impl] = seq
            tpot, step_attention = statistics.median(steps), statistics.median(attention)
            rows.append({"implementation": impl.replace("_timed", ""), "context": n, "layers": args.layers,
                         "q_heads": 32, "kv_heads": 8, "head_dim": 128, "threads": args.threads,
                         "ttft_s": f"{ttft:.6g}", "prefill_attention_s": f"{prefill_attention:.6g}",
                         "tpot_s": f"{tpot:.6g}", "step_attention_s": f"{step_attention:.6g}",
                         "attention_share": f"{step_attention / tpot:.4f}", "steps": args.steps,
                         "tokens_agree": ""})
            print(f"{impl:14s} n {n:6d}: first token {ttft:8.3f} s (attention {prefill_attention:7.3f} s), "
                  f"per token {tpot * 1e3:8.2f} ms (attention {step_attention * 1e3:7.2f} ms, "
                  f"{100 * step_attention / tpot:4.1f}%)", flush=True)
        a, b = tokens["sdpa_timed"], tokens["attnlab_timed"]
        agree = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        for r in rows[-2:]:
            r["tokens_agree"] = f"{agree}/{len(a)}"
        rows[-2:] = sorted(rows[-2:], key=lambda r: r["implementation"] != "sdpa")
        text = io.StringIO()
        w = csv.DictWriter(text, FIELDS)
        w.writeheader()
        w.writerows(rows)
        write_atomic(os.path.join(args.out, "models_hf.csv"), text.getvalue())
    return rows


def summary(rows):
    by = {(r["implementation"], int(r["context"])): r for r in rows}
    contexts = sorted({int(r["context"]) for r in rows})
    md = ["| context | SDPA first token | lab first token | lab / SDPA | SDPA per token (attention) | "
          "lab per token (attention) | SDPA / lab per token | greedy tokens equal |",
          "|---|---|---|---|---|---|---|---|"]
    for n in contexts:
        s, l_ = by.get(("sdpa", n)), by.get(("attnlab", n))
        if not s or not l_:
            continue
        f = lambda r, k: float(r[k])
        md.append(f"| {n} | {f(s, 'ttft_s'):.2f} s | {f(l_, 'ttft_s'):.2f} s | {f(l_, 'ttft_s') / f(s, 'ttft_s'):.2f}x | "
                  f"{1e3 * f(s, 'tpot_s'):.1f} ms ({1e3 * f(s, 'step_attention_s'):.2f} ms, "
                  f"{100 * f(s, 'attention_share'):.1f}%) | {1e3 * f(l_, 'tpot_s'):.1f} ms "
                  f"({1e3 * f(l_, 'step_attention_s'):.2f} ms, {100 * f(l_, 'attention_share'):.1f}%) | "
                  f"{f(s, 'tpot_s') / f(l_, 'tpot_s'):.2f}x | {s['tokens_agree']} |")
    return "\n".join(md) + "\n"


def plot(folder):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(os.path.join(folder, "models_hf.csv")) as f:
        rows = list(csv.DictReader(f))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for impl, color in (("sdpa", "black"), ("attnlab", "tab:blue")):
        rs = sorted((r for r in rows if r["implementation"] == impl), key=lambda r: int(r["context"]))
        n = [int(r["context"]) for r in rs]
        a1.plot(n, [1e3 * float(r["step_attention_s"]) for r in rs], "o-", color=color, label=f"{impl}: attention")
        a1.plot(n, [1e3 * (float(r["tpot_s"]) - float(r["step_attention_s"])) for r in rs], "s--", color=color,
                label=f"{impl}: the rest of the step")
        a2.plot(n, [float(r["ttft_s"]) for r in rs], "o-", color=color, label=f"{impl}: first token")
        a2.plot(n, [float(r["prefill_attention_s"]) for r in rs], "s--", color=color, label=f"{impl}: its attention")
    for a, t in ((a1, "per output token (ms, median step)"), (a2, "time to first token (s)")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("context (tokens)")
        a.set_title(t)
        a.grid(True, which="both", alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    out = os.path.join(folder, "generation.png")
    fig.savefig(out + ".tmp.png", dpi=110)
    os.replace(out + ".tmp.png", out)
    print(out)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the results folder (made if absent)")
    ap.add_argument("--contexts", default="1024,2048,4096,8192")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--plot", metavar="FOLDER", help="plot FOLDER's models_hf.csv (matplotlib) and exit")
    args = ap.parse_args(argv)
    if args.plot:
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
    os.makedirs(args.out, exist_ok=True)
    rows = measure(args)
    write_atomic(os.path.join(args.out, "summary.md"), summary(rows))
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
