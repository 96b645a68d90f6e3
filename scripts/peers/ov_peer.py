"""OpenVINO: its CPU plugin's fused ScaledDotProductAttention (ov_sdpa), a one-op model
(opset13 scaled_dot_product_attention) compiled for the CPU device with the sweep's thread
count. GQA by K/V unsqueezed, broadcast over the group and reshaped to Hq heads inside the
model (the pattern the CPU plugin fuses into its SDPA node, so K/V are not copied per head);
causal by the op's flag where its top-left rule is the problem's, else a boolean mask (B, 1,
Sq, Skv) from the lab's rule. float32 (INFERENCE_PRECISION_HINT f32: OpenVINO's CPU plugin
would otherwise compute in bf16 where the CPU has it). The inputs are set once on an infer
request: a call is the compiled op alone."""
import numpy as np

from common import Skip, empty_rows, mask_choice

KERNELS = ("ov_sdpa",)
ov = ops = None
_threads = 1


def setup(threads):
    global ov, ops, _threads
    import openvino as _ov
    import openvino.opset13 as _ops
    ov, ops, _threads = _ov, _ops, threads
    return f"openvino {ov.__version__}"


def prepare(kernel, p, q, k, v):
    if p.backward:
        raise Skip("OpenVINO has no backward pass (an inference runtime)")
    how = []
    f32 = ov.Type.f32
    qn = ops.parameter([p.batch, p.q_heads, p.q_len, p.head_dim], f32, name="q")
    kn = ops.parameter([p.batch, p.kv_heads, p.kv_len, p.head_dim], f32, name="k")
    vn = ops.parameter([p.batch, p.kv_heads, p.kv_len, p.head_dim_v], f32, name="v")
    params = [qn, kn, vn]
    feeds = [np.ascontiguousarray(x, dtype=np.float32) for x in (q, k, v)]
    kk, vv = kn, vn
    g = p.q_heads // p.kv_heads
    if g > 1:
        def heads(x, dim):
            x5 = ops.unsqueeze(x, np.int64(2))  # (B, Hkv, 1, S, D)
            wide = ops.broadcast(x5, np.array([p.batch, p.kv_heads, g, p.kv_len, dim], np.int64))
            return ops.reshape(wide, np.array([p.batch, p.q_heads, p.kv_len, dim], np.int64), False)
        kk, vv = heads(kn, p.head_dim), heads(vn, p.head_dim_v)
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
    core = ov.Core()
    config = {"INFERENCE_NUM_THREADS": _threads, "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
              "PERFORMANCE_HINT": "LATENCY"}
    try:
        compiled = core.compile_model(model, "CPU", config)
    except Exception as e:  # the plugin refuses the configuration: unsupported, not wrong
        raise Skip("openvino refused the model: " + str(e).splitlines()[0][:300])
    req = compiled.create_infer_request()
    for i, arr in enumerate(feeds):
        req.set_input_tensor(i, ov.Tensor(arr))
    how.append(f"CPU plugin, {_threads} inference threads, f32 precision hint")

    def fn():
        req.infer()

    return fn, lambda: np.array(req.get_output_tensor(0).data, dtype=np.float32), "; ".join(how)
