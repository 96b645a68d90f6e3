// The one operation the lab measures, described precisely (docs/operation.md):
//
//   O[b,h,i,:]  = sum_j P[b,h,i,j] * V[b,g(h),j,:]         (Q, K: head_dim; V, O: head_dim_v)
//   P[b,h,i,:]  = softmax_j(scale * <Q[b,h,i,:], K[b,g(h),j,:]>) over visible j
//   LSE[b,h,i]  = log sum_j exp(scale * <Q, K>) over visible j   (natural log)
//
// g(h) = h / (q_heads / kv_heads). Without a sparse pattern the visible keys of a row form ONE
// interval [lo, hi), computed by Problem::visible() and nowhere else; with one (sinks, global
// positions, documents, dilation, BigBird, a mask file) the rule is Pattern::visible()
// (pattern.hpp). A fully masked row gives O = 0 and LSE = -inf.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnlab/dtype.hpp"
#include "attnlab/blocks/interval.hpp"
#include "attnlab/blocks/score_mod.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/pattern.hpp"

namespace attnlab {

// Raised for any problem, file or argument the lab refuses. The message names the
// field, the bad value and the allowed values.
struct InvalidInput : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Raised when the system refuses a write (full disk, read-only or missing folder, I/O
// error): not the user's input. The message names the file and the errno text.
struct IoError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Memory order of Q, K, V and O. The last dimension (head_dim) is always contiguous.
enum class Layout {
  BHSD,  // (batch, heads, seq, head_dim)
  BSHD,  // (batch, seq, heads, head_dim)
};

const char* to_string(Layout layout);
Layout parse_layout(const std::string& text);  // "bhsd" | "bshd"; throws InvalidInput

const char* to_string(CausalAlign causal);

// Which computation of the operation a problem asks for (a sweep's `pass` axis): the forward
// (O, LSE), the backward (dQ, dK, dV from dO and the forward's O and LSE; backward.hpp), or both
// in turn (attention's share of a training step). Kernels compute whatever they are asked;
// a Session made for a problem whose pass is not the forward runs the backward too.
enum class Pass { Forward, Backward, ForwardBackward };
const char* to_string(Pass pass);          // "forward", "backward", "forward_backward"
Pass parse_pass(const std::string& text);  // throws InvalidInput naming the field

struct Problem {
  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t q_len = 1;
  int64_t kv_len = 1;
  int64_t head_dim = 64;   // of Q and K
  int64_t head_dim_v = 0;  // of V and O; 0 = head_dim (MLA: d_qk 192 / d_v 128)
  CausalAlign causal = CausalAlign::None;
  int64_t window_left = -1;      // -1 = unbounded
  int64_t window_right = -1;     // -1 = unbounded
  std::vector<int64_t> kv_lens;  // empty, or one entry per batch in [0, kv_len]
  std::optional<float> scale;    // default 1/sqrt(head_dim)
  Layout layout = Layout::BHSD;
  DType dtype = DType::F32;  // storage of Q, K and V (O and LSE are float32)
  // K and V stored as `dtype`, or as a quantized cache (kv_quant.hpp: q8_0, q4_0, u8, u4,
  // fp8): then Q is float32 and every path reads the dequantized K/V.
  KvDType kv_dtype = KvDType::Same;
  // A paged cache (vLLM's and OpenVINO's PagedAttention): 0 = K and V contiguous per (batch, kv
  // head); else a pool of blocks of kv_block tokens (each block all kv heads, the problem's
  // layout inside it: (blocks, kv_heads, kv_block, d) for bhsd) and per batch entry a table of
  // block ids (Inputs::pages; tensor.hpp). A power of two, kMinKvBlock..kMaxKvBlock.
  int64_t kv_block = 0;
  // One cache tensor for K and V: V is the first head_dim_v columns of K's rows (DeepSeek's
  // absorbed MLA decode: d 576 = 512 latent + 64 rotary, d_v 512), so a token stores one row.
  bool kv_shared = false;
  Pass pass = Pass::Forward;  // a backward pass refuses quantized and paged caches (validate)
  // Sparse pattern terms (pattern.hpp); none set = the interval rule alone.
  int64_t sinks = 0;              // keys j < sinks are seen by every row (with a window)
  std::vector<int64_t> globals;   // global positions, ascending, distinct
  std::vector<int64_t> doc_lens;  // packed documents (sum = q_len = kv_len)
  int64_t dilation = 1;           // window keys at distances that are multiples of it
  BigBird bigbird;
  std::shared_ptr<const BoolMask> mask;  // a mask file (True = attend)
  // Score modifications (blocks/score_mod.hpp, docs/operation.md); none set = scaled dot products.
  // The standard ALiBi slopes and a sink logit for every head are resolved against q_heads where they
  // are read (a CLI's .npy files and Python's arrays give the heads after the terms are set).
  float softcap = 0.f;             // c > 0: s = c tanh(s / c); 0: none
  bool alibi_standard = false;     // ALiBi with the standard slopes for q_heads (standard_alibi_slope)
  std::vector<float> alibi;        // else per query head its ALiBi slope; empty (and not standard): none
  std::vector<float> sink_logits;  // per query head its sink logit, or one for every head; empty: none
  // Query-aware sparse decode (kv_summary.hpp; issue 66): 0 = dense. Else each (sequence, kv head)
  // attends exactly over the 64-key pages its query rows' summary bounds rank first, within
  // topk_tokens keys, always with the pages of the first topk_sinks and the last topk_recent keys
  // (topk_pages) - an approximation, judged by recall and O's error (selection_accuracy), not the
  // agreement rule. The inputs carry the cache's page summaries (Inputs::summary).
  int64_t topk_tokens = 0;
  int64_t topk_sinks = 0;
  int64_t topk_recent = 0;
  static constexpr int64_t kTopkPageKeys = 64;  // keys per page (kv_summary.hpp: one key tile)

  static constexpr int64_t kMinHeadDim = 1;
  static constexpr int64_t kMinKvBlock = 16, kMaxKvBlock = 256;
  // 512 covers every published per-head size but MLA's absorbed decode: 576 = 512 latent + 64 rotary.
  static constexpr int64_t kMaxHeadDim = 576;

  // Throws InvalidInput naming the field and the allowed values.
  void validate() const;

  int64_t dim_v() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  bool kv_quantized() const { return kv_dtype != KvDType::Same; }
  bool kv_paged() const { return kv_block > 0; }
  // A paged cache's block table: entries per batch entry (for kv_len keys), and the pool's
  // blocks (each entry's ceil(kv_len_of(b) / kv_block): a mixed-length batch stores what it uses).
  int64_t kv_table_len() const { return kv_paged() ? (kv_len + kv_block - 1) / kv_block : 0; }
  int64_t kv_pool_blocks() const;
  // Bytes of one stored K (dim = head_dim) or V (dim = dim_v()) row (a shared V's is a prefix of K's).
  int64_t kv_row_bytes(int64_t dim) const {
    return kv_quantized() ? attnlab::kv_row_bytes(kv_dtype, dim) : dim * dtype_bytes(dtype);
  }
  int64_t group() const { return q_heads / kv_heads; }  // query heads per kv head
  int64_t kv_head_of(int64_t h) const { return h / group(); }
  float effective_scale() const;
  int64_t kv_len_of(int64_t b) const { return kv_lens.empty() ? kv_len : kv_lens[b]; }
  // Whether a sparse pattern term is set (then visible() is only the causal/window part and
  // Pattern decides).
  bool sparse() const {
    return sinks > 0 || !globals.empty() || !doc_lens.empty() || dilation > 1 || bigbird.on() || mask;
  }
  std::string pattern_name() const;  // "sinks4+global16+...", "" without sparse terms
  // Whether a score modification is set (then a kernel needs Capabilities::score_mods).
  bool has_alibi() const { return alibi_standard || !alibi.empty(); }
  bool score_mods() const { return softcap > 0.f || has_alibi() || !sink_logits.empty(); }
  // Head h's ALiBi slope (0 without ALiBi).
  float alibi_slope(int64_t h) const;
  // Row i of head h in batch b: its softcap, ALiBi slope and diagonal (MaskSpec::pos).
  ScoreMod score_mod(int64_t b, int64_t h, int64_t i) const {
    return {softcap, has_alibi() ? alibi_slope(h) : 0.f, mask_for_batch(b).pos(i)};
  }
  // Head h's sink logit, -inf without one.
  float sink_logit(int64_t h) const {
    if (sink_logits.empty()) return -std::numeric_limits<float>::infinity();
    return sink_logits.size() == 1 ? sink_logits[0] : sink_logits[h];
  }
  bool topk() const { return topk_tokens > 0; }
  // The keys a query-aware sparse decode reads at most of sequence b: whole pages within topk_tokens,
  // or the sinks' and recent keys' pages when they alone take more (kv_len_of(b) without a budget).
  // visible_pairs, kv_bytes and so FLOPs and bytes count these (and kv_bytes the summaries read).
  int64_t topk_keys(int64_t b) const;
  std::string score_mod_name() const;  // "softcap30_alibi_sink6f0129fb" (a hash of the logits), "" without
  MaskSpec mask_for_batch(int64_t b) const;
  // The visible key interval of query row i in batch b (interval problems).
  Interval visible(int64_t b, int64_t i) const { return mask_for_batch(b).row(i); }

  // Counted once, here; every report and benchmark uses these.
  int64_t visible_pairs() const;  // sum over (b, h, i) of visible keys
  double forward_flops() const;   // 2 * (head_dim + head_dim_v) * visible_pairs
  // Of the problem's pass: forward_flops(), x 2.5 for the backward (FlashAttention's
  // convention: five n^2 GEMMs against the forward's two), x 3.5 for both.
  double flops() const;
  // Compulsory bytes of the pass. Forward: Q, K, V (once per kv head) at their storage size,
  // float32 O and LSE. Backward: Q, K, V, float32 O, dO and LSE read, float32 dQ, dK, dV
  // written. Both: the two sums.
  double bytes_moved() const;
  double kv_bytes() const;  // the K and V part of bytes_moved()
  // K and V bytes one token adds to a KV cache of this layer (one batch entry, all kv heads):
  // kv_heads * (head_dim + head_dim_v) * the stored element size (kv_shared: head_dim only).
  double kv_bytes_per_token() const;

  int64_t q_elems() const { return batch * q_heads * q_len * head_dim; }
  int64_t o_elems() const { return batch * q_heads * q_len * dim_v(); }
  int64_t kv_elems() const { return batch * kv_heads * kv_len * head_dim; }  // of K
  int64_t v_elems() const { return batch * kv_heads * kv_len * dim_v(); }
  int64_t lse_elems() const { return batch * q_heads * q_len; }

  std::string describe() const;  // one line, for tables and error messages
};

// ALiBi's standard slopes for n heads (Press et al.; BLOOM's build_alibi_tensor): for n a power of
// two 2^(-8k/n), k = 1..n; else those of the power of two p below n, then every other slope of 2p's.
std::vector<float> alibi_slopes(int64_t heads);
float standard_alibi_slope(int64_t h, int64_t heads);  // alibi_slopes(heads)[h]

// Q, K and V given as arrays - the CLI's .npy files, the Python module's arrays: the one rule
// from their shapes to a problem's sizes, with the errors both give.
// "(2, 8, 64)": how errors show an array's shape (numpy's tuple, "(5,)" for one dimension).
std::string shape_text(const std::vector<int64_t>& shape);
// An array Q, K or V must be: 4-D in layout's order (bhsd: batch, heads, seq, dim; bshd: batch,
// seq, heads, dim), no dimension 0. InvalidInput naming it (`name`: "q", "k.npy") otherwise.
void check_array_shape(const std::string& name, const std::vector<int64_t>& shape, Layout layout);
struct ArrayShapes {
  std::vector<int64_t> q, k, v;
  std::string q_name = "q", k_name = "k", v_name = "v";
  bool raw = false;   // K and V are a quantized cache's rows: their last dimension counts bytes
  bool pool = false;  // K and V are a paged cache's pool: their first dimension counts blocks
};
// Checks the three shapes (check_array_shape, then V = K's shape but for the last dimension, K's
// batch and head_dim = Q's but where raw or pool says otherwise) and sets p's batch, q_heads,
// q_len, head_dim, head_dim_v (0 when V's last dimension is Q's), kv_heads and kv_len (a pool's:
// its block size; the caller sets kv_len from its block table) in p.layout's order.
void size_from_arrays(Problem& p, const ArrayShapes& a);

}  // namespace attnlab
