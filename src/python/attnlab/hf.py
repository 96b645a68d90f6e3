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
when the model's mask is the plain causal one; any other mask (padding in a batch, a sliding window,
a bidirectional or packed layout) arrives as a tensor, and the backend refuses it with a ValueError
naming it - never computes it as causal. Also refused: dropout in training, softcap, and asking for
the attention weights.
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
    if attention_mask is not None:
        raise ValueError(f"attention_mask: a {tuple(attention_mask.shape)} mask beyond the causal one (padding in a "
                         "batch, a sliding window, ...); allowed: the plain causal mask (transformers then passes "
                         "none) - attnlab.hf does not take other masks yet")
    if dropout:
        raise ValueError(f"dropout: {dropout}; allowed: 0.0 (the lab computes attention without dropout; "
                         "model.eval() for inference)")
    for what in ("softcap", "sliding_window"):
        if kwargs.get(what) is not None:
            raise ValueError(f"{what}: {kwargs[what]}; allowed: None (not taken by attnlab.hf yet)")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: True; allowed: False (the lab never forms the attention weights)")
    q_len, kv_len = query.shape[2], key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    kernel = "decode" if q_len <= DECODE_MAX_Q and q_len < kv_len else "flash"
    o, _ = _attention_op(query, key, value, "bottom_right" if causal else "none", scaling, kernel, None)
    return o.to(query.dtype).transpose(1, 2).contiguous(), None


def _mask(*args, **kwargs):
    """transformers' SDPA mask builder: None for the plain causal mask (then the backend's causal
    flag is the whole mask), a boolean tensor otherwise (which attention_forward refuses)."""
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
