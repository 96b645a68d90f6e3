"""ONNX Runtime: the com.microsoft contrib ops on the CPU execution provider, each as a one-node
model. ort_mha: MultiHeadAttention (Q (B, Sq, Hq*D); K/V repeated to Hq heads for GQA, since the
op has one head count; masks by `unidirectional` or an additive attention_bias). ort_gqa:
GroupQueryAttention (always causal, the queries being the last Sq positions: prefill with
Sq == Skv, decode and chunked prefill with the first Skv - Sq keys in a BNSH KV cache whose
buffer the op's present_key output shares, as in generation; left windows by
local_window_size). Inputs are bound once (IO binding): a call is the op alone.
On the lab's integer caches ort_gqa keeps the cache as ONNX Runtime's own quantized GQA cache does
(k_quant_type / v_quant_type PER_CHANNEL, kv_cache_bit_width 8 for u8 / q8_0, 4 for u4 / q4_0): the
stored values rounded per (kv head, channel) against max |x| over the cache (int_cache), the new rows
quantized by the op itself. onnxruntime 1.32's CPU provider runs int8 and int4 caches, PER_TENSOR
and PER_CHANNEL, in prefill and decode (checked by tests/peers)."""
import numpy as np

from catalogue import peers_of
from common import Skip, empty_rows, mask_choice

KERNELS = peers_of("ort")  # the catalogue's rows of this family (catalogue.json)
ort = onnx = None
_threads = 1


def setup(threads):
    global ort, onnx, _threads
    import onnx as _onnx
    import onnxruntime as _ort
    ort, onnx, _threads = _ort, _onnx, threads
    return f"onnxruntime {ort.__version__}"


def _session(node, inputs, outputs):
    """outputs: (name, shape) float32, or (name, shape, element type)."""
    h = onnx.helper
    f32 = onnx.TensorProto.FLOAT
    vi = lambda name, t, shape: h.make_tensor_value_info(name, t, shape)  # noqa: E731
    graph = h.make_graph([node], "peer", [vi(*x) for x in inputs],
                         [vi(o[0], o[2] if len(o) > 2 else f32, o[1]) for o in outputs])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = _threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # the op refuses the configuration: unsupported, not wrong
        raise Skip("onnxruntime refused the model: " + str(e).splitlines()[0][:300])


def _bsh(x):
    """(B, H, S, D) -> (B, S, H*D) contiguous (the ops' BSH input)."""
    b, hh, s, d = x.shape
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(b, s, hh * d)


def prepare(kernel, p, q, k, v):
    return (_mha if kernel == "ort_mha" else _gqa)(p, q, k, v)


def _run_bound(sess, feeds, out_shape):
    """fn (one run over inputs bound once, O into a preallocated buffer) and the O collector."""
    io = sess.io_binding()
    keep = []  # OrtValues must outlive the binding
    for name, arr in feeds:
        if isinstance(arr, ort.OrtValue):
            io.bind_ortvalue_input(name, arr)
        else:
            val = ort.OrtValue.ortvalue_from_numpy(arr)
            keep.append(val)
            io.bind_ortvalue_input(name, val)
    o = np.empty(out_shape, np.float32)
    io.bind_output("output", "cpu", 0, np.float32, list(o.shape), o.ctypes.data)
    return io, keep, o


def _mha(p, q, k, v):
    g = p.q_heads // p.kv_heads
    how = []
    if g > 1:
        k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
        how.append(f"GQA by K/V repeated to {p.q_heads} heads (outside the timed call)")
    names = ["query", "key", "value", "", "", ""]
    attrs = {"num_heads": p.q_heads, "scale": p.scale}
    inputs = [("query", onnx.TensorProto.FLOAT, [p.batch, p.q_len, p.q_heads * p.head_dim]),
              ("key", onnx.TensorProto.FLOAT, [p.batch, p.kv_len, p.q_heads * p.head_dim]),
              ("value", onnx.TensorProto.FLOAT, [p.batch, p.kv_len, p.q_heads * p.head_dim_v])]
    feeds = [("query", _bsh(q)), ("key", _bsh(k)), ("value", _bsh(v))]
    kind, keep = mask_choice(p)
    if kind == "causal" and p.q_len != p.kv_len:  # unidirectional: for self-attention shapes only
        kind, keep = "mask", p.keep()
    if kind == "none":
        how.append("no mask")
    elif kind == "causal":
        attrs["unidirectional"] = 1
        how.append("unidirectional")
    else:
        if empty_rows(keep):
            raise Skip(f"{empty_rows(keep)} rows see no key: an additive -inf bias gives NaN there (the lab: O = 0)")
        names[5] = "attention_bias"
        inputs.append(("attention_bias", onnx.TensorProto.FLOAT, [p.batch, 1, p.q_len, p.kv_len]))
        feeds.append(("attention_bias", np.where(keep, np.float32(0), np.float32(-np.inf))))
        how.append("additive attention_bias (B,1,Sq,Skv), -inf where masked")
    node = onnx.helper.make_node("MultiHeadAttention", names, ["output"], domain="com.microsoft", **attrs)
    sess = _session(node, inputs, [("output", [p.batch, p.q_len, p.q_heads * p.head_dim_v])])
    io, keep_alive, o = _run_bound(sess, feeds, (p.batch, p.q_len, p.q_heads * p.head_dim_v))
    alive = (feeds, keep_alive)  # the bound buffers live as long as fn

    def fn():
        sess.run_with_iobinding(io)
        return alive

    collect = lambda: o.reshape(p.batch, p.q_len, p.q_heads, p.head_dim_v).transpose(0, 2, 1, 3)  # noqa: E731
    return fn, collect, "; ".join(how)


INT_CACHES = {"u8": 8, "q8_0": 8, "u4": 4, "q4_0": 4}  # the lab's integer caches -> ORT's cache bit width


def int_cache(x, bits):
    """x (B, Hk, S, D) float32 as ONNX Runtime's PER_CHANNEL cache holds it: scale (1, Hk, 1, D) =
    max |x| over the batch and positions / (2^(bits-1) - 1) (1 where that is 0), codes round(x / scale)
    (int8 (B, Hk, S, D); bits 4: code + 8 in a nibble, two per byte, the even value low (B, Hk, S, D/2)
    uint8 - the layout onnxruntime 1.32 reads, found by tests/peers: signed nibbles or the odd value
    low disagree), and the values the codes stand for (float32, x's shape)."""
    levels = 127 if bits == 8 else 7
    amax = np.abs(x).max(axis=(0, 2), keepdims=True)
    scale = np.where(amax > 0, amax / np.float32(levels), 1).astype(np.float32)
    codes = np.clip(np.rint(x / scale), -levels, levels).astype(np.int8)
    values = codes.astype(np.float32) * scale
    if bits == 4:
        u = (codes.astype(np.int16) + 8).astype(np.uint8)
        codes = np.ascontiguousarray(u[..., 0::2] | (u[..., 1::2] << 4))
    return np.ascontiguousarray(codes), scale, values


def _gqa(p, q, k, v):
    if p.causal == "none":
        raise Skip("GroupQueryAttention is always causal")
    if p.causal == "top-left" and p.q_len != p.kv_len:
        raise Skip("GroupQueryAttention's queries are the last positions (bottom-right causal), not top-left")
    if p.kv_lens or p.sparse or p.head_dim_v != p.head_dim:
        raise Skip("ort_gqa runs causal [+ left window] over full-length caches with d_v = d "
                   "(kv_lens, sparse patterns and d_v != d are not its inputs)")
    how = ["GQA native" if p.gqa else "MHA as GQA with kv_num_heads = num_heads", "causal"]
    attrs = {"num_heads": p.q_heads, "kv_num_heads": p.kv_heads, "scale": p.scale}
    if p.left >= 0:
        # local_window_size W: a query sees its last W keys, itself included; the lab's window
        # (L, R) with causal: keys at distances 0..L, so W = L + 1 (tests/python check it).
        attrs["local_window_size"] = p.left + 1
        how.append(f"local_window_size {p.left + 1}")
    past = p.kv_len - p.q_len
    b, hk, d = p.batch, p.kv_heads, p.head_dim
    f32, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    kv_dtype = p.d.get("kv_dtype", "dtype") or "dtype"
    bits = INT_CACHES.get(kv_dtype)
    if kv_dtype != "dtype" and not bits:
        raise Skip(f"kv_dtype {kv_dtype}: ort_gqa's caches are float or its int8 / int4 cache (the lab's u8, q8_0, "
                   "u4, q4_0 points)")
    if bits and past == 0:
        raise Skip("an integer cache needs cached positions (q_len < kv_len): ort_gqa quantizes the past")
    cache_type, cache_d = f32, d
    if bits:
        if bits == 4 and d % 2:
            raise Skip(f"head_dim {d}: an int4 cache packs two values per byte")
        k_codes, k_scale, _ = int_cache(k, bits)
        v_codes, v_scale, _ = int_cache(v, bits)
        cache_type = onnx.TensorProto.INT8 if bits == 8 else onnx.TensorProto.UINT8
        cache_d = d if bits == 8 else d // 2
        attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=bits)
        how.append(f"int{bits} cache (kv_cache_bit_width {bits}, PER_CHANNEL: a scale per kv head and channel, "
                   "max |x| / " + ("127" if bits == 8 else "7") + ")")
    inputs = [("query", f32, [b, p.q_len, p.q_heads * d]), ("key", f32, [b, p.q_len, hk * d]),
              ("value", f32, [b, p.q_len, hk * d]),
              ("seqlens_k", i32, [b]), ("total_sequence_length", i32, [1])]
    names = ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"]
    feeds = [("query", _bsh(q)), ("key", _bsh(k[:, :, past:])), ("value", _bsh(v[:, :, past:])),
             ("seqlens_k", np.full(b, p.kv_len - 1, np.int32)),
             ("total_sequence_length", np.array([p.kv_len], np.int32))]
    outputs = [("output", [b, p.q_len, p.q_heads * d])]
    if past > 0:
        # The cache: a BNSH buffer of Skv positions holding the whole K/V; the op appends the
        # new Sq rows at positions past.. (the same values) into the buffer it shares with
        # present_key / present_value.
        names[3:5] = ["past_key", "past_value"]
        shape = [b, hk, p.kv_len, cache_d]
        inputs[3:3] = [("past_key", cache_type, shape), ("past_value", cache_type, shape)]
        outputs += [("present_key", shape, cache_type), ("present_value", shape, cache_type)]
        cache_k = ort.OrtValue.ortvalue_from_numpy(k_codes if bits else np.ascontiguousarray(k))
        cache_v = ort.OrtValue.ortvalue_from_numpy(v_codes if bits else np.ascontiguousarray(v))
        feeds[3:3] = [("past_key", cache_k), ("past_value", cache_v)]
        if bits:  # inputs 12 and 13 (after cos/sin caches, position ids, attention bias, head sink)
            names += ["", "", "", "", "", "k_scale", "v_scale"]
            inputs += [("k_scale", f32, list(k_scale.shape)), ("v_scale", f32, list(v_scale.shape))]
            feeds += [("k_scale", k_scale), ("v_scale", v_scale)]
        how.append(f"decode/chunk: {past} cached positions, the cache buffer shared with present_key/value")
    else:
        outputs += [("present_key", [b, hk, p.kv_len, d]), ("present_value", [b, hk, p.kv_len, d])]
    node = onnx.helper.make_node("GroupQueryAttention", names, [o[0] for o in outputs], domain="com.microsoft",
                                 **attrs)
    sess = _session(node, inputs, outputs)
    io, keep_alive, o = _run_bound(sess, feeds, (b, p.q_len, p.q_heads * d))
    if past > 0:
        io.bind_ortvalue_output("present_key", cache_k)
        io.bind_ortvalue_output("present_value", cache_v)
        keep_alive += [cache_k, cache_v]
    else:
        io.bind_output("present_key")
        io.bind_output("present_value")
    alive = (feeds, keep_alive)  # the bound buffers live as long as fn

    def fn():
        sess.run_with_iobinding(io)
        return alive

    collect = lambda: o.reshape(b, p.q_len, p.q_heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    return fn, collect, "; ".join(how)
