"""How far apart two equally valid float32 roundings of the same scores land, relative to the
tolerance baseline's realized error, at the huge scores of Extreme.HugeScoresStayFiniteAndCorrect
(4/2 heads, 9 query rows against 70 keys, d 32, q and k ~U(-20, 20), scale 1, bottom-right causal).

Per seed: the worst O error (relative to the row scale, verify.hpp) of three float32 score
computations against float64 - the textbook's plain products and sums (the baseline), fused
multiply-adds (nvcc's default contraction: cuda_naive on the H200), and the plain sum in another
order (even then odd d) - and the ratio of each to the textbook's. A ratio above 4 fails a kernel
whose only difference is that rounding. Scores only (the softmax and P.V in float64): they are
what exp() amplifies. docs/cuda.md quotes its output (0.3-21.6x over seeds 0-11).

Usage: /usr/bin/python3 tools/scripts/fma_rounding.py [SEEDS]   (needs numpy; default 12 seeds)
"""

import sys

import numpy as np

f32 = np.float32


def worst_errors(seed):
    r = np.random.default_rng(seed)
    heads, kv_heads, q_len, kv_len, d = 4, 2, 9, 70, 32
    q = (r.uniform(-1, 1, (heads, q_len, d)) * 20).astype(f32)
    k = (r.uniform(-1, 1, (kv_heads, kv_len, d)) * 20).astype(f32)
    v = r.uniform(-1, 1, (kv_heads, kv_len, d)).astype(f32)
    worst = [0.0, 0.0, 0.0]
    for h in range(heads):
        hk = h // (heads // kv_heads)
        for i in range(q_len):
            hi = kv_len - q_len + i + 1  # bottom-right causal
            keys, vals = k[hk, :hi], v[hk, :hi].astype(np.float64)
            s64 = keys.astype(np.float64) @ q[h, i].astype(np.float64)
            p = np.exp(s64 - s64.max())
            p /= p.sum()
            o64 = p @ vals
            scale = (p * np.abs(vals).max(1)).sum()
            for mode in range(3):
                s = np.zeros(hi, f32)
                order = list(range(d)) if mode < 2 else list(range(0, d, 2)) + list(range(1, d, 2))
                for j in range(hi):
                    dot = f32(0)
                    for x in order:
                        if mode == 1:  # one rounding of q*k + dot (float64 holds the product exactly)
                            dot = f32(np.float64(q[h, i, x]) * np.float64(keys[j, x]) + np.float64(dot))
                        else:
                            dot = f32(dot + f32(q[h, i, x] * keys[j, x]))
                    s[j] = dot
                ps = np.exp(s.astype(np.float64) - s.max())
                ps /= ps.sum()
                worst[mode] = max(worst[mode], np.abs(ps @ vals - o64).max() / scale)
    return worst


def main():
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    print("seed  textbook   fma        reordered  fma/textbook  reordered/textbook")
    for seed in range(seeds):
        t, f, o = worst_errors(seed)
        print(f"{seed:4d}  {t:.2e}   {f:.2e}   {o:.2e}   {f / t:10.2f}    {o / t:10.2f}")


if __name__ == "__main__":
    main()
