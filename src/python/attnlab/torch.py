"""attnlab.torch: the lab's attention as torch operators - forward by a lab kernel, backward by the
same kernel's backward pass (dQ, dK, dV; backward.hpp) - usable where
torch.nn.functional.scaled_dot_product_attention is, for the arguments the two share.

    import attnlab.torch as at
    o = at.attention(q, k, v, is_causal=True, enable_gqa=True)   # (B, H, L, E) tensors, CPU
    o.sum().backward()                                          # q.grad, k.grad, v.grad by the lab
    torch.compile(model, fullgraph=True)                        # the op stays in the graph

The two operators are registered with torch.library (torch.ops.attnlab.attention and
attention_backward), each with a fake (meta) implementation that gives the output shapes without
running anything, and the forward's autograd formula is the backward operator: torch.compile keeps
them in its graph (no graph break), and torch.library.opcheck holds them to torch's rules.

Tensors are read in place (DLPack) when contiguous, else copied once to contiguous memory (a
model's transposed views); CPU float32, bfloat16 or float16; O comes back float32, gradients float32
cast to the input's dtype. is_causal is torch's top-left alignment; scale as torch's (default
1/sqrt(E)); enable_gqa as torch's (K/V heads divide Q heads; the lab reads the shared heads, never
repeats them); attn_mask a bool mask (True = attend) of shape (L, S) or (B|1, H|1, L, S), with
is_causal or without (both: their intersection; a row with no visible key gives O = 0); softcap and
sink_logits (keywords beyond torch's). Not taken (a clear error, never ignored): an additive float
attn_mask, dropout_p > 0.
"""
from typing import Optional

import torch

from . import _core

# The causal argument of the operators (a schema takes str, not the module's False/"top_left").
_CAUSAL = {"none": False, "top_left": "top_left", "bottom_right": "bottom_right"}


def _in(x):
    """A tensor as the module reads it: no autograd (the operators' formula is the backward's), and
    C-contiguous (a copy only where it is not)."""
    return x.detach().contiguous()


def _score_kw(softcap, sinks):
    """The score modifications (docs/operation.md) as the module's keywords: softcap, and sink logits
    from a tensor of one per query head."""
    kw = {}
    if softcap is not None:
        kw["softcap"] = softcap
    if sinks is not None:
        kw["sink_logits"] = sinks.detach().float().reshape(-1).tolist()
    return kw


def _kw(mask, causal, scale, kernel, threads, softcap=None, sinks=None):
    if causal not in _CAUSAL:
        raise ValueError(f"causal: {causal!r}; allowed: " + ", ".join(_CAUSAL))
    kw = dict(causal=_CAUSAL[causal], scale=scale, kernel=kernel, threads=threads, **_score_kw(softcap, sinks))
    if mask is not None:  # bool (True = attend) as numpy shares it; the module copies it once
        kw["mask"] = mask.detach().contiguous().numpy()
    return kw


@torch.library.custom_op("attnlab::attention", mutates_args=(), device_types="cpu")
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor], causal: str,
               scale: Optional[float], kernel: str, threads: Optional[int], softcap: Optional[float] = None,
               sinks: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _core.attention(_in(q), _in(k), _in(v), return_lse=True,
                             **_kw(mask, causal, scale, kernel, threads, softcap, sinks))
    return o, lse


@_attention.register_fake
def _(q, k, v, mask, causal, scale, kernel, threads, softcap=None, sinks=None):
    b, h, n, _ = q.shape
    return q.new_empty((b, h, n, v.shape[-1]), dtype=torch.float32), q.new_empty((b, h, n), dtype=torch.float32)


@torch.library.custom_op("attnlab::attention_backward", mutates_args=(), device_types="cpu")
def _attention_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                        lse: torch.Tensor, mask: Optional[torch.Tensor], causal: str, scale: Optional[float],
                        kernel: str, threads: Optional[int], softcap: Optional[float] = None,
                        sinks: Optional[torch.Tensor] = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV and dsink (the sink logits' gradient; empty without them)."""
    grads = _core.attention_backward(_in(q), _in(k), _in(v), _in(do.float()), o=_in(o), lse=_in(lse),
                                     **_kw(mask, causal, scale, kernel, threads, softcap, sinks))
    dsink = grads[3] if sinks is not None else q.new_empty((0,), dtype=torch.float32)
    return grads[0], grads[1], grads[2], dsink


@_attention_backward.register_fake
def _(do, q, k, v, o, lse, mask, causal, scale, kernel, threads, softcap=None, sinks=None):
    dsink = q.new_empty((q.shape[1] if sinks is not None else 0,), dtype=torch.float32)
    return tuple(x.new_empty(x.shape, dtype=torch.float32) for x in (q, k, v)) + (dsink,)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, causal, scale, kernel, threads, softcap, sinks = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse, mask, sinks)
    ctx.args = (causal, scale, kernel, threads, softcap)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse, mask, sinks = ctx.saved_tensors
    causal, scale, kernel, threads, softcap = ctx.args
    dq, dk, dv, dsink = _attention_backward(do, q, k, v, o, lse, mask, causal, scale, kernel, threads, softcap,
                                            sinks)
    dsinks = dsink.to(sinks.dtype).reshape(sinks.shape) if sinks is not None else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None, dsinks


_attention.register_autograd(_backward, setup_context=_setup_context)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
              *, kernel="auto", threads=None, softcap=None, sink_logits=None):
    """O = softmax(scale Q K^T [+ causal mask] [+ attn_mask]) V by the lab's `kernel` (forward and backward).
    softcap (c: scores c tanh(s / c)) and sink_logits (a tensor of one logit per query head: one more term
    of each row's softmax, no value row) are the lab's score modifications (docs/operation.md); their
    backward (softcap's derivative on dS, the sink logits' own gradient) is naive's and flash's."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise ValueError(f"attn_mask: {attn_mask.dtype}; allowed: a bool mask (True = attend), shape (L, S) or "
                         "(B|1, H|1, L, S) - an additive float mask is not taken")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p: {dropout_p}; allowed: 0.0 (the lab computes attention without dropout)")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if x.dim() != 4:
            raise ValueError(f"{name}: {x.dim()} dimensions; allowed: 4, (batch, heads, seq, head_dim)")
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError(f"key: {key.shape[1]} heads for {query.shape[1]} query heads; allowed: the same "
                         "number, or enable_gqa=True (as torch's scaled_dot_product_attention)")
    return _attention(query, key, value, attn_mask, "top_left" if is_causal else "none", scale, kernel, threads,
                      softcap, sink_logits)[0]
