// Page summaries, bounds, the page choice and its accuracy (include/attnlab/kv_summary.hpp).
#include "attnlab/kv_summary.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <utility>

#include "attnlab/kv_quant.hpp"

namespace attnlab {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Row j of sequence b, kv head hk of K (key) or V, `dim` values as the cache reads them back.
void read_row(const Problem& p, const Inputs& in, bool key, int64_t b, int64_t hk, int64_t j, float* out) {
  const int64_t dim = key ? p.head_dim : p.dim_v();
  const std::byte* row = nullptr;
  if (in.kv != KvDType::Same) {
    row = kv_row(key ? in.kq : in.vq, in.pages, b, hk, j);
  } else if (in.dtype == DType::F32) {
    row = reinterpret_cast<const std::byte*>(kv_row(key ? in.k : in.v, in.pages, b, hk, j));
  } else {
    row = reinterpret_cast<const std::byte*>(kv_row(key ? in.k16 : in.v16, in.pages, b, hk, j));
  }
  load_row(in.kv, in.dtype, row, dim, out, in.kv_scale);
}

// A float row of Q (any dtype), by the same read rule.
void read_q(const Problem& p, const Inputs& in, int64_t b, int64_t h, int64_t i, float* out) {
  const void* row = in.dtype == DType::F32 ? static_cast<const void*>(in.q.row(b, h, i)) : in.q16.row(b, h, i);
  load_row(KvDType::Same, in.dtype, static_cast<const std::byte*>(row), p.head_dim, out);
}

void refuse_unbounded(const Problem& p, const char* what) {
  if (p.sparse()) {
    throw InvalidInput(std::string(what) + ": a sparse pattern (" + p.pattern_name() +
                       "); allowed: interval masks (causal, window, kv_lens)");
  }
  if (p.score_mods()) {
    throw InvalidInput(std::string(what) + ": score modifications (" + p.score_mod_name() +
                       "); allowed: none (the page bound is on the scaled dot product)");
  }
}

}  // namespace

KvSummary make_summary(const Problem& p) {
  KvSummary s;
  s.batch = p.batch, s.kv_heads = p.kv_heads, s.pages = summary_stored_pages(p.kv_len), s.dim = p.head_dim;
  s.own = alloc_floats(s.floats());
  clear_summary(s);
  return s;
}

void clear_summary(KvSummary& s) {
  const int64_t half = s.dim * kSummaryBlockPages;
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t hk = 0; hk < s.kv_heads; ++hk)
      for (int64_t k = 0; k < s.blocks(); ++k) {
        std::fill_n(s.block(b, hk, k), half, std::numeric_limits<float>::infinity());
        std::fill_n(s.block(b, hk, k) + half, half, -std::numeric_limits<float>::infinity());
      }
}

void page_extent(const KvSummary& s, int64_t b, int64_t hk, int64_t page, float* mn, float* mx) {
  for (int64_t x = 0; x < s.dim; ++x) mn[x] = s.lo(b, hk, page, x), mx[x] = s.hi(b, hk, page, x);
}

void summary_add_key(KvSummary& s, int64_t b, int64_t hk, int64_t j, const float* k) {
  if (b < 0 || b >= s.batch || hk < 0 || hk >= s.kv_heads || j < 0 || j / kSummaryPageKeys >= s.pages) {
    throw InvalidInput("summary_add_key: key " + std::to_string(j) + " of sequence " + std::to_string(b) +
                       ", kv head " + std::to_string(hk) + " is outside the summary (" + std::to_string(s.batch) +
                       " sequences, " + std::to_string(s.kv_heads) + " kv heads, " +
                       std::to_string(s.pages * kSummaryPageKeys) + " keys)");
  }
  const int64_t page = j / kSummaryPageKeys;
  for (int64_t x = 0; x < s.dim; ++x) {
    float& mn = s.lo(b, hk, page, x);
    float& mx = s.hi(b, hk, page, x);
    // A NaN value makes both ends NaN (std::min / std::max would drop it on one side).
    if (std::isnan(k[x])) {
      mn = mx = k[x];
    } else if (!std::isnan(mn)) {
      mn = std::min(mn, k[x]);
      mx = std::max(mx, k[x]);
    }
  }
}

void read_key(const Problem& p, const Inputs& in, int64_t b, int64_t hk, int64_t j, float* k) {
  read_row(p, in, true, b, hk, j, k);
}

KvSummary summarize_keys(const Problem& p, const Inputs& in) {
  KvSummary s = make_summary(p);
  std::vector<float> k(static_cast<size_t>(p.head_dim));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.kv_heads; ++hk)
      for (int64_t j = 0; j < p.kv_len_of(b); ++j) {
        read_key(p, in, b, hk, j, k.data());
        summary_add_key(s, b, hk, j, k.data());
      }
  return s;
}

void attach_summary(const Problem& p, Tensors& t) {
  t.summary = std::make_shared<KvSummary>(summarize_keys(p, t.inputs));
  t.inputs.summary = t.summary.get();
}

void split_query(const float* q, int64_t d, float* pos, float* neg) {
  for (int64_t x = 0; x < d; ++x) pos[x] = q[x] > 0.f ? q[x] : 0.f, neg[x] = q[x] < 0.f ? q[x] : 0.f;
}

float page_bound(const float* pos, const float* neg, const float* mn, const float* mx, int64_t d) {
  float acc = 0.f;
  for (int64_t x = 0; x < d; ++x) acc = std::fma(neg[x], mn[x], std::fma(pos[x], mx[x], acc));
  return acc;
}

void page_scores_reference(const float* split, int64_t group, int64_t d, const float* blocks, int64_t pages,
                           float* best) {
  std::vector<float> mn(static_cast<size_t>(d)), mx(static_cast<size_t>(d));
  for (int64_t x = 0; x < pages; ++x) {
    const float* block = blocks + x / kSummaryBlockPages * 2 * d * kSummaryBlockPages;
    for (int64_t y = 0; y < d; ++y) {
      mn[y] = block[y * kSummaryBlockPages + x % kSummaryBlockPages];
      mx[y] = block[(d + y) * kSummaryBlockPages + x % kSummaryBlockPages];
    }
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t g = 0; g < group; ++g) {
      const float u = page_bound(split + 2 * g * d, split + (2 * g + 1) * d, mn.data(), mx.data(), d);
      if (std::isnan(u)) {  // (a NaN stays)
        m = u;
        break;
      }
      m = std::max(m, u);
    }
    best[x] = m;
  }
}

AlwaysPages always_pages(int64_t n, const PageBudget& budget) {
  const int64_t pages = summary_pages(n);
  return {summary_pages(std::min(budget.sink_tokens, n)),
          budget.recent_tokens > 0 ? std::max<int64_t>(0, n - budget.recent_tokens) / kSummaryPageKeys : pages};
}

std::vector<int64_t> choose_pages(const std::vector<double>& score, int64_t n, const PageBudget& budget) {
  const int64_t pages = summary_pages(n);
  if (static_cast<int64_t>(score.size()) < pages) {
    throw InvalidInput("choose_pages: " + std::to_string(score.size()) + " scores for " + std::to_string(pages) +
                       " pages of " + std::to_string(n) + " keys");
  }
  std::vector<char> chosen(static_cast<size_t>(pages), 0);
  int64_t used = 0;
  const auto take = [&](int64_t x) {
    if (chosen[x]) return;
    chosen[x] = 1;
    used += std::min(kSummaryPageKeys, n - x * kSummaryPageKeys);
  };
  if (budget.tokens <= 0) {
    for (int64_t x = 0; x < pages; ++x) take(x);
  } else {
    const AlwaysPages always = always_pages(n, budget);
    for (int64_t x = 0; x < always.sink_end; ++x) take(x);
    for (int64_t x = always.recent_begin; x < pages; ++x) take(x);
    std::vector<int64_t> order(static_cast<size_t>(pages));
    std::iota(order.begin(), order.end(), int64_t{0});
    // NaN first, then decreasing score, ties to the earlier page: a total order.
    const auto key = [&](int64_t x) { return std::isnan(score[x]) ? kInf : score[x]; };
    const auto before = [&](int64_t a, int64_t c) { return key(a) > key(c) || (key(a) == key(c) && a < c); };
    // Only the head of the order can be taken: the full pages that fit, past the ones already chosen, and
    // the last page (the one that may be short) wherever it ranks.
    const int64_t always_taken = always.sink_end + (pages - always.recent_begin);
    const int64_t head = std::min(pages, budget.tokens / kSummaryPageKeys + always_taken + 1);
    std::partial_sort(order.begin(), order.begin() + head, order.end(), before);
    const auto offer = [&](int64_t x) {
      const int64_t size = std::min(kSummaryPageKeys, n - x * kSummaryPageKeys);
      if (!chosen[x] && used + size <= budget.tokens) take(x);
    };
    for (int64_t r = 0; r < head; ++r) offer(order[r]);
    offer(pages - 1);  // (after the head, only a short last page can still fit)
  }
  std::vector<int64_t> out;
  for (int64_t x = 0; x < pages; ++x)
    if (chosen[x]) out.push_back(x);
  return out;
}

std::vector<double> group_page_scores(const Problem& p, const Inputs& in, const KvSummary& s, int64_t b, int64_t hk,
                                      int64_t i, PageScorer scorer) {
  refuse_unbounded(p, "group_page_scores");
  const int64_t pages = summary_pages(p.kv_len_of(b)), d = p.head_dim, group = p.group();
  // The group's queries split once; then each page's summary is read once for all of them.
  std::vector<float> q(static_cast<size_t>(d)), split(static_cast<size_t>(2 * group * d));
  for (int64_t g = 0; g < group; ++g) {
    read_q(p, in, b, hk * group + g, i, q.data());
    split_query(q.data(), d, split.data() + 2 * g * d, split.data() + (2 * g + 1) * d);
  }
  std::vector<float> best(static_cast<size_t>(pages));
  scorer(split.data(), group, d, s.block(b, hk, 0), pages, best.data());
  std::vector<double> score(static_cast<size_t>(pages));
  const double scale = p.effective_scale();
  for (int64_t x = 0; x < pages; ++x) score[x] = scale * best[x];
  return score;
}

std::vector<int64_t> topk_pages(const Problem& p, const Inputs& in, int64_t b, int64_t hk, PageScorer scorer) {
  if (!in.summary) {
    throw InvalidInput("topk_tokens " + std::to_string(p.topk_tokens) +
                       ": the inputs hold no page summaries (Inputs::summary; kv_summary.hpp's summarize_keys, or "
                       "summary_add_key as rows are stored)");
  }
  const KvSummary& s = *in.summary;
  if (s.batch != p.batch || s.kv_heads != p.kv_heads || s.dim != p.head_dim || s.pages < summary_pages(p.kv_len)) {
    throw InvalidInput("summary: " + std::to_string(s.batch) + " sequences x " + std::to_string(s.kv_heads) +
                       " kv heads x " + std::to_string(s.pages) + " pages of head_dim " + std::to_string(s.dim) +
                       "; allowed: the problem's (" + p.describe() + ")");
  }
  std::vector<double> score;
  for (int64_t i = 0; i < p.q_len; ++i) {
    const std::vector<double> si = group_page_scores(p, in, s, b, hk, i, scorer);
    if (score.empty()) {
      score = si;
      continue;
    }
    for (size_t x = 0; x < score.size(); ++x) {
      if (!std::isnan(score[x]) && (std::isnan(si[x]) || si[x] > score[x])) score[x] = si[x];
    }
  }
  return choose_pages(score, p.kv_len_of(b), {p.topk_tokens, p.topk_sinks, p.topk_recent});
}

SelectionAccuracy selection_accuracy(const Problem& p, const Inputs& in, const RowId& r,
                                     const std::vector<int64_t>& pages) {
  refuse_unbounded(p, "selection_accuracy");
  const Interval iv = p.visible(r.b, r.i);
  const int64_t hk = p.kv_head_of(r.h), d = p.head_dim, dv = p.dim_v();
  std::vector<float> q(static_cast<size_t>(d)), k(static_cast<size_t>(d)), v(static_cast<size_t>(dv));
  read_q(p, in, r.b, r.h, r.i, q.data());
  std::vector<char> in_pages(static_cast<size_t>(summary_pages(p.kv_len)), 0);
  for (const int64_t x : pages) {
    if (x >= 0 && x < static_cast<int64_t>(in_pages.size())) in_pages[x] = 1;
  }
  const int64_t n = std::max<int64_t>(0, iv.hi - iv.lo);
  std::vector<double> s(static_cast<size_t>(n));
  double m_all = -kInf, m_sel = -kInf;
  for (int64_t j = iv.lo; j < iv.hi; ++j) {
    read_key(p, in, r.b, hk, j, k.data());
    double dot = 0;
    for (int64_t x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
    const double sj = p.effective_scale() * dot;
    s[j - iv.lo] = sj;
    m_all = std::max(m_all, sj);
    if (in_pages[j / kSummaryPageKeys]) m_sel = std::max(m_sel, sj);
  }
  std::vector<double> o_all(static_cast<size_t>(dv), 0.0), o_sel(static_cast<size_t>(dv), 0.0);
  double l_all = 0, l_sel = 0, mass = 0;
  for (int64_t j = iv.lo; j < iv.hi; ++j) {
    const bool sel = in_pages[j / kSummaryPageKeys];
    const double e_all = std::exp(s[j - iv.lo] - m_all), e_sel = sel ? std::exp(s[j - iv.lo] - m_sel) : 0.0;
    read_row(p, in, false, r.b, hk, j, v.data());
    for (int64_t x = 0; x < dv; ++x) {
      o_all[x] += e_all * v[x];
      o_sel[x] += e_sel * v[x];
    }
    l_all += e_all, l_sel += e_sel;
    if (sel) mass += e_all;
  }
  SelectionAccuracy a;
  if (n == 0) return {1.0, 0.0};  // nothing visible: the choice leaves nothing out
  a.recall = mass / l_all;
  double diff = 0, norm = 0;
  for (int64_t x = 0; x < dv; ++x) {
    const double os = l_sel > 0 ? o_sel[x] / l_sel : 0.0, od = o_all[x] / l_all;
    diff += (os - od) * (os - od);
    norm += od * od;
  }
  a.o_rel_error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return a;
}

Problem masked_to_pages(const Problem& p, const Inputs& in) {
  Problem m = p;
  m.topk_tokens = m.topk_sinks = m.topk_recent = 0;
  auto mask = std::make_shared<BoolMask>();
  mask->batch = p.batch, mask->heads = p.q_heads, mask->q_len = p.q_len, mask->kv_len = p.kv_len;
  mask->data.assign(static_cast<size_t>(p.batch * p.q_heads * p.q_len * p.kv_len), 0);
  mask->source = "topk_pages";
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t hk = 0; hk < p.kv_heads; ++hk)
      for (const int64_t page : topk_pages(p, in, b, hk)) {
        const int64_t lo = page * kSummaryPageKeys, hi = std::min(p.kv_len, lo + kSummaryPageKeys);
        for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
          for (int64_t i = 0; i < p.q_len; ++i) {
            uint8_t* row = mask->data.data() + static_cast<size_t>(((b * p.q_heads + h) * p.q_len + i) * p.kv_len);
            std::fill(row + lo, row + hi, uint8_t{1});
          }
      }
  m.mask = std::move(mask);
  m.validate();
  return m;
}

namespace {

// A kernel's run on the topk problem presented as a kernel of the masked problem, so check_kernel judges
// its outputs by that problem's reference and the kernel's own arithmetic class.
class AsMasked final : public Kernel {
 public:
  AsMasked(const Kernel& k, const Problem& topk) : k_(k), topk_(topk) {}
  std::string_view name() const override { return k_.name(); }
  std::string_view description() const override { return "a topk run judged as its masked problem"; }
  const Capabilities& capabilities() const override { return k_.capabilities(); }
  Support supports(const Problem&) const override { return Support::yes(); }
  size_t workspace_bytes(const Problem&, int threads) const override { return k_.workspace_bytes(topk_, threads); }
  void run(const Problem&, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    Session(k_, topk_, ctx.threads).run(in, out);
  }

 private:
  const Kernel& k_;
  Problem topk_;
};

}  // namespace

TopkCheck check_topk(const Kernel& k, const Problem& p, const Inputs& in, const std::vector<RowId>& rows, int threads) {
  TopkCheck c;
  c.exact.kernel = std::string(k.name());
  if (Support s = can_run(k, p, threads); !s) {
    c.exact.reason = s.reason;
    return c;
  }
  const Problem m = masked_to_pages(p, in);
  c.exact = check_kernel(AsMasked(k, p), m, in, prepare_agreement(m, in, rows), threads);
  Problem dense = p;
  dense.topk_tokens = dense.topk_sinks = dense.topk_recent = 0;
  Tensors out = allocate_outputs(p);
  Session(k, p, threads).run(in, out.outputs);
  c.err_dense = measure(reference(dense, in, rows), as_const(out.outputs.o), out.outputs.lse, dense).o_rel;
  // Recall per row, from the pages its (sequence, kv head) chose.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> chosen;
  double sum = 0;
  c.recall_min = 1.0;
  for (const RowId& r : rows) {
    const auto key = std::pair{r.b, p.kv_head_of(r.h)};
    if (!chosen.count(key)) chosen[key] = topk_pages(p, in, key.first, key.second);
    const double recall = selection_accuracy(p, in, r, chosen[key]).recall;
    c.recall_min = std::min(c.recall_min, recall);
    sum += recall;
  }
  c.recall_mean = rows.empty() ? 1.0 : sum / static_cast<double>(rows.size());
  return c;
}

}  // namespace attnlab
