"""attnlab.hf: the lab as a Hugging Face transformers attention backend.

    import attnlab.hf
    attnlab.hf.register()                                        # once: the name "attnlab"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="attnlab")
    # or, on a model already built: model.set_attn_implementation("attnlab")

Each attention layer then runs through the lab's torch operator (attnlab.torch:
torch.ops.attnlab.attention): prefill by `flash`, a few new rows against a longer cache (decode,
q_len <= 16) by `decode`; GQA native (the K/V heads as the model keeps them, never repeated);
causal bottom-right, which is a cache's alignment (the new rows are the cache's last ones). K and V
come from transformers' own cache (DynamicCache), or from the lab's:

    cache = attnlab.hf.LabCache(kv_dtype="q8_0", block=16)        # f32, bf16, f16, q8_0, q4_0, u8, u4,
    model.generate(ids, cache=cache, max_new_tokens=64)          # fp8_e4m3, fp8_e5m2; paged or not

LabCache holds each layer's K and V as the lab stores them - a float cache, or the rows of a
quantized layout (kv_quant.hpp) - contiguous (batch, kv_heads, capacity, row) or paged (a pool of
blocks and a block table, vLLM's layout), appended each step by the lab's writer (attnlab.write_kv:
only the new rows are converted) and read in place by the kernels (attnlab.attention with kv_dtype,
kv_lens and block_table): no float copy of the cache per step. Every step, prefill included, attends
over the cache as stored (as llama.cpp does), so the prompt's own attention sees the rounded K/V too.
Not under torch.compile (the cache's handle is a Python object, a graph break per layer).

The mask: the backend registers transformers' SDPA mask builder under its name, which gives no mask
when the model's mask is the plain causal one (then the lab's causal flag is the whole mask), and a
boolean mask (True = attend) otherwise - padding in a batch, a sliding window, a packed or
bidirectional layout - which the lab takes as the problem's mask (its block map skips the tiles it
hides; a row that sees no key, a left-padded position, gives O = 0). The score modifications the
models pass are taken (docs/operation.md): Gemma 2's logit soft-capping (`softcap`) and gpt-oss's
sink logits (`s_aux`); ALiBi models (BLOOM, MPT, Falcon's ALiBi variant) compute their attention in
their own modules, never through the interface. Refused with a ValueError naming it: an additive
float mask, dropout in training, and asking for the weights.
"""
import numpy
import torch

from . import _core
from . import torch as _ops  # noqa: F401  (registers torch.ops.attnlab.*)

try:  # transformers' cache classes (LabCache); attention_forward needs none of transformers
    from transformers.cache_utils import Cache, CacheLayerMixin
except ImportError:  # pragma: no cover
    Cache = CacheLayerMixin = None

NAME = "attnlab"
_attention_op = torch.ops.attnlab.attention  # (a name of this module, so a test can watch the calls)
DECODE_MAX_Q = 16  # decode's range (src/cpu/kernels/decode.cpp: "q_len <= 16")


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' attention-function interface: query (B, Hq, Lq, D), key and value (B, Hkv, Lk, D)
    tensors or a LabCache layer's handles; returns (the output as (B, Lq, Hq, Dv) in the query's
    dtype, None)."""
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise ValueError(f"attention_mask: {attention_mask.dtype}; allowed: a bool mask (True = attend), as "
                         "transformers' SDPA mask builder (registered with the backend) makes it")
    if dropout:
        raise ValueError(f"dropout: {dropout}; allowed: 0.0 (the lab computes attention without dropout; "
                         "model.eval() for inference)")
    if kwargs.get("output_attentions"):
        raise ValueError("output_attentions: True; allowed: False (the lab never forms the attention weights)")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # A mask is the whole rule (it holds causality, the window, the padding); else causal, bottom-right.
    causal = "bottom_right" if causal and attention_mask is None else "none"
    kernel = "auto"  # the fastest kernel that runs it here (attnlab list prints the table)
    # The score modifications models pass: Gemma 2's logit soft-capping, gpt-oss's sink logits (s_aux).
    softcap, sinks = kwargs.get("softcap"), kwargs.get("s_aux")
    if isinstance(key, Stored):
        o = key.layer.attention(query, attention_mask, causal, scaling, kernel, softcap, sinks)
    else:
        o, _ = _attention_op(query, key, value, attention_mask, causal, scaling, kernel, None, softcap, sinks)
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


# The storage of each cache type: a float cache in torch's dtype, or uint8 rows of a quantized layout.
FLOAT_CACHES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
QUANTIZED_CACHES = ("q8_0", "q4_0", "u8", "u4", "fp8_e4m3", "fp8_e5m2")
CACHE_TYPES = tuple(FLOAT_CACHES) + QUANTIZED_CACHES
INTEGER_CACHES = ("q8_0", "q4_0", "u8", "u4")  # decode_i8's (integer codes)


class Stored:
    """What a LabCache layer's update hands the attention function for K (and for V): the layer,
    whose storage the kernels read in place; .shape as the K (V) a DynamicCache would return."""

    def __init__(self, layer, dim):
        self.layer, self.shape = layer, (layer.batch, layer.heads, layer.length, dim)


class LabLayer(CacheLayerMixin if CacheLayerMixin is not None else object):
    """One layer's K and V as the lab stores them (see LabCache)."""

    is_sliding = False
    is_compileable = False
    is_croppable = True

    def __init__(self, kv_dtype="f32", block=0, max_cache_len=None, decode_kernel="auto", threads=None,
                 topk_tokens=0, topk_sinks=0, topk_recent=0):
        super().__init__()
        for name, value in (("topk_tokens", topk_tokens), ("topk_sinks", topk_sinks), ("topk_recent", topk_recent)):
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: {value!r}; allowed: an int >= 0")
        if not topk_tokens and (topk_sinks or topk_recent):
            raise ValueError("topk_sinks, topk_recent: set without topk_tokens; allowed: with topk_tokens > 0")
        if kv_dtype not in CACHE_TYPES:
            raise ValueError(f"kv_dtype: {kv_dtype!r}; allowed: " + ", ".join(CACHE_TYPES))
        low, high = _core.KV_BLOCKS
        if block and not (low <= block <= high and block & (block - 1) == 0):
            raise ValueError(f"block: {block}; allowed: 0 (contiguous) or a power of two {low}..{high} (tokens per "
                             "block)")
        if decode_kernel not in ("auto", "decode", "decode_i8"):
            raise ValueError(f"decode_kernel: {decode_kernel!r}; allowed: auto (the lab's table: decode_i8 on "
                             "q8_0, q4_0, u8, u4 where the CPU runs vpdpbusd), decode, decode_i8 (integer K.Q "
                             "and P.V on q8_0, q4_0, u8, u4)")
        self.kv_dtype, self.block, self.max_cache_len = kv_dtype, block, max_cache_len
        self.decode_kernel, self.threads = decode_kernel, threads
        self.topk = dict(topk_tokens=topk_tokens, topk_sinks=topk_sinks, topk_recent=topk_recent) if topk_tokens \
            else None
        self.length = 0
        self.last_kernel = None  # the kernel variant the last attention call ran (e.g. "decode_i8[avx512]")

    # storage: contiguous (batch, heads, capacity, row) or a pool (blocks, heads, block, row) + table
    def _row(self, dim):
        if self.kv_dtype in FLOAT_CACHES:
            return dim, FLOAT_CACHES[self.kv_dtype]
        return _core.kv_row_bytes(self.kv_dtype, dim), torch.uint8

    def _storage(self, rows, dim):
        width, dtype = self._row(dim)
        return torch.zeros((rows, self.heads, self.block, width) if self.block else
                           (self.batch, self.heads, rows, width), dtype=dtype)

    def lazy_initialization(self, key_states, value_states):
        self.batch, self.heads, _, self.dim = key_states.shape
        self.dim_v = value_states.shape[-1]
        self.capacity = 0  # tokens per sequence (contiguous), blocks (paged)
        self.keys = self.values = None
        self.table = numpy.zeros((self.batch, 0), dtype=numpy.int32)  # paged: the block table
        self.summary = None  # topk: K's page summaries per sequence position (attnlab.new_kv_summary)
        self.is_initialized = True

    def _grow(self, length):
        """Room for `length` tokens per sequence: a contiguous cache doubles its capacity (the rows
        so far copied once; with max_cache_len made once at that size), a paged one takes free
        blocks of its pool for each sequence (the pool doubling when none are left: the blocks
        keep their ids)."""
        if self.max_cache_len is not None and length > self.max_cache_len:
            raise ValueError(f"max_cache_len: {self.max_cache_len}; the cache needs {length} tokens")
        rows_for = lambda n: -(-n // self.block) * self.batch if self.block else n  # noqa: E731
        need = rows_for(length)
        if need > self.capacity:
            rows = rows_for(self.max_cache_len) if self.max_cache_len else max(need, 2 * self.capacity, rows_for(256))
            keys, values = self._storage(rows, self.dim), self._storage(rows, self.dim_v)
            if self.keys is not None:
                used = slice(0, self.capacity) if self.block else (slice(None), slice(None), slice(0, self.length))
                keys[used], values[used] = self.keys[used], self.values[used]
            self.keys, self.values, self.capacity = keys, values, rows
        if self.block:
            entries = -(-length // self.block)
            taken = self.table.shape[1]
            if entries > taken:  # sequence b's next blocks, handed out in turn as tokens arrive
                fresh = numpy.arange(taken * self.batch, entries * self.batch, dtype=numpy.int32)
                self.table = numpy.ascontiguousarray(numpy.concatenate(
                    [self.table, fresh.reshape(entries - taken, self.batch).T], axis=1))
        if self.topk:  # the summaries cover every position the kernels may be handed (the capacity)
            tokens = self.table.shape[1] * self.block if self.block else self.capacity
            per_block = _core.SUMMARY_PAGE_KEYS * _core.SUMMARY_BLOCK_PAGES
            blocks = 0 if self.summary is None else self.summary.shape[2]
            if -(-tokens // per_block) > blocks:
                more = _core.new_kv_summary(self.batch, self.heads, tokens - per_block * blocks, self.dim)
                self.summary = more if self.summary is None else \
                    numpy.ascontiguousarray(numpy.concatenate([self.summary, more], axis=2))

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._grow(self.length + n)
        kw = dict(kv_dtype=None if self.kv_dtype in FLOAT_CACHES else self.kv_dtype,
                  block_table=self.table if self.block else None)
        _core.write_kv(self.keys, key_states.detach().float().contiguous(), self.length, summary=self.summary, **kw)
        _core.write_kv(self.values, value_states.detach().float().contiguous(), self.length, **kw)
        self.length += n
        return Stored(self, self.dim), Stored(self, self.dim_v)

    def attention(self, query, mask, causal, scale, kernel, softcap=None, sinks=None):
        """O (B, Hq, Lq, Dv) float32 of query over the stored K and V, read in place."""
        float_cache = self.kv_dtype in FLOAT_CACHES
        q = query.detach().to(FLOAT_CACHES[self.kv_dtype] if float_cache else torch.float32).contiguous()
        kw = dict(kv_lens=[self.length] * self.batch, threads=self.threads, scale=scale,
                  causal=causal != "none", **_ops._score_kw(softcap, sinks))
        if not float_cache:
            kw["kv_dtype"] = self.kv_dtype
        if self.block:
            kw["block_table"] = self.table
        if mask is not None:  # as wide as the cache's keys: a contiguous cache's capacity past them hidden
            width = self.length if self.block else self.capacity
            kw["mask"] = torch.nn.functional.pad(mask, (0, width - mask.shape[-1]), value=False).contiguous().numpy()
        q_len = query.shape[2]
        decode_step = q_len <= DECODE_MAX_Q and q_len < self.length
        if self.decode_kernel != "auto" and decode_step:
            kernel = self.decode_kernel if self.kv_dtype in INTEGER_CACHES else "decode"
        # Query-aware sparse decode on a decode step under the plain causal mask (a mask of the model's
        # own is a pattern the page bound does not cover: such steps read every key).
        if self.topk and decode_step and mask is None:
            kw.update(self.topk, kv_summary=self.summary)
        # A float32 model keeps float32 products on a 16-bit cache (its storage, not its arithmetic);
        # auto still takes an integer cache's steps with decode_i8 (its row holds under any arithmetic).
        arithmetic = "native" if query.dtype == torch.bfloat16 or kernel != "auto" else "f32"
        o, info = _core.attention(q, self.keys, self.values, kernel=kernel, return_info=True,
                                  arithmetic=arithmetic, **kw)
        self.last_kernel = info["kernel"]
        return o

    def get_mask_sizes(self, query_length):
        return self.length + query_length, 0

    def get_seq_length(self):
        return self.length

    def get_max_length(self):
        return -1 if self.max_cache_len is None else self.max_cache_len

    def reset(self):
        self.length = 0
        if self.summary is not None:
            self.summary = _core.new_kv_summary(self.batch, self.heads, self.summary.shape[2] * _core.SUMMARY_PAGE_KEYS
                                                * _core.SUMMARY_BLOCK_PAGES, self.dim)

    def crop(self, tokens_to_remove):
        # (the summaries keep the dropped rows' extent: the rows written over them widen it - a looser
        # bound, never a wrong one)
        if tokens_to_remove > 0:  # transformers' rule: a negative count of tokens to drop
            raise ValueError(f"tokens_to_remove: {tokens_to_remove}; allowed: <= 0 (minus the tokens to drop)")
        self.length = max(0, self.length + tokens_to_remove)

    def reorder_cache(self, beam_idx):
        """Beam search: sequence b takes sequence beam_idx[b]'s rows (a paged cache copies the
        blocks, each sequence keeping its own)."""
        if not self.is_initialized or self.length == 0:
            return
        idx = beam_idx.cpu()
        if self.summary is not None:  # per sequence, whatever the storage
            self.summary = numpy.ascontiguousarray(self.summary[idx.numpy()])
        if self.block:
            dst = torch.from_numpy(self.table.reshape(-1).astype(numpy.int64))
            src = torch.from_numpy(self.table[idx.numpy()].reshape(-1).astype(numpy.int64))
            self.keys[dst], self.values[dst] = self.keys[src], self.values[src]
        else:
            self.keys, self.values = self.keys.index_select(0, idx), self.values.index_select(0, idx)


class LabCache(Cache if Cache is not None else object):
    """A transformers Cache whose layers are the lab's caches (LabLayer): kv_dtype f32, bf16, f16
    (a float cache; Q rounded to it for the dot products) or q8_0, q4_0, u8, u4, fp8_e4m3, fp8_e5m2
    (kv_quant.hpp's layouts); block 0 (contiguous, capacity doubling as it fills) or tokens per block
    (paged: a pool and a block table); max_cache_len bounds the tokens per sequence (the storage is
    then made once at that size and never moves; more tokens are a ValueError). decode_kernel "auto" (the
    default: the lab's table, `attnlab list`), "decode" (float32 dot products on the dequantized rows) or
    "decode_i8" (integer dot products on q8_0, q4_0, u8, u4 codes); each layer's last_kernel names the
    kernel its last call ran. topk_tokens N > 0: query-aware sparse decode (include/attnlab/kv_summary.hpp) -
    each decode step attends the 64-key pages its query's bound from K's per-page min and max ranks first,
    within N keys per sequence and kv head, always with the pages of the first topk_sinks and the last
    topk_recent keys; the summaries are kept by write_kv as rows arrive (1/32 of a float32 K cache's bytes);
    prefill, and steps under a mask of the model's own, read every key. An approximation: the lab's
    long_context experiment measures its recall. Use with attn_implementation="attnlab"."""

    def __init__(self, config=None, kv_dtype="f32", block=0, max_cache_len=None, decode_kernel="auto",
                 threads=None, topk_tokens=0, topk_sinks=0, topk_recent=0):
        make = lambda: LabLayer(kv_dtype, block, max_cache_len, decode_kernel, threads,  # noqa: E731
                                topk_tokens, topk_sinks, topk_recent)
        make()  # the arguments' checks, before any model runs
        if config is not None:
            layers = config.get_text_config(decoder=True).num_hidden_layers
            super().__init__(layers=[make() for _ in range(layers)])
        else:
            super().__init__(layer_class_to_replicate=make)
        self.kv_dtype, self.block = kv_dtype, block

    def nbytes(self):
        """Bytes the layers' K and V storage holds (capacity, not only the tokens so far)."""
        return sum(t.numel() * t.element_size() for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values))
