"""PyTorch: torch.nn.functional.scaled_dot_product_attention (torch_sdpa; its CPU backends pick
the fused flash kernel where they can) and FlexAttention (torch_flex, sparse patterns: a
BlockMask built from the pattern, flex_attention compiled by torch.compile for the CPU)."""
import numpy as np

from catalogue import peers_of
from common import Skip, empty_rows, mask_choice

KERNELS = peers_of("torch")  # the catalogue's rows of this family (catalogue.json)
BACKWARD = True  # torch_sdpa's, by autograd (torch_flex: forward only here)
# The score modifications each takes (serve.py skips the others): SDPA's additive float mask carries
# ALiBi's bias and, as one more key with K = V = 0, a sink logit; FlexAttention's score_mod softcap
# and ALiBi.
SCORE_MODS = {"torch_sdpa": {"alibi", "sink_logits"}, "torch_flex": {"softcap", "alibi"}}
torch = None


def setup(threads):
    global torch
    import torch as _torch
    torch = _torch
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (only the first call may)
        pass
    return f"torch {torch.__version__}"


def _tensors(p, q, k, v):
    # torch takes (B, H, S, D) views: bshd files stay in their memory order (strided views).
    return [torch.from_numpy(x) for x in (q, k, v)]


def prepare(kernel, p, q, k, v):
    qt, kt, vt = _tensors(p, q, k, v)
    if kernel == "torch_sdpa":
        return _sdpa(p, qt, kt, vt)
    if p.backward:
        raise Skip("torch_flex's backward is not measured (torch_sdpa's is)")
    return _flex(p, qt, kt, vt)


def _sdpa(p, qt, kt, vt):
    F = torch.nn.functional
    how = []
    kwargs = {"scale": p.scale}
    if p.gqa:
        kwargs["enable_gqa"] = True
        how.append("GQA by enable_gqa")
    kind, keep = mask_choice(p)
    if p.score_mods:
        return _sdpa_bias(p, F, qt, kt, vt, kwargs, how)
    if kind == "none":
        how.append("no mask")
    elif kind == "causal":
        kwargs["is_causal"] = True
        how.append("is_causal")
    else:
        kwargs["attn_mask"] = torch.from_numpy(keep)
        how.append("boolean attn_mask (B,1,Sq,Skv)" + (f", {empty_rows(keep)} rows fully masked (O = 0)"
                                                      if empty_rows(keep) else ""))
    out = {}
    if p.backward:
        return _sdpa_backward(p, F, qt, kt, vt, kwargs, how)

    def fn():
        out["o"] = F.scaled_dot_product_attention(qt, kt, vt, **kwargs)

    return fn, lambda: out["o"].numpy(), "; ".join(how)


def _sdpa_bias(p, F, qt, kt, vt, kwargs, how):
    """ALiBi and sink logits as an additive float mask (B, Hq, Sq, Skv [+1]): the bias, -inf where the
    mask hides a key; a sink logit as one more key whose K and V rows are 0 (its score is the mask's
    value alone, its value row adds nothing) - how a runtime without either term runs them."""
    keep = p.keep()
    bias = np.where(keep, np.float32(0), np.float32(-np.inf))
    bias = np.broadcast_to(bias, (p.batch, p.q_heads, p.q_len, p.kv_len))
    if p.alibi is not None:
        bias = bias + p.alibi_bias()
        how.append("ALiBi as an additive float attn_mask")
    if p.sink_logits is not None:
        sink = np.broadcast_to(np.asarray(p.sink_logits, np.float32)[None, :, None, None],
                               (p.batch, p.q_heads, p.q_len, 1))
        bias = np.concatenate([bias, sink], axis=-1)
        kt = torch.cat([kt, kt.new_zeros(kt.shape[:2] + (1, kt.shape[3]))], dim=2)
        vt = torch.cat([vt, vt.new_zeros(vt.shape[:2] + (1, vt.shape[3]))], dim=2)
        how.append("sink logits as one more key (K = V = 0) with the logit in the mask")
    elif empty_rows(keep):
        raise Skip(f"{empty_rows(keep)} rows see no key: SDPA's softmax over an all -inf float mask row is NaN, not "
                   "the lab's O = 0")
    kwargs["attn_mask"] = torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32))
    out = {}

    def fn():
        out["o"] = F.scaled_dot_product_attention(qt, kt, vt, **kwargs)

    return fn, lambda: out["o"].numpy(), "; ".join(how)


def _sdpa_backward(p, F, qt, kt, vt, kwargs, how):
    """Autograd through SDPA: backward alone times torch.autograd.grad on a graph built once
    (retain_graph, so each call runs the same backward kernels), forward_backward both."""
    leaves = [x.detach().requires_grad_(True) for x in (qt, kt, vt)]
    do = torch.from_numpy(p.d_o)
    out = {}
    if p.pass_ == "backward":
        o = F.scaled_dot_product_attention(*leaves, **kwargs)
        out["o"] = o

        def fn():
            out["g"] = torch.autograd.grad(o, leaves, do, retain_graph=True)
        how.append("autograd.grad on a retained graph (the forward outside the timed calls)")
    else:
        def fn():
            out["o"] = F.scaled_dot_product_attention(*leaves, **kwargs)
            out["g"] = torch.autograd.grad(out["o"], leaves, do)
        how.append("forward + autograd.grad per call")

    def collect():
        dq, dk, dv = (g.contiguous().numpy() for g in out["g"])
        return {"o": out["o"].detach().numpy(), "dq": dq, "dk": dk, "dv": dv}

    return fn, collect, "; ".join(how)


def _flex(p, qt, kt, vt):
    if not (p.sparse or p.windowed or p.score_mods):
        raise Skip("torch_flex runs sparse patterns, windows and score modifications (torch_sdpa runs the rest)")
    if p.kv_len < 128:
        # Measured with torch 2.15 (tests/peers/test_peers.py and a scratch probe): keys shorter
        # than one of FlexAttention's 128-token blocks gave wrong or NaN rows for some masks
        # (kv 24, 40, 56), right ones for others; from 128 keys on every case matched.
        raise Skip(f"kv_len {p.kv_len} < 128: FlexAttention's compiled CPU kernel (torch 2.15) returned wrong "
                   "values for some keys shorter than one 128-token block; allowed: kv_len >= 128")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    keep = p.keep()
    if empty_rows(keep):
        raise Skip(f"{empty_rows(keep)} rows see no key: FlexAttention's output there is not the lab's O = 0")
    keep_t = torch.from_numpy(keep[:, 0].copy())

    def mask_mod(b, h, qi, kj):
        return keep_t[b, qi, kj]

    block = create_block_mask(mask_mod, p.batch, None, p.q_len, p.kv_len, device="cpu")
    compiled = torch.compile(flex_attention, dynamic=False)
    kwargs = {"block_mask": block, "scale": p.scale, "enable_gqa": p.gqa}
    mods = []
    if p.softcap or p.alibi is not None:  # score_mod: softcap, then ALiBi (the lab's order)
        cap = p.softcap
        slopes = torch.tensor(p.alibi or [0.0] * p.q_heads, dtype=torch.float32)
        pos = torch.tensor([[i + (0 if p.causal == "top-left" else p.kv_len_of(b) - p.q_len) for i in range(p.q_len)]
                            for b in range(p.batch)])

        def score_mod(score, b, h, qi, kj):
            if cap:
                score = cap * torch.tanh(score / cap)
            if p.alibi is not None:
                score = score + slopes[h] * (kj - pos[b, qi])
            return score

        kwargs["score_mod"] = score_mod
        mods = ["score_mod: " + " + ".join(sorted(p.score_mods))]
    out = {}

    def fn():
        out["o"] = compiled(qt, kt, vt, **kwargs)

    how = "; ".join([f"BlockMask from the dense mask (sparsity {block.sparsity():.0f}%), torch.compile"] + mods)
    return fn, lambda: out["o"].numpy(), how
