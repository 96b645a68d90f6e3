#!/usr/bin/env python3
"""Independent attention outputs made with numpy, for `attnlab verify --expect`.

Writes q.npy, k.npy, v.npy (float32) and o.npy, lse.npy computed in float64 with an
explicit dense boolean mask built the way PyTorch users build it (index comparisons with
np.arange broadcasting, causal aligned as torch's causal_lower_right / causal_upper_left),
GQA by repeat_interleave, per-batch kv lengths as a padding mask. None of the lab's C++
code is used, so agreement checks the semantics, not just the arithmetic.

  /usr/bin/python3 scripts/numpy_attention.py OUT --batch 2 --q-heads 6 --kv-heads 2 \
      --q-len 5 --kv-len 9 --head-dim 16 --causal --kv-lens 9,4
  attnlab verify --q OUT/q.npy --k OUT/k.npy --v OUT/v.npy --expect OUT/o.npy \
      --expect-lse OUT/lse.npy --causal --kv-lens 9,4

Sparse patterns take the same flags as `attnlab verify` (--sinks, --global, --doc-lens,
--dilation, --bigbird; --mask reads a boolean mask file). The rule, with Lk_b the kv length
of batch b and pos(i) = i + off (off = 0 for top-left causal, else Lk_b - q_len): row i sees
key j when ALL of
  j < Lk_b;  causal: j <= pos(i);  documents: doc(i) == doc(j);  mask file: mask[b, h, i, j]
and, only when a window or a dilation > 1 is given, ANY of
  window: dist = pos(i) - j within (left, right) (-1 = unbounded) and dist % dilation == 0;
  sink: j < sinks;  global column: j in globals;  global row: pos(i) in globals;
  BigBird: key block j // B is one of the R blocks drawn (splitmix64) for query block pos // B.
A row that sees no key has O = 0, LSE = -inf. --mask-out writes the dense mask used, as a
bool (batch, 1, q_len, kv_len) .npy, so the pattern can be checked against itself as a file:

  /usr/bin/python3 scripts/numpy_attention.py OUT --q-len 127 --kv-len 127 --causal \
      --window 16,0 --sinks 4 --global 0,64 --mask-out OUT/mask.npy
  attnlab verify --q OUT/q.npy --k OUT/k.npy --v OUT/v.npy --expect OUT/o.npy \
      --expect-lse OUT/lse.npy --causal --window 16,0 --sinks 4 --global 0,64
  attnlab verify --q OUT/q.npy --k OUT/k.npy --v OUT/v.npy --expect OUT/o.npy \
      --expect-lse OUT/lse.npy --mask OUT/mask.npy
"""
import argparse
import os

import numpy as np

_M64 = 2**64 - 1


def _mix64(x):
    """splitmix64's finalizer on a Python int (exact 64-bit wraparound)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def bigbird_picks(seed, random, qb, key_blocks):
    """The key blocks BigBird's query block qb attends to: min(random, key_blocks) distinct draws."""
    base = _mix64((seed + qb) & _M64)
    out = []
    for r in range(min(random, key_blocks)):
        kb = _mix64((base + r) & _M64) % key_blocks
        while kb in out:
            kb = (kb + 1) % key_blocks
        out.append(kb)
    return out


def pattern_mask(lq, lk, lk_b, causal, left, right, sinks=0, globals_=(), doc_lens=(), dilation=1,
                 bigbird=None):
    """keep[i, j] (lq x lk bool) for one batch entry whose first lk_b keys are valid.

    causal: "none", "bottom-right" or "top-left"; left/right: window bounds (-1 = unbounded);
    globals_: global positions; doc_lens: packed document lengths (sum = lq = lk);
    bigbird: (block, random, seed) or None. The mask-file term is applied by the caller.
    """
    i = np.arange(lq)[:, None]
    j = np.arange(lk)[None, :]
    off = 0 if causal == "top-left" else lk_b - lq
    pos = i + off                                        # (lq, 1): the row's key-axis position
    keep = np.broadcast_to(j < lk_b, (lq, lk)).copy()    # ALL of ...
    if causal != "none":
        keep &= j <= pos
    if len(doc_lens):
        bounds = np.cumsum(doc_lens)
        assert bounds[-1] == lq == lk, "doc_lens must sum to q_len == kv_len"
        doc_q = np.searchsorted(bounds, np.arange(lq), side="right")
        doc_k = np.searchsorted(bounds, np.arange(lk), side="right")
        keep &= doc_q[:, None] == doc_k[None, :]
    if not (left >= 0 or right >= 0 or dilation > 1):
        return keep                                      # no window, no dilation: ANY is True
    dist = pos - j                                       # ... and ANY of
    any_ = np.ones((lq, lk), dtype=bool)
    if left >= 0:
        any_ &= dist <= left
    if right >= 0:
        any_ &= -dist <= right
    any_ &= dist % dilation == 0
    any_ |= j < sinks
    if len(globals_):
        g = np.asarray(list(globals_), dtype=np.int64)
        any_ |= np.isin(j, g)
        any_ |= (pos >= 0) & (pos < lk) & np.isin(pos, g)
    if bigbird is not None:
        blk, rnd, seed = bigbird
        key_blocks = -(-lk // blk)
        n_qb = max(int(pos.max()), 0) // blk + 1
        table = np.zeros((n_qb, key_blocks), dtype=bool)  # table[qb, kb]: kb picked for qb
        for qb in range(n_qb):
            table[qb, bigbird_picks(seed, rnd, qb, key_blocks)] = True
        qb_row = np.clip(pos[:, 0], 0, None) // blk
        any_ |= (pos >= 0) & table[qb_row][:, np.arange(lk) // blk]
    return keep & any_


def dense_mask(lq, lk, lk_b, causal, left, right):
    """keep[i, j] for one batch entry (lk columns, the first lk_b valid): no sparse terms."""
    return pattern_mask(lq, lk, lk_b, causal, left, right)


def alibi_slopes(heads):
    """ALiBi's standard slopes (Press et al.; BLOOM's _get_alibi_slopes): 2^(-8k/p), k = 1..p, for p the
    largest power of two <= heads, then the odd powers 2^(-4k/p), k = 1, 3, 5, ... for the rest."""
    p = 2 ** int(np.floor(np.log2(heads)))
    return [2.0 ** (-8.0 * k / p) for k in range(1, p + 1)] + [2.0 ** (-4.0 * k / p)
                                                                for k in range(1, 2 * (heads - p), 2)]


def attention(q, k, v, scale, causal, left, right, kv_lens, sinks=0, globals_=(), doc_lens=(),
              dilation=1, bigbird=None, mask=None, softcap=0.0, alibi=None, sink_logits=None):
    """q (B, Hq, Lq, D), k/v (B, Hkv, Lk, D) float64 -> o (B, Hq, Lq, D), lse (B, Hq, Lq), keep.

    mask: optional bool mask file, (Lq, Lk) or (B|1, Hq|1, Lq, Lk). keep: (B, Hq|1, Lq, Lk),
    the dense mask used. The score modifications, written as the models' eager code writes them:
    softcap c > 0: s = c tanh(s / c); alibi (one slope per query head): s += slope (j - pos(i));
    sink_logits (one per query head): a column appended to the scores before the softmax and dropped
    after it (gpt-oss), so a row that sees no key has O = 0 and LSE = its sink logit.
    """
    b_n, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    k = np.repeat(k, hq // hkv, axis=1)       # repeat_interleave: head h uses kv head h // G
    v = np.repeat(v, hq // hkv, axis=1)
    s = scale * np.einsum("bhid,bhjd->bhij", q, k)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    o = np.zeros(q.shape[:3] + v.shape[3:], dtype=q.dtype)
    lse = np.full((b_n, hq, lq), -np.inf)
    if mask is not None:
        mask = np.asarray(mask) != 0
        if mask.ndim == 2:
            mask = mask[None, None]
        assert mask.shape[2:] == (lq, lk) and mask.shape[0] in (1, b_n) and mask.shape[1] in (1, hq), mask.shape
    keeps = []
    for b in range(b_n):
        keep = pattern_mask(lq, lk, kv_lens[b], causal, left, right, sinks, globals_, doc_lens,
                            dilation, bigbird)[None]             # (1, Lq, Lk)
        if mask is not None:
            keep = keep & mask[b if mask.shape[0] > 1 else 0]  # (1|Hq, Lq, Lk)
        keeps.append(keep)
        sb = s[b]
        if alibi is not None:
            pos = np.arange(lq)[:, None] + (0 if causal == "top-left" else kv_lens[b] - lq)
            sb = sb + np.asarray(alibi, dtype=np.float64)[:, None, None] * (np.arange(lk)[None, :] - pos)
        sb = np.where(keep, sb, -np.inf)
        if sink_logits is not None:
            sink = np.broadcast_to(np.asarray(sink_logits, dtype=np.float64)[:, None, None], (hq, lq, 1))
            sb = np.concatenate([sb, sink], axis=-1)
        m = sb.max(axis=-1, keepdims=True)
        live = np.isfinite(m)                 # rows with at least one visible key (or a sink logit)
        e = np.exp(sb - np.where(live, m, 0.0))
        l = e.sum(axis=-1, keepdims=True)
        p = np.where(keep, e[..., :lk], 0.0)
        o[b] = np.where(live, (p @ v[b]) / np.where(live, l, 1.0), 0.0)
        lse[b] = np.where(live[..., 0], (m + np.log(np.where(live, l, 1.0)))[..., 0], -np.inf)
    heads = max(x.shape[0] for x in keeps)
    keep_all = np.stack([np.broadcast_to(x, (heads, lq, lk)) for x in keeps])
    return o, lse, keep_all


def attention_backward(q, k, v, do, scale, causal, left, right, kv_lens, sinks=0, globals_=(), doc_lens=(),
                       dilation=1, bigbird=None, mask=None):
    """The gradients of attention() (docs/operation.md, include/attnlab/backward.hpp), float64:
    dO (B, Hq, Lq, Dv) -> o, dq, dk, dv; a kv head's dK and dV sum over its query heads, masked
    pairs and fully masked rows contribute nothing."""
    o, lse, keep = attention(q, k, v, scale, causal, left, right, kv_lens, sinks, globals_, doc_lens, dilation,
                             bigbird, mask)
    b_n, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    g = hq // hkv
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = scale * np.einsum("bhid,bhjd->bhij", q, kr)
    live = np.isfinite(lse)[..., None]
    p = np.where(keep & live, np.exp(np.where(keep & live, s - np.where(live, lse[..., None], 0.0), -np.inf)), 0.0)
    dp = np.einsum("bhid,bhjd->bhij", do, vr)
    ds = p * (dp - (do * o).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bhij,bhjd->bhid", ds, kr)
    dk = scale * np.einsum("bhij,bhid->bhjd", ds, q).reshape(b_n, hkv, g, lk, -1).sum(axis=2)
    dv = np.einsum("bhij,bhid->bhjd", p, do).reshape(b_n, hkv, g, lk, -1).sum(axis=2)
    return o, dq, dk, dv


def _ints(text):
    return [int(x) for x in text.split(",")] if text else []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    for name, default in [("batch", 1), ("q-heads", 4), ("kv-heads", 2), ("q-len", 7),
                          ("kv-len", 11), ("head-dim", 16), ("seed", 0)]:
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--head-dim-v", type=int, default=0, help="head dim of V and O (default: --head-dim)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--causal-top-left", action="store_true")
    ap.add_argument("--window", default="-1,-1")
    ap.add_argument("--kv-lens", default="")
    ap.add_argument("--scale", type=float, default=None)
    ap.add_argument("--layout", choices=["bhsd", "bshd"], default="bhsd")
    ap.add_argument("--expect-dtype", choices=["float32", "float64"], default="float64")
    ap.add_argument("--sinks", type=int, default=0, help="sparse: keys j < N seen by every row (with --window)")
    ap.add_argument("--global", dest="globals_", default="", help="sparse: global positions i,j,...")
    ap.add_argument("--doc-lens", default="", help="sparse: packed document lengths a,b,... (sum = q_len = kv_len)")
    ap.add_argument("--dilation", type=int, default=1, help="sparse: window keys at multiples of D from the diagonal")
    ap.add_argument("--bigbird", default="", help="sparse: BLOCK,RANDOM,SEED random key blocks per query block")
    ap.add_argument("--mask", default="", help="sparse: boolean mask .npy, (q_len, kv_len) or (batch|1, q_heads|1, q_len, kv_len)")
    ap.add_argument("--mask-out", default="", help="also write the dense mask used, bool (batch, 1, q_len, kv_len)")
    ap.add_argument("--softcap", type=float, default=0.0, help="score modification: s -> c tanh(s / c)")
    ap.add_argument("--alibi", action="store_true", help="score modification: ALiBi, the standard slopes")
    ap.add_argument("--sink-logits", default="", help="score modification: one sink logit, or one per query head")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    shape_q = (a.batch, a.q_heads, a.q_len, a.head_dim)
    shape_kv = (a.batch, a.kv_heads, a.kv_len, a.head_dim)
    shape_v = (a.batch, a.kv_heads, a.kv_len, a.head_dim_v or a.head_dim)
    q = rng.uniform(-1, 1, shape_q).astype(np.float32)
    k = rng.uniform(-1, 1, shape_kv).astype(np.float32)
    v = rng.uniform(-1, 1, shape_v).astype(np.float32)
    causal = "top-left" if a.causal_top_left else ("bottom-right" if a.causal else "none")
    left, right = (int(x) for x in a.window.split(","))
    kv_lens = _ints(a.kv_lens) or [a.kv_len] * a.batch
    scale = a.scale if a.scale is not None else 1.0 / np.sqrt(a.head_dim)
    scale = float(np.float32(scale))          # the lab's scale is a float32
    bigbird = tuple(_ints(a.bigbird)) if a.bigbird else None
    if bigbird is not None and (len(bigbird) != 3 or bigbird[0] < 1):
        ap.error("--bigbird takes BLOCK,RANDOM,SEED with BLOCK >= 1")
    if a.dilation < 1:
        ap.error("--dilation must be >= 1")
    mask = np.load(a.mask) if a.mask else None
    if mask is not None and a.mask_out and mask.ndim == 4 and mask.shape[1] > 1:
        ap.error("--mask-out writes one head: it cannot hold a per-head --mask")
    sink_logits = [float(x) for x in a.sink_logits.split(",")] if a.sink_logits else None
    if sink_logits is not None and len(sink_logits) == 1:
        sink_logits = sink_logits * a.q_heads
    # (the lab's slopes and logits are float32 values)
    alibi = [float(np.float32(x)) for x in alibi_slopes(a.q_heads)] if a.alibi else None
    sink_logits = [float(np.float32(x)) for x in sink_logits] if sink_logits else None
    o, lse, keep = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                             scale, causal, left, right, kv_lens, a.sinks, _ints(a.globals_),
                             _ints(a.doc_lens), a.dilation, bigbird, mask, softcap=float(np.float32(a.softcap)),
                             alibi=alibi, sink_logits=sink_logits)
    to_layout = (lambda x: x) if a.layout == "bhsd" else (lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3)))
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "q.npy"), to_layout(q))
    np.save(os.path.join(a.out, "k.npy"), to_layout(k))
    np.save(os.path.join(a.out, "v.npy"), to_layout(v))
    np.save(os.path.join(a.out, "o.npy"), to_layout(o).astype(a.expect_dtype))
    np.save(os.path.join(a.out, "lse.npy"), lse.astype(a.expect_dtype))
    if a.mask_out:
        out_dir = os.path.dirname(os.path.abspath(a.mask_out))
        os.makedirs(out_dir, exist_ok=True)
        np.save(a.mask_out, np.ascontiguousarray(keep[:, :1]).astype(bool))


if __name__ == "__main__":
    main()
