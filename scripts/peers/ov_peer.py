"""OpenVINO's CPU plugin, two ways:

ov_sdpa: its fused ScaledDotProductAttention, a one-op model (opset13
scaled_dot_product_attention) compiled for the CPU device with the sweep's thread
count. GQA by K/V unsqueezed, broadcast over the group and reshaped to Hq heads inside the
model (the pattern the CPU plugin fuses into its SDPA node, so K/V are not copied per head);
causal by the op's flag where its top-left rule is the problem's, else a boolean mask (B, 1,
Sq, Skv) from the lab's rule. A float32 point runs with INFERENCE_PRECISION_HINT f32 (the CPU
plugin would otherwise compute in bf16 where the CPU has it), a bf16 point (the stored values,
exact in bf16) with the hint bf16 - its bf16 mode, where the CPU has AVX512_BF16 or AMX; elsewhere
the plugin keeps f32, and "how" says which precision the compiled model reports. The inputs are
set once on an infer request: a call is the compiled op alone.

ov_decode: its generation path - a stateful model whose KV cache is the model's state
(ReadValue -> Gather(beam_idx) -> Concat with the new token's K/V -> SDPA, the Concat also
Assigned back), the pattern an exported LLM has and the CPU plugin fuses into its
ScaledDotProductAttentionWithKVCache node, which keeps the cache in KV_CACHE_PRECISION (f32 for
a float32 point, f16 for a dtype f16 point, u8 - its x86 default, a scale and zero point per
token and head - for a kv_dtype u8 point, u4 for a u4 one). Decode points only (q_len 1): the
state holds the first kv_len - 1 keys, a call appends the last one and attends. Each timed call appends one
more token (the plugin's own append, as in generation), so the calls run over kv_len ..
kv_len + calls keys; O is taken from a call on the exact cache (the state set again).

ov_sage: its SageAttention path - the CPU plugin's PagedAttention node (the op OpenVINO GenAI's
continuous batching runs, built here directly: 28 inputs, the K/V head counts as runtime info)
compiled with ENABLE_SAGE_ATTN, where the plugin rounds Q and the new keys to int8 per token
(an int8 key cache with a scale per token and head), takes Q.K^T as int8 products on AMX-INT8 or
AVX-VNNI-INT8, and keeps V in its u8 cache; the bf16 precision hint (its fastest: P.V in bf16)
where the CPU has AVX512_BF16 or AMX. Prefill only, as the plugin's sage path is: a point is one
prompt per batch entry (q_len = kv_len, bottom-right causal - PagedAttention is causal), and a
call writes the prompt's K/V into a fresh paged cache (rounding them) and attends, as a prefill
step does."""
import numpy as np

from catalogue import peers_of
from common import Skip, empty_rows, mask_choice

KERNELS = peers_of("ov")  # the catalogue's rows of this family (catalogue.json)
ov = ops = None
_threads = 1


def setup(threads):
    global ov, ops, _threads
    import openvino as _ov
    import openvino.opset13 as _ops
    ov, ops, _threads = _ov, _ops, threads
    return f"openvino {ov.__version__}"


def _config(extra=None):
    config = {"INFERENCE_NUM_THREADS": _threads, "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
              "PERFORMANCE_HINT": "LATENCY"}
    config.update(extra or {})
    return config


def _compile(model, config):
    try:
        return ov.Core().compile_model(model, "CPU", config)
    except Exception as e:  # the plugin refuses the configuration: unsupported, not wrong
        raise Skip("openvino refused the model: " + str(e).splitlines()[0][:300])


def _group_heads(p, x, kv_len, dim):
    """K or V (B, Hkv, S, dim) as Hq heads: unsqueeze, broadcast over the group, reshape - the
    pattern the CPU plugin folds into its SDPA (kv_len -1: a cache of any length)."""
    g = p.q_heads // p.kv_heads
    x5 = ops.unsqueeze(x, np.int64(2))  # (B, Hkv, 1, S, D)
    if kv_len < 0:
        wide = ops.broadcast(x5, np.array([1, 1, g, 1, 1], np.int64), broadcast_spec="bidirectional")
    else:
        wide = ops.broadcast(x5, np.array([p.batch, p.kv_heads, g, kv_len, dim], np.int64))
    return ops.reshape(wide, np.array([p.batch, p.q_heads, kv_len, dim], np.int64), False)


# The cache precision ov_decode keeps for a point (the lab's dtype, kv_dtype): the stored values
# exactly for f32 and f16; u8 and u4 re-quantize the lab's u8 / u4 cache (the same per-row rule).
CACHE_PRECISION = {("f32", "dtype"): "f32", ("f16", "dtype"): "f16", ("f32", "u8"): "u8", ("f32", "u4"): "u4"}
# A u4 cache cannot be set as a state: openvino 2026.4's CPU plugin corrupts its heap on
# set_state into a u4 cache at any length (a segfault or glibc's malloc abort). It is filled by
# the plugin's own append instead, FILL_CHUNK tokens a call - each call also attends its chunk's
# rows to everything before, so filling costs ~kv_len^2 / 2 query-key pairs (15 s at 8192 keys on
# 2 cores, 4 min at 32768): u4 runs up to FILL_MAX_KEYS.
FILL_CHUNK, FILL_MAX_KEYS = 512, 8192


def prepare_decode(p, q, k, v):
    kv = p.d.get("kv_dtype", "dtype") or "dtype"
    precision = CACHE_PRECISION.get((p.dtype, kv))
    if precision is None:
        raise Skip(f"dtype {p.dtype}, kv_dtype {kv}: ov_decode keeps an f32, f16 or u8 cache "
                   "(float32 points, dtype f16, kv_dtype u8)")
    if p.q_len != 1:
        raise Skip("ov_decode runs decode points (q_len 1: the new token against its cache; ov_sdpa runs the rest)")
    if p.windowed or p.sparse or p.kv_lens:
        raise Skip("ov_decode attends to the whole cache (one length for the batch: no window, pattern or kv_lens)")
    if p.causal == "top-left" and p.kv_len > 1:
        raise Skip("top-left causal with q_len 1 sees one key; a decode query is the last position")
    append = precision == "u4"  # the cache filled by the plugin's append (above), not set
    if append and p.kv_len > FILL_MAX_KEYS:
        raise Skip(f"kv_len {p.kv_len}: ov_decode's u4 cache is filled through the plugin's own append (setting "
                   f"a u4 state crashes openvino's CPU plugin), ~kv_len^2 work: up to {FILL_MAX_KEYS} keys")
    how = [f"stateful model, its KV cache the model's state, fused by the CPU plugin into "
           f"ScaledDotProductAttentionWithKVCache; KV_CACHE_PRECISION {precision}"]
    if append:
        how.append(f"cache filled by the plugin's append ({FILL_CHUNK} tokens a call: a u4 state cannot be set)")
    f32, n, new = ov.Type.f32, p.kv_len, -1 if append else 1
    qn = ops.parameter([p.batch, p.q_heads, new, p.head_dim], f32, name="q")
    beam = ops.parameter([p.batch], ov.Type.i32, name="beam_idx")
    params, variables, sinks, present = [qn], [], [], []
    for name, dim in (("k", p.head_dim), ("v", p.head_dim_v)):
        cur = ops.parameter([p.batch, p.kv_heads, new, dim], f32, name=name)
        info = ov.op.util.VariableInfo()
        info.data_shape = ov.PartialShape([p.batch, p.kv_heads, -1, dim])
        info.data_type, info.variable_id = f32, "past_" + name
        var = ov.op.util.Variable(info)
        empty = ops.broadcast(ops.constant(np.float32(0)), np.array([p.batch, p.kv_heads, 0, dim], np.int64))
        past = ops.gather(ops.read_value(empty, var), beam, np.int64(0))
        cat = ops.concat([past, cur], 2)
        params.append(cur), variables.append(var), sinks.append(ops.assign(cat, var))
        present.append(_group_heads(p, cat, -1, dim) if p.gqa else cat)
    params.append(beam)
    # The fused node takes no scale input without a mask: it scales by 1/sqrt(D), so another
    # scale is folded into Q (one more float32 rounding of Q).
    default = float(np.float32(1 / np.sqrt(p.head_dim)))
    q_in = q if p.scale == default else q * np.float32(p.scale / default)
    if p.scale != default:
        how.append("scale folded into Q")
    node = ops.scaled_dot_product_attention(qn, present[0], present[1], causal=False)
    model = ov.Model([node.output(0)], sinks, params, variables, "decode")
    compiled = _compile(model, _config({"KV_CACHE_PRECISION": precision}))
    layers = {op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()}
    if "Concatenation" in layers or "ScaledDotProductAttention" not in layers:
        raise Skip("the CPU plugin did not fuse the cache into its SDPA node (layers: " + ", ".join(sorted(layers)) +
                   "): not its generation path")
    req = compiled.create_infer_request()
    feeds = {"q": q_in, "k": k[:, :, n - 1:], "v": v[:, :, n - 1:], "beam_idx": np.arange(p.batch, dtype=np.int32)}
    past = {"past_k": k[:, :, :n - 1], "past_v": v[:, :, :n - 1]}

    def feed(name, arr):
        req.set_tensor(name, ov.Tensor(np.ascontiguousarray(arr, dtype=arr.dtype)))

    def set_cache():
        for state in req.query_state():
            if n > 1 and not append:
                state.state = ov.Tensor(np.ascontiguousarray(past[state.name], dtype=np.float32))
            else:
                state.reset()
        feed("beam_idx", feeds["beam_idx"])
        for t0 in range(0, n - 1 if append else 0, FILL_CHUNK):
            t1 = min(n - 1, t0 + FILL_CHUNK)
            feed("q", np.zeros((p.batch, p.q_heads, t1 - t0, p.head_dim), np.float32))
            feed("k", k[:, :, t0:t1]), feed("v", v[:, :, t0:t1])
            req.infer()
        for name, arr in feeds.items():
            feed(name, arr)

    set_cache()
    how.append(f"CPU plugin, {_threads} inference threads; each timed call appends a token (kv_len .. "
               "kv_len + calls keys); O from a call on the exact cache")

    def collect():
        set_cache()
        req.infer()
        return np.array(req.get_output_tensor(0).data, dtype=np.float32)

    return req.infer, collect, "; ".join(how)


SAGE_BLOCK = 32  # tokens per cache block (the plugin's x86 block size)


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def sage_rounded(q, k, v):
    """Q and K rounded to int8 per (token, head) (amax / 127), V to u8 with a scale and zero point
    per (token, head): what the sage path multiplies, as floats (float64 arrays of the same
    shapes; the tests' model of the plugin, and the rule peer_tolerance.cpp derives ov_sage's tolerance from)."""
    def int8(x):
        scale = np.abs(x).max(-1, keepdims=True) / 127
        return np.round(x / np.where(scale > 0, scale, 1)) * scale

    def u8(x):
        lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
        scale = np.where(hi > lo, (hi - lo) / 255, 1)
        return np.clip(np.round((x - lo) / scale), 0, 255) * scale + lo
    return int8(q.astype(np.float64)), int8(k.astype(np.float64)), u8(v.astype(np.float64))


def prepare_sage(p, q, k, v):
    if p.dtype != "f32":
        raise Skip(f"dtype {p.dtype}: ov_sage runs float32 points (the plugin rounds Q, K and V itself)")
    if p.causal == "none" or p.q_len != p.kv_len or p.kv_lens or p.windowed or p.sparse:
        raise Skip("ov_sage runs prefill points: q_len = kv_len, causal, no kv_lens, window or pattern "
                   "(PagedAttention is causal; its sage path is prefill only)")
    if p.head_dim != p.head_dim_v:
        raise Skip("ov_sage: head_dim_v != head_dim")
    if not _cpu_flags() & {"amx_int8", "avx_vnni_int8"}:  # before the plugin is asked at all
        raise Skip("ov_sage: OpenVINO's sage path needs AMX-INT8 or AVX-VNNI-INT8, which this CPU lacks")
    from openvino._pyopenvino.op import _PagedAttentionExtension
    B, n, hq, hk, d = p.batch, p.q_len, p.q_heads, p.kv_heads, p.head_dim
    f32, i32 = ov.Type.f32, ov.Type.i32
    tokens = {name: ops.parameter([-1, h * d], f32, name=name) for name, h in (("q", hq), ("k", hk), ("v", hk))}
    caches = [ops.parameter([-1, hk, SAGE_BLOCK, d], ov.Type.dynamic, name=name)
              for name in ("key_cache", "value_cache")]
    index = {name: ops.parameter([-1], i32, name=name)
             for name in ("past_lens", "subsequence_begins", "block_indices", "block_indices_begins")}
    longest = ops.parameter([], i32, name="max_context_len")
    none_i, none_f = ops.constant(np.zeros(0, np.int32)), ops.constant(np.zeros(0, np.float32))
    zero = ops.constant(np.int32(0))
    inputs = [*tokens.values(), *caches, *index.values(), ops.constant(np.float32(p.scale)),
              zero,                       # sliding_window: none
              none_f,                     # alibi_slopes
              longest,
              none_i,                     # score_aggregation_window
              none_i, ops.constant(np.zeros((0, 1), np.int32)), ops.constant(np.zeros((0, d), np.float32)),
              none_f, zero, zero,         # xattention threshold, block size, stride: off
              none_f,                     # sinks
              zero, none_i, none_i, none_i,  # adaptive RKV: off
              none_i, ops.constant(np.zeros(0, np.uint8)), none_i]  # token types, qq bias
    node = _PagedAttentionExtension([x.output(0) for x in inputs])
    for key, value in (("k_head_size", d), ("num_k_heads", hk), ("v_head_size", d), ("num_v_heads", hk)):
        node.get_rt_info()[key] = value
    params = [*tokens.values(), *caches, *index.values(), longest]
    model = ov.Model([node.output(0)], params, "sage")
    hint = "bf16" if ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES").count("BF16") else "f32"
    compiled = _compile(model, _config({"ENABLE_SAGE_ATTN": True, "INFERENCE_PRECISION_HINT": hint}))
    kcache = compiled.input("key_cache")
    if kcache.get_element_type() != ov.Type.i8:
        raise Skip(f"the CPU plugin did not take its sage path (key cache {kcache.get_element_type()}, not i8)")
    blocks = (n + SAGE_BLOCK - 1) // SAGE_BLOCK
    req = compiled.create_infer_request()
    for port in (kcache, compiled.input("value_cache")):
        shape = [B * blocks] + [x.get_length() for x in list(port.get_partial_shape())[1:]]
        req.set_tensor(port.get_any_name(), ov.Tensor(port.get_element_type(), shape))
    feeds = {name: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(B * n, -1), dtype=np.float32)
             for name, x in (("q", q), ("k", k), ("v", v))}
    feeds.update(past_lens=np.zeros(B, np.int32), subsequence_begins=np.arange(B + 1, dtype=np.int32) * n,
                 block_indices=np.arange(B * blocks, dtype=np.int32),
                 block_indices_begins=np.arange(B + 1, dtype=np.int32) * blocks, max_context_len=np.array(n, np.int32))
    for name, arr in feeds.items():
        req.set_tensor(name, ov.Tensor(arr))
    try:
        req.infer()
    except RuntimeError as e:  # e.g. "sage_attn needs amx_int8/vnni2": a CPU without the units
        raise Skip("openvino refused the sage path: " + str(e).strip().splitlines()[-1][:300])
    how = (f"PagedAttention node built directly, ENABLE_SAGE_ATTN, {hint} precision hint (the compiled model: "
           f"{compiled.get_property('INFERENCE_PRECISION_HINT').get_type_name()}); Q and K rounded to int8 per "
           f"token by the plugin, V to its u8 cache; paged cache of {SAGE_BLOCK}-token blocks written by each call; "
           f"CPU plugin, {_threads} inference threads")

    def collect():
        req.infer()
        return np.array(req.get_output_tensor(0).data, dtype=np.float32).reshape(B, n, hq, d).transpose(0, 2, 1, 3)

    return req.infer, collect, how


def prepare(kernel, p, q, k, v):
    if p.backward:
        raise Skip("OpenVINO has no backward pass (an inference runtime)")
    if kernel == "ov_decode":
        return prepare_decode(p, q, k, v)
    if kernel == "ov_sage":
        return prepare_sage(p, q, k, v)
    if p.dtype not in ("f32", "bf16"):
        raise Skip(f"dtype {p.dtype}: ov_sdpa runs float32 points and bf16 ones (its bf16 precision hint)")
    how = []
    f32, hint = ov.Type.f32, "bf16" if p.dtype == "bf16" else "f32"
    qn = ops.parameter([p.batch, p.q_heads, p.q_len, p.head_dim], f32, name="q")
    kn = ops.parameter([p.batch, p.kv_heads, p.kv_len, p.head_dim], f32, name="k")
    vn = ops.parameter([p.batch, p.kv_heads, p.kv_len, p.head_dim_v], f32, name="v")
    params = [qn, kn, vn]
    feeds = [np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v)]
    kk, vv = kn, vn
    g = p.q_heads // p.kv_heads
    if g > 1:
        kk, vv = _group_heads(p, kn, p.kv_len, p.head_dim), _group_heads(p, vn, p.kv_len, p.head_dim_v)
        how.append("GQA by unsqueeze/broadcast/reshape of K/V inside the model")
    scale = ops.constant(np.float32(p.scale))
    kind, keep = mask_choice(p)
    if kind == "none":
        node = ops.scaled_dot_product_attention(qn, kk, vv, scale=scale, causal=False)
        how.append("no mask")
    elif kind == "causal":
        node = ops.scaled_dot_product_attention(qn, kk, vv, scale=scale, causal=True)
        how.append("causal flag")
    else:
        if empty_rows(keep):
            raise Skip(f"{empty_rows(keep)} rows see no key: OpenVINO's softmax over all -inf is not the lab's O = 0")
        mn = ops.parameter(list(keep.shape), ov.Type.boolean, name="mask")
        params.append(mn)
        feeds.append(np.ascontiguousarray(keep))
        node = ops.scaled_dot_product_attention(qn, kk, vv, attention_mask=mn, scale=scale, causal=False)
        how.append("boolean attention_mask (B,1,Sq,Skv)")
    model = ov.Model([node], params, "peer")
    compiled = _compile(model, _config({"INFERENCE_PRECISION_HINT": hint}))
    runs = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # what it runs: f32 without bf16 units
    req = compiled.create_infer_request()
    for i, arr in enumerate(feeds):
        req.set_input_tensor(i, ov.Tensor(arr))
    how.append(f"CPU plugin, {_threads} inference threads, {hint} precision hint (the compiled model: {runs})")

    def fn():
        req.infer()

    return fn, lambda: np.array(req.get_output_tensor(0).data, dtype=np.float32), "; ".join(how)
