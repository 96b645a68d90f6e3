"""attnlab.hf: the lab as a Hugging Face transformers attention backend.

    import attnlab.hf
    attnlab.hf.register()                                        # once: the name "attnlab"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attnlab")
    # or, on a model already built: model.set_attn_implementation("attnlab")

Each attention layer then runs through the lab's torch operator (attnlab.torch:
torch.ops.attnlab.attention): prefill by `flash`, a few new rows against a longer cache (decode,
q_len <= 16) by `decode`; GQA native (the K/V heads as the model keeps them, never repeated);
causal bottom-right, which is a cache's alignment (the new rows are the cache's last ones). K and V
come from transformers' own cache (DynamicCache): the lab's caches behind a transformers Cache are
not here yet.

The mask: the backend registers transformers' SDPA mask builder under its name, which gives no mask
when the model's mask is the plain causal one (then the lab's causal flag is the whole mask), and a
boolean mask (True = attend) otherwise - padding in a batch, a sliding window, a packed or
bidirectional layout - which the lab takes as the problem's mask (its block map skips the tiles it
hides; a row that sees no key, a left-padded position, gives O = 0). Refused with a ValueError
naming it: an additive float mask, dropout in training, softcap, and asking for the weights.
"""
import torch

from . import torch as _ops  # noqa: F401  (registers torch.ops.attnlab.*)

NAME = "attnlab"
_attention_op = torch.ops.attnlab.attention  # (a name of this module, so a test can watch the calls)
DECODE_MAX_Q = 16  # decode's range (src/cpu/decode.cpp: "q_len <= 16")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function interface: query (B, Hq, Lq, D), key and value (B, Hkv, Lk, D);
    returns (the output as (B, Lq, Hq, Dv) in the query's dtype, None)."""
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise ValueError(f"attention_mask: {attention_mask.dtype}; allowed: a bool mask (True = attend), as "
                         "transformers' SDPA mask builder (registered with the backend) makes it")
    if dropout:
        raise ValueError(f"dropout: {dropout}; allowed: 0.0 (the lab computes attention without dropout; "
                         "model.eval() for inference)")
    if kwargs.get("softcap") is not None:
        raise ValueError(f"softcap: {kwargs['softcap']}; allowed: None (not taken by attnlab.hf yet)")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: True; allowed: False (the lab never forms the attention weights)")
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # A mask is the whole rule (it holds causality, the window, the padding); else causal, bottom-right.
    causal = "bottom_right" if causal and attention_mask is None else "none"
    kernel = "decode" if q_len <= DECODE_MAX_Q and q_len < kv_len else "flash"
    o, _ = _attention_op(query, key, value, attention_mask, causal, scaling, kernel, None)
    return o.to(query.dtype).transpose(1, 2).contiguous(), None


def _mask(*args, **kwargs):
    """transformers' SDPA mask builder: None for the plain causal mask (then the backend's causal
    flag is the whole mask), a boolean tensor (True = attend) otherwise."""
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = True
    return sdpa_mask(*args, **kwargs)


def register(name=NAME):
    """Makes attn_implementation=name (default "attnlab") available to every transformers model."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, _mask)
    return name
