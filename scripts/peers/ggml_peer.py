"""ggml (llama.cpp's tensor library, as PyPI's ggml-python builds it from its bundled source):
ggml_flash_attn_ext on the CPU (ggml_fa), the kernel llama.cpp runs for attention with flash
attention on. K and V are stored in the cache type the lab's point stores them in, as llama.cpp
stores its cache (--cache-type-k/-v): F16 for a dtype f16 point, Q8_0 / Q4_0 for kv_dtype q8_0 /
q4_0, else F32. A quantized cache arrives as the lab's dequantized values and is written again by
ggml's own quantize_row_*_ref rule (the lab's writer follows it: the same blocks come back). Q is
float32; ggml converts it to K's dot-product type (F16 for an F16 cache, Q8_0 for Q8_0 and Q4_0)
and, for an F16 V, accumulates P.V in F16: its error is larger than float32 arithmetic's (the sweep
judges it with the peer tolerance that implies, src/bench/peers/peer_tolerance.cpp). Layouts: q (D, Sq, Hq), k and
v (D, Skv, Hkv) in ggml's ne order (the lab's bhsd for batch 1), GQA by ggml's head broadcast;
masks (causal, windows, sparse patterns) as ggml's additive F16 mask (Skv, Sq padded to
GGML_KQ_MASK_PAD), 0 or -inf, from the lab's rule. The graph is
planned once with its own work buffer; a call is one ggml_graph_compute."""
import ctypes
import weakref

import numpy as np

from catalogue import peers_of
from common import Skip, empty_rows

KERNELS = peers_of("ggml")  # the catalogue's rows of this family (catalogue.json)
ggml = None
_threads = 1


# The score modifications ggml_flash_attn_ext takes (serve.py skips the others): logit_softcap, and
# ALiBi through max_bias (the standard slopes).
SCORE_MODS = {"ggml_fa": {"softcap", "alibi"}}


def setup(threads):
    global ggml, _threads
    import ggml as _ggml
    from importlib.metadata import version
    ggml, _threads = _ggml, threads
    ggml.ggml_cpu_init()
    return f"ggml-python {version('ggml-python')}"


def _cache_type(p):
    kv = p.d.get("kv_dtype", "dtype")
    if kv == "q8_0":
        return ggml.GGML_TYPE_Q8_0, "Q8_0"
    if kv == "q4_0":
        return ggml.GGML_TYPE_Q4_0, "Q4_0"
    if kv not in ("dtype", "", None):
        raise Skip(f"kv_dtype {kv}: ggml's caches are f32, f16, q8_0, q4_0 (and types the lab does not store)")
    if p.dtype == "f16":
        return ggml.GGML_TYPE_F16, "F16"
    if p.dtype != "f32":
        raise Skip(f"dtype {p.dtype}: ggml_fa takes a float32 Q with an f32, f16 or quantized cache")
    return ggml.GGML_TYPE_F32, "F32"


def _fill(t, x, typ, n_per_row):
    """Tensor t's data from float32 x (C order): copied, rounded to f16, or quantized by ggml."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    dst = ggml.ggml_get_data(t)
    if typ == ggml.GGML_TYPE_F32:
        ctypes.memmove(dst, x.ctypes.data, x.nbytes)
    elif typ == ggml.GGML_TYPE_F16:
        h = x.astype(np.float16)
        ctypes.memmove(dst, h.ctypes.data, h.nbytes)
    else:
        rows = x.size // n_per_row
        ggml.ggml_quantize_chunk(typ, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), dst, 0, rows, n_per_row, None)


def prepare(kernel, p, q, k, v):
    if p.batch != 1:
        raise Skip("ggml_fa here runs batch 1 (llama.cpp batches sequences as rows of one cache; the lab's "
                   "batch > 1 points are per-sequence caches)")
    typ, tname = _cache_type(p)
    hq, hkv, sq, skv, d, dv = p.q_heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, p.head_dim_v
    pad = ggml.GGML_KQ_MASK_PAD
    sq_pad = (sq + pad - 1) // pad * pad
    kv_bytes = ggml.ggml_row_size(typ, d) * skv * hkv + ggml.ggml_row_size(typ, dv) * skv * hkv
    mem = (hq * sq * d + hq * sq * dv) * 4 + kv_bytes + skv * sq_pad * 2 + 8 * ggml.ggml_tensor_overhead() + \
        ggml.ggml_graph_overhead() + (1 << 20)
    params = ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False)
    ctx = ggml.ggml_init(params)
    qt = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, d, sq, hq, 1)
    kt = ggml.ggml_new_tensor_4d(ctx, typ, d, skv, hkv, 1)
    vt = ggml.ggml_new_tensor_4d(ctx, typ, dv, skv, hkv, 1)
    _fill(qt, q[0], ggml.GGML_TYPE_F32, d)  # (Hq, Sq, D): ne (D, Sq, Hq)
    _fill(kt, k[0], typ, d)
    _fill(vt, v[0], typ, dv)
    how = [f"K/V cache {tname}" + (" (re-quantized by ggml's ref rule from the lab's dequantized cache)"
                                   if tname.startswith("Q") else ""),
           "GQA by ggml's head broadcast" if p.gqa else "MHA"]
    mask = None
    max_bias = 0.0
    if p.alibi is not None:
        # ggml's ALiBi: its slopes from max_bias (m0^(h+1), then m1's odd powers: the standard set at
        # max_bias 8, for any head count) times the mask's value, which llama.cpp fills with the
        # distance j - pos(i) (F16: exact integers up to 2048).
        if not p.alibi_standard:
            raise Skip("alibi: ggml_fa takes the standard slopes only (max_bias 8), not a list of slopes")
        if skv > 2048:
            raise Skip(f"alibi with kv_len {skv}: ggml's F16 mask holds the distances j - pos exactly up to 2048")
        max_bias = 8.0
        how.append("ALiBi by max_bias 8 and the distances in the F16 mask")
    if p.softcap:
        how.append(f"logit_softcap {p.softcap:g}")
    keep = p.keep()[0, 0] if (p.masked or p.alibi is not None) else None  # (Sq, Skv)
    if keep is not None and (not keep.all() or p.alibi is not None):
        if empty_rows(keep[None, None]):
            raise Skip(f"{empty_rows(keep[None, None])} rows see no key: ggml's softmax over an all -inf row "
                       "is not the lab's O = 0")
        m = np.zeros((sq_pad, skv), np.float16)
        if p.alibi is not None:
            pos = np.arange(sq)[:, None] + (0 if p.causal == "top-left" else skv - sq)
            m[:sq] = (np.arange(skv)[None, :] - pos).astype(np.float16)
        m[:sq][~keep] = -np.inf
        mask = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F16, skv, sq_pad, 1, 1)
        ctypes.memmove(ggml.ggml_get_data(mask), m.ctypes.data, m.nbytes)
        how.append("additive F16 mask from the lab's rule")
    else:
        how.append("no mask")
    out = ggml.ggml_flash_attn_ext(ctx, qt, kt, vt, mask, p.scale, max_bias, p.softcap)
    gf = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(gf, out)
    plan = ggml.ggml_graph_plan(gf, _threads, None)
    work = (ctypes.c_uint8 * max(1, plan.work_size))()
    plan.work_data = ctypes.cast(work, ctypes.POINTER(ctypes.c_uint8))
    how.append(f"{_threads} threads, one ggml_graph_compute per call")

    def fn(_work=work):  # (the work buffer lives as long as fn)
        if ggml.ggml_graph_compute(gf, ctypes.byref(plan)) != 0:
            raise RuntimeError("ggml_graph_compute failed")

    def collect(_fn=fn):  # (O lives in the context: fn, and so the context, outlives this)
        o = np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(out), ctypes.POINTER(ctypes.c_float)),
                                  shape=(sq, hq, dv)).copy()  # ne (Dv, Hq, Sq): permuted
        return o.transpose(1, 0, 2)[None]

    # The context (inputs, cache, O) is freed when the server drops fn, also when timing was
    # skipped (the time cap) and collect never ran.
    weakref.finalize(fn, ggml.ggml_free, ctx)
    return fn, collect, "; ".join(how)
