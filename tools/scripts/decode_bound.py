#!/usr/bin/env python3
"""What bounds decode for each KV-cache type: the same decode (one token, 32 query / 8 kv heads,
d 128) with the cache small enough for the last-level cache and large enough to come from DRAM,
types interleaved, ROUNDS rounds. Per-key time in cache is what the arithmetic costs with memory
out of the way; the ratio DRAM / cache says which limit holds (results/2026-12-03-decode-bound).

    tools/scripts/decode_bound.py [--ab build/attn_ab_switch] [--rounds 2] [--threads 2]
        [--types f32,bf16,...] [--cached 4096] [--dram 32768] [--pairs 16,6] [--raw FILE]
    tools/scripts/decode_bound.py --from FILE        (the summary of recorded raw lines)

Each measurement is one `attn_ab_switch decode --kv-len N --pairs P --threads T` (--dtype / --kv-dtype
select the cache; with no A/B switch compiled in, both variants are the same code, so its two
medians are two samples). f32 runs at half the cached length (its bytes are twice bf16's). Raw
lines: `round cache keys median_a_ms median_b_ms` (--raw writes them; --from reads them back).
"""
import argparse
import collections
import os
import re
import statistics
import subprocess
import sys

TYPES = ("f32", "bf16", "f16", "fp8_e5m2", "u8", "q8_0", "u4", "q4_0")
DTYPES = ("f32", "bf16", "f16")  # Q's storage too (--dtype); the others are cache types (--kv-dtype)
LINE = re.compile(r"before +([0-9.]+) ms, after +([0-9.]+) ms")


def measure(ab, kv, keys, pairs, threads):
    cmd = [ab, "decode", "--kv-len", str(keys), "--pairs", str(pairs), "--threads", str(threads),
           "--dtype" if kv in DTYPES else "--kv-dtype", kv]
    run = subprocess.run(cmd, capture_output=True, text=True)
    m = LINE.search(run.stdout + run.stderr)
    if run.returncode != 0 or not m:
        sys.exit(f"decode_bound: {' '.join(cmd)} (cache {kv}) gave no timing (exit {run.returncode}): "
                 f"{(run.stdout + run.stderr).strip()[-300:]}")
    return float(m.group(1)), float(m.group(2))


def summary(raw):
    """Markdown table from raw (round, cache, keys, a_ms, b_ms) tuples."""
    times = collections.defaultdict(list)  # (cache, keys) -> [ms per round]
    for _, kv, keys, a, b in raw:
        times[(kv, keys)].append((a + b) / 2)
    lengths = collections.defaultdict(list)
    for kv, keys in times:
        lengths[kv].append(keys)
    if "f32" not in lengths or len(lengths["f32"]) != 2:
        sys.exit("decode_bound: the summary needs f32 at two lengths (its ratios are against f32's)")
    f32_dram = statistics.mean(times[("f32", max(lengths["f32"]))])
    out = ["| cache | in cache: us per 1k keys (per round) | from DRAM: us per 1k keys | DRAM ms | DRAM at the "
           "in-cache rate | f32 / this (measured) | f32 / this at the in-cache rate |",
           "|---|---|---|---|---|---|---|"]
    for kv in [t for t in TYPES if t in lengths] + sorted(set(lengths) - set(TYPES)):
        if len(lengths[kv]) != 2:
            sys.exit(f"decode_bound: cache {kv} measured at {sorted(lengths[kv])} keys; want two lengths")
        small, large = sorted(lengths[kv])
        per_k = [x / small * 1024 for x in times[(kv, small)]]
        per_k_dram = [x / large * 1024 for x in times[(kv, large)]]
        dram_ms = statistics.mean(times[(kv, large)])
        at_cache_rate = statistics.mean(per_k) * large / 1024
        ratio = "-" if kv == "f32" else f"{f32_dram / dram_ms:.2f}x"
        ratio_cache = "-" if kv == "f32" else f"{f32_dram / at_cache_rate:.2f}x"
        out.append(f"| {kv} | {' / '.join(f'{x * 1e3:.0f}' for x in per_k)} | "
                   f"{' / '.join(f'{x * 1e3:.0f}' for x in per_k_dram)} | {dram_ms:.2f} | {at_cache_rate:.2f} | "
                   f"{ratio} | {ratio_cache} |")
    return "\n".join(out)


def read_raw(path):
    raw = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 5:
                sys.exit(f"decode_bound: {path}:{n}: want 'round cache keys a_ms b_ms', got {line.strip()!r}")
            raw.append((int(parts[0]), parts[1], int(parts[2]), float(parts[3]), float(parts[4])))
    return raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ab", default="build/attn_ab_switch")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--cached", type=int, default=4096, help="keys of the cached run (f32: half)")
    ap.add_argument("--dram", type=int, default=32768, help="keys of the run from DRAM")
    ap.add_argument("--pairs", default="16,6", help="pairs of calls: cached,dram")
    ap.add_argument("--raw", help="write the raw lines here")
    ap.add_argument("--from", dest="source", help="summarize recorded raw lines instead of measuring")
    a = ap.parse_args()
    if a.source:
        print(summary(read_raw(a.source)))
        return 0
    types = [t for t in a.types.split(",") if t]
    bad = [t for t in types if t not in TYPES]
    if bad or "f32" not in types:
        sys.exit(f"decode_bound: --types {a.types!r}: allowed: {', '.join(TYPES)} (f32 among them)")
    pairs = [int(x) for x in a.pairs.split(",")]
    if len(pairs) != 2 or min(pairs) < 1 or a.rounds < 1 or a.cached < 2 or a.dram <= a.cached:
        sys.exit("decode_bound: want --rounds >= 1, --pairs C,D >= 1, 2 <= --cached < --dram")
    raw = []
    for r in range(1, a.rounds + 1):
        for kv in types:
            for keys, p in ((a.cached // 2 if kv == "f32" else a.cached, pairs[0]), (a.dram, pairs[1])):
                ta, tb = measure(a.ab, kv, keys, p, a.threads)
                raw.append((r, kv, keys, ta, tb))
                print(r, kv, keys, f"{ta:.2f}", f"{tb:.2f}", flush=True)
    if a.raw:
        with open(a.raw + ".tmp", "w") as f:
            f.writelines(f"{r} {kv} {keys} {ta:.2f} {tb:.2f}\n" for r, kv, keys, ta, tb in raw)
        os.replace(a.raw + ".tmp", a.raw)
    print(summary(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
