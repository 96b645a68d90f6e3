"""What every peer runner shares: the request's problem, its dense mask, the timing loop.

A request's "problem" is the lab's point record problem (src/schema/point_schema.cpp
problem_to_json: one key per axis of the schema) plus "scale" (the effective float32 scale). Inputs arrive as
float32 .npy files in the problem's layout: (B, H, S, D) for bhsd, (B, S, H, D) for bshd; a
backward point ("pass" backward or forward_backward) adds do.npy (O's shape, same layout).
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from numpy_attention import alibi_slopes, pattern_mask  # noqa: E402  the lab's independent numpy model

# The causal axis's values (false, true, "top_left").
CAUSAL = {False: "none", True: "bottom-right", "top_left": "top-left"}


class Skip(Exception):
    """The peer cannot run this point as specified; the message says why (recorded as skipped)."""


class Problem:
    def __init__(self, d):
        self.d = d
        self.batch, self.q_heads, self.kv_heads = d["batch"], d["q_heads"], d["kv_heads"]
        self.q_len, self.kv_len, self.head_dim = d["q_len"], d["kv_len"], d["head_dim"]
        self.head_dim_v = d.get("head_dim_v") or self.head_dim
        self.causal = CAUSAL[d["causal"]]
        self.left, self.right = d.get("window") or (-1, -1)
        self.layout, self.dtype = d["layout"], d["dtype"]
        self.kv_lens = list(d.get("kv_lens") or [])
        self.scale = float(d["scale"])
        self.sinks, self.globals = d.get("sinks", 0), list(d.get("global") or [])
        self.doc_lens, self.dilation = list(d.get("doc_lens") or []), d.get("dilation", 1)
        # "forward", "backward" or "forward_backward"
        self.pass_ = d.get("pass", "forward")
        self.d_o = None  # a backward point's dO, (B, Hq, Sq, Dv) float32 (serve.py loads it)
        bb = d.get("bigbird")
        self.bigbird = tuple(bb) if bb and bb[0] > 0 else None
        # The score modifications (docs/operation.md): alibi true is the standard slope set.
        self.softcap = float(d.get("softcap") or 0.0)
        alibi = d.get("alibi", False)
        self.alibi = alibi_slopes(self.q_heads) if alibi is True else (list(alibi) if alibi else None)
        self.alibi_standard = alibi is True
        self.sink_logits = list(d["sink_logits"]) if d.get("sink_logits") is not None else None

    @property
    def score_mods(self):
        """The score modifications the point has: a subset of {"softcap", "alibi", "sink_logits"}."""
        return {name for name, on in (("softcap", self.softcap > 0), ("alibi", self.alibi is not None),
                                      ("sink_logits", self.sink_logits is not None)) if on}

    def alibi_bias(self):
        """ALiBi's bias slope_h (j - pos(i)), (B, Hq, Sq, Skv) float32; pos(i) the row's diagonal as the
        mask aligns it (numpy_attention's rule)."""
        out = np.empty((self.batch, self.q_heads, self.q_len, self.kv_len), np.float32)
        for b in range(self.batch):
            pos = np.arange(self.q_len)[:, None] + (0 if self.causal == "top-left" else self.kv_len_of(b) - self.q_len)
            out[b] = np.asarray(self.alibi, np.float64)[:, None, None] * (np.arange(self.kv_len)[None, :] - pos)
        return out

    @property
    def backward(self):
        return self.pass_ != "forward"

    @property
    def gqa(self):
        return self.q_heads != self.kv_heads

    @property
    def sparse(self):
        return bool(self.sinks or self.globals or self.doc_lens or self.dilation > 1 or self.bigbird)

    @property
    def windowed(self):
        return self.left >= 0 or self.right >= 0

    def kv_len_of(self, b):
        return self.kv_lens[b] if self.kv_lens else self.kv_len

    @property
    def causal_is_top_left(self):
        """Causal, and top-left is the same rule as the problem's (PyTorch's and JAX's is_causal)."""
        return self.causal == "top-left" or (self.causal == "bottom-right" and self.q_len == self.kv_len
                                             and not self.kv_lens)

    @property
    def masked(self):
        """Whether any key of any row is hidden (else no mask at all is needed)."""
        return self.causal != "none" or self.windowed or self.sparse or any(
            n != self.kv_len for n in self.kv_lens)

    def keep(self):
        """The dense mask, bool (B, 1, Sq, Skv): True = attend (numpy_attention.pattern_mask's rule;
        a point with a mask file is not handed to peers, src/bench/peers/peers.cpp)."""
        return np.stack([pattern_mask(self.q_len, self.kv_len, self.kv_len_of(b), self.causal, self.left,
                                      self.right, self.sinks, self.globals, self.doc_lens, self.dilation,
                                      self.bigbird)[None] for b in range(self.batch)])

    def mask_bytes(self):
        return self.batch * self.q_len * self.kv_len


def mask_choice(p):
    """How a peer whose causal flag is top-left (PyTorch's is_causal, JAX's, ORT's unidirectional
    at q_len = kv_len) expresses the problem's mask: ("none", None), ("causal", None), or
    ("mask", keep) with the dense mask from the lab's rule."""
    if not p.masked:
        return "none", None
    if p.causal_is_top_left and not p.windowed and not p.sparse:
        return "causal", None
    return "mask", p.keep()


def empty_rows(keep):
    """How many rows see no key (the lab's O = 0 there; a peer that gives NaN or a uniform average
    instead is skipped with this count rather than recorded as disagreeing)."""
    return int((~keep.any(axis=-1)).sum())


def load_inputs(folder, p):
    """Q, K, V as (B, H, S, D) float32 views (bshd files: transposed views, no copy)."""
    out = []
    for name in ("q", "k", "v"):
        a = np.load(os.path.join(folder, name + ".npy"))
        out.append(a.transpose(0, 2, 1, 3) if p.layout == "bshd" else a)
    return out


def load_do(folder, p):
    """dO as a (B, Hq, Sq, Dv) float32 view (a bshd file: a transposed view)."""
    a = np.load(os.path.join(folder, "do.npy"))
    return a.transpose(0, 2, 1, 3) if p.layout == "bshd" else a


def time_calls(fn, repetitions, min_time_s, time_cap_s):
    """Google Benchmark's scheme: a warm-up call, then `repetitions` runs of n calls each, n fixed
    after the first run so that one run lasts >= min_time_s. Returns (seconds per call for each
    repetition, n). Raises Skip when the warm-up call alone says the point exceeds the time cap."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn()  # a second call: the first may include compilation (jit) or allocation
    one = max(time.perf_counter() - t0, 1e-9)
    estimate = max(one * repetitions, min_time_s * repetitions)
    if estimate > time_cap_s:
        raise Skip(f"time cap: one call took {one:.3g} s (first {first:.3g} s), timing estimated "
                   f"{estimate:.0f} s > {time_cap_s:.0f} s")
    n = max(1, int(np.ceil(min_time_s / one)))
    times = []
    for _ in range(repetitions):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return times, n
