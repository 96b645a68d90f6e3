"""attnlab.torch: the lab's attention as a torch.autograd.Function - forward by a lab kernel, backward
by the same kernel's backward pass (dQ, dK, dV; backward.hpp) - usable where
torch.nn.functional.scaled_dot_product_attention is, for the arguments the two share.

    import attnlab.torch as at
    o = at.attention(q, k, v, is_causal=True, enable_gqa=True)   # (B, H, L, E) tensors, CPU
    o.sum().backward()                                          # q.grad, k.grad, v.grad by the lab

Tensors are read in place (DLPack): contiguous CPU float32, bfloat16 or float16; gradients come back
float32 (cast to the input's dtype). is_causal is torch's top-left alignment; scale as torch's
(default 1/sqrt(E)); enable_gqa as torch's (K/V heads divide Q heads; the lab reads the shared heads,
never repeats them). Not taken (a clear error, never ignored): attn_mask, dropout_p > 0.
"""
import torch

from . import _core


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, kernel, threads):
        kw = dict(causal=causal, scale=scale, kernel=kernel, threads=threads)
        o, lse = _core.attention(q.detach(), k.detach(), v.detach(), return_lse=True, **kw)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.kw = kw
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _core.attention_backward(
            q.detach(), k.detach(), v.detach(), do.detach().float().contiguous(), o=o.detach(), lse=lse.detach(),
            **ctx.kw)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              *, kernel="flash", threads=None):
    """O = softmax(scale Q K^T [+ causal mask]) V by the lab's `kernel` (forward and backward)."""
    if attn_mask is not None:
        raise ValueError("attn_mask: not taken by attnlab.torch yet; allowed: None (with is_causal)")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: {dropout_p}; allowed: 0.0 (the lab computes attention without dropout)")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise ValueError(f"{name}: {x.dim()} dimensions; allowed: 4, (batch, heads, seq, head_dim)")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"key: {key.shape[1]} heads for {query.shape[1]} query heads; allowed: the same "
                         "number, or enable_gqa=True (as torch's scaled_dot_product_attention)")
    return _Attention.apply(query, key, value, "top_left" if is_causal else False, scale, kernel, threads)
