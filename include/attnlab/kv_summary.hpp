// Query-aware sparse decode's building blocks (issue 66; Quest, Tang et al. 2024): page summaries of a
// KV cache's keys, the bound they give a query's best score in a page, the choice of pages within a
// token budget, and what attending only the chosen pages costs against dense attention.
//
// A page is kSummaryPageKeys consecutive keys of one sequence and kv head - one tile of the tile
// engine and one 64-key entry of a block map, so a chosen page is a whole tile of the exact decode
// that follows. Its summary is the element-wise min and max of its keys as the cache's read rule
// gives them (load_row: f32, bf16, f16 widened, a quantized row dequantized), in float32:
// 2 x head_dim floats per 64 keys - 1/32 of a float32 K cache's bytes, 1/16 of a 16-bit one's,
// 1/8.5 of u8's (d 128: 136-byte rows), 1/4.5 of u4's (72-byte rows).
//
// For a query q the page's bound is u = sum_i max(q_i min_i, q_i max_i) = q+ . max + q- . min (q+ and
// q- its positive and negative parts): every key k of the page has q.k <= u (each term is the larger
// of the two ends of q_i times the interval k_i lies in), exactly in real arithmetic; computed in
// float32 (one chain of fused multiply-adds per page and query row, in element order: page_bound), so
// within float32 rounding, and to the same bits on every target. A NaN key makes its page's min or max NaN and its
// bound NaN (an infinite one may too): such a page ranks first (choose_pages), so a NaN the dense result has is not
// hidden by the choice whenever the budget reaches it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"

namespace attnlab {

inline constexpr int64_t kSummaryPageKeys = Problem::kTopkPageKeys;

inline constexpr int64_t kSummaryBlockPages = 16;

// Per (batch entry, kv head) its pages in blocks of kSummaryBlockPages, each block the pages' head_dim
// minima then their head_dim maxima, the page fastest: a C-order (batch, kv_heads, blocks, 2, head_dim,
// 16) float32 array. A SIMD scorer then holds 16 pages' bounds in the lanes of one vector (or two or
// four) and streams each block once (src/cpu/simd/page_bound.hpp). A page with no key yet: minima
// +inf, maxima -inf (never scored: group_page_scores takes the pages that hold keys). Its own memory
// (own: alloc_floats', huge pages advised - the scorer streams it, and a 4 KiB page would stop the
// hardware prefetcher every 4 KiB), or the caller's (external: a Python array that attnlab.write_kv keeps
// current and attention() reads in place).
struct KvSummary {
  int64_t batch = 0, kv_heads = 0, pages = 0, dim = 0;  // pages: whole blocks
  std::unique_ptr<float[], AlignedFree> own;
  float* external = nullptr;

  size_t floats() const { return static_cast<size_t>(batch * kv_heads * pages * 2 * dim); }
  const float* values() const { return base(); }  // floats() of them

  int64_t blocks() const { return pages / kSummaryBlockPages; }
  // Block k of (b, hk): 2 x dim x 16 floats.
  float* block(int64_t b, int64_t hk, int64_t k) { return base() + offset(b, hk, k); }
  const float* block(int64_t b, int64_t hk, int64_t k) const { return base() + offset(b, hk, k); }
  // The minimum and the maximum of dimension x over page `page`'s keys.
  float& lo(int64_t b, int64_t hk, int64_t page, int64_t x) { return at(b, hk, page, x); }
  float lo(int64_t b, int64_t hk, int64_t page, int64_t x) const { return at(b, hk, page, x); }
  float& hi(int64_t b, int64_t hk, int64_t page, int64_t x) { return at(b, hk, page, dim + x); }
  float hi(int64_t b, int64_t hk, int64_t page, int64_t x) const { return at(b, hk, page, dim + x); }
  size_t bytes() const { return floats() * sizeof(float); }

 private:
  float* base() { return external ? external : own.get(); }
  const float* base() const { return external ? external : own.get(); }
  size_t offset(int64_t b, int64_t hk, int64_t k) const {
    return static_cast<size_t>(((b * kv_heads + hk) * blocks() + k) * 2 * dim * kSummaryBlockPages);
  }
  float& at(int64_t b, int64_t hk, int64_t page, int64_t row) {
    return block(b, hk, page / kSummaryBlockPages)[row * kSummaryBlockPages + page % kSummaryBlockPages];
  }
  float at(int64_t b, int64_t hk, int64_t page, int64_t row) const {
    return block(b, hk, page / kSummaryBlockPages)[row * kSummaryBlockPages + page % kSummaryBlockPages];
  }
};

// Pages of n keys, and the pages a summary stores for them (whole blocks).
inline int64_t summary_pages(int64_t n) { return (n + kSummaryPageKeys - 1) / kSummaryPageKeys; }
inline int64_t summary_stored_pages(int64_t n) {
  return (summary_pages(n) + kSummaryBlockPages - 1) / kSummaryBlockPages * kSummaryBlockPages;
}
// Page `page`'s minima and maxima (dim floats each), gathered from its block.
void page_extent(const KvSummary& s, int64_t b, int64_t hk, int64_t page, float* mn, float* mx);

// An empty summary for p's cache (kv_len keys per sequence: every page without a key).
KvSummary make_summary(const Problem& p);
// Every page of s without a key (minima +inf, maxima -inf): a new summary's state.
void clear_summary(KvSummary& s);
// Folds key j of sequence b, kv head hk (head_dim floats as the cache reads it back) into its page:
// what the store path does when it appends a row, so a growing cache keeps its summaries current
// without a pass over the cache.
void summary_add_key(KvSummary& s, int64_t b, int64_t hk, int64_t j, const float* k);
// K row j of sequence b, kv head hk as the cache's read rule gives it (any dtype or quantized
// layout, contiguous or paged), into k (head_dim floats).
void read_key(const Problem& p, const Inputs& in, int64_t b, int64_t hk, int64_t j, float* k);
// The summary of every key a sequence holds (j < kv_len_of(b)), read from the cache.
KvSummary summarize_keys(const Problem& p, const Inputs& in);

// t's summaries read from its cache, kept by t (Tensors::summary) and named by t.inputs.summary: what
// random_tensors does for a topk problem; again after a test changes K in place.
void attach_summary(const Problem& p, Tensors& t);

// q's positive and negative parts (d floats each): pos_i = max(q_i, 0), neg_i = min(q_i, 0).
void split_query(const float* q, int64_t d, float* pos, float* neg);
// The bound on page (mn, mx) of the query split into pos, neg: pos . mx + neg . mn (NaN from a NaN key).
// Its arithmetic, the same bits on every target (this reference and the decode kernels' SIMD scorers,
// src/cpu/simd/page_bound.hpp): one accumulator from 0, acc = fma(pos_x, max_x, acc) then
// acc = fma(neg_x, min_x, acc) for x = 0 .. d-1. A vector holds 16 pages' chains in its lanes (the
// summary's blocks), never a horizontal sum. So the pages a kernel chooses are the pages topk_pages
// names on any target, and check_topk's masked problem is what the kernel computed.
float page_bound(const float* pos, const float* neg, const float* mn, const float* mx, int64_t d);

// A page scorer: for the first `pages` pages of the blocks at `blocks` (KvSummary::block(b, hk, 0): whole
// blocks, the last one's pages past `pages` computed and dropped) the largest page_bound over a group of
// `group` queries (split: per query its d positive then d negative parts), NaN when any is NaN, into
// best[pages]. page_scores_reference is page_bound's loop; each SIMD target has its own
// (TestProbes::page_scores), bit for bit the same (a NaN's payload aside).
using PageScorer = void (*)(const float* split, int64_t group, int64_t d, const float* blocks, int64_t pages,
                            float* best);
void page_scores_reference(const float* split, int64_t group, int64_t d, const float* blocks, int64_t pages,
                           float* best);

// Which pages of a sequence of n keys to attend: the pages holding the first sink_tokens keys and
// the last recent_tokens keys always, then the others in decreasing score (a NaN score first; ties
// to the earlier page) while whole pages fit in `tokens` (the sinks' and recent pages count too;
// tokens <= 0: every page). Ascending page indices.
struct PageBudget {
  int64_t tokens = 0;
  int64_t sink_tokens = 0;
  int64_t recent_tokens = 0;
};
std::vector<int64_t> choose_pages(const std::vector<double>& score, int64_t n, const PageBudget& budget);
// The pages always chosen of a sequence of n keys (a budget > 0): [0, sink_end) holds the first
// sink_tokens keys, [recent_begin, summary_pages(n)) the last recent_tokens - the one rule choose_pages
// and Problem::topk_keys (FLOPs, bytes) follow.
struct AlwaysPages {
  int64_t sink_end, recent_begin;
};
AlwaysPages always_pages(int64_t n, const PageBudget& budget);

// The page scores of query position i's rows in kv head hk's group (sequence b): per page, the
// largest bound over the group's query heads - one choice per group, so the group's K and V are read
// once - times the softmax scale. Sparse patterns and score modifications are refused (InvalidInput):
// a bound for them is not this one.
std::vector<double> group_page_scores(const Problem& p, const Inputs& in, const KvSummary& s, int64_t b, int64_t hk,
                                      int64_t i, PageScorer scorer = page_scores_reference);

// The pages a query-aware sparse decode (Problem::topk_tokens) attends for sequence b, kv head hk: by
// group_page_scores, the largest over the problem's query positions (one choice for all its rows, so
// K and V are read once), choose_pages with the problem's budget. Needs in.summary (InvalidInput
// naming it when absent).
std::vector<int64_t> topk_pages(const Problem& p, const Inputs& in, int64_t b, int64_t hk,
                                PageScorer scorer = page_scores_reference);

// What attending only `pages` does to row r, exactly (float64, the cache's values as read): recall, the
// softmax mass of the row's visible keys in those pages under the dense attention (1: nothing left
// out), and o_rel_error, |O_pages - O_dense| / |O_dense| (Euclidean norms; 0 for equal rows).
// Refuses what group_page_scores refuses.
struct SelectionAccuracy {
  double recall = 0;
  double o_rel_error = 0;
};
SelectionAccuracy selection_accuracy(const Problem& p, const Inputs& in, const RowId& r,
                                     const std::vector<int64_t>& pages);

// The problem masked to the pages topk_pages chose (a boolean mask over batch entry, query head, row
// and key; the budget off): a dense problem whose float64 reference is what a topk run computes exactly.
Problem masked_to_pages(const Problem& p, const Inputs& in);

// A query-aware sparse decode judged - the sweep's and verify's rule for an approximation:
//   exact: the kernel's run on p held, by check_kernel, to the float64 reference of masked_to_pages(p)
//          in the kernel's own arithmetic class (its exact part: a page dropped or merged twice fails);
//   recall_min, recall_mean: selection_accuracy's recall of the chosen pages over `rows`;
//   err_dense: the kernel's O against the dense float64 reference on `rows` (verify.hpp's o_rel, the
//              largest): what the choice and the arithmetic cost together - measured, never a verdict.
struct TopkCheck {
  KernelCheck exact;
  double recall_min = 0, recall_mean = 0;
  double err_dense = 0;
};
TopkCheck check_topk(const Kernel& k, const Problem& p, const Inputs& in, const std::vector<RowId>& rows, int threads);

}  // namespace attnlab
