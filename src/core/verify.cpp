// The float64 reference, the agreement metric and the tolerance policy (see verify.hpp).
#include "attnlab/verify.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "attnlab/kv_quant.hpp"
#include "attnlab/blocks/kv_read.hpp"
#include "attnlab/blocks/textbook.hpp"

namespace attnlab {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// f(problem, inputs) on the cache as the reference reads it, made here once: a paged cache copied
// into an independent contiguous one (unpage_kv), a quantized one read back as float32 by its
// writer's rule (dequantize_kv); p and in themselves when the cache is neither.
template <class F>
decltype(auto) with_plain_cache(const Problem& p, const Inputs& in, F&& f) {
  if (!p.kv_paged() && !p.kv_quantized()) return f(p, in);
  const Problem* q = &p;
  const Inputs* i = &in;
  std::optional<UnpagedKv> unpaged;
  std::optional<DequantizedKv> dequantized;
  if (q->kv_paged()) unpaged.emplace(unpage_kv(*q, *i)), q = &unpaged->problem, i = &unpaged->inputs;
  if (q->kv_quantized())
    dequantized.emplace(dequantize_kv(*q, *i)), q = &dequantized->problem, i = &dequantized->inputs;
  return f(*q, *i);
}

void accumulate(Errors& e, const Reference& ref, size_t r, const float* o_row, const float* lse) {
  const double* want = &ref.o[r * ref.dim];
  // A row whose reference is NaN has a NaN scale (its inputs hold NaN); its finite elements are
  // then compared absolutely, so that no NaN reaches the max below (std::max and `>` drop it).
  const double row_scale = ref.row_scale[r];
  const double scale = std::isnan(row_scale) ? 1.0 : std::max(row_scale, 1e-30);
  double worst_abs = 0;
  for (int64_t d = 0; d < ref.dim; ++d) {
    worst_abs = std::max(worst_abs, value_error(o_row[d], want[d]));
  }
  e.o_abs = std::max(e.o_abs, worst_abs);
  // A non-finite/finite mismatch (value_error's kInf) stays infinite whatever the scale.
  const double rel = worst_abs == 0 ? 0.0 : (std::isinf(worst_abs) ? kInf : worst_abs / scale);
  if (r == 0 || rel > e.o_rel) {
    e.o_rel = std::max(e.o_rel, rel);
    e.worst = ref.rows[r];
  }
  if (lse) {
    e.lse_checked = true;
    double err = value_error(*lse, ref.lse[r]);
    if (std::isfinite(err)) err /= std::max(1.0, std::fabs(ref.lse[r]));
    e.lse = std::max(e.lse, err);
  }
}
}  // namespace

std::vector<RowId> all_rows(const Problem& p) {
  std::vector<RowId> rows;
  rows.reserve(static_cast<size_t>(p.batch * p.q_heads * p.q_len));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h)
      for (int64_t i = 0; i < p.q_len; ++i) rows.push_back({b, h, i});
  return rows;
}

std::vector<RowId> sample_rows(const Problem& p, size_t max_rows, uint64_t seed) {
  const int64_t total = p.batch * p.q_heads * p.q_len;
  if (static_cast<size_t>(total) <= max_rows) return all_rows(p);
  std::set<std::tuple<int64_t, int64_t, int64_t>> picked;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h) {
      picked.insert({b, h, 0});
      picked.insert({b, h, p.q_len - 1});
    }
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  while (picked.size() < max_rows) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const int64_t idx = static_cast<int64_t>(s % static_cast<uint64_t>(total));
    picked.insert({idx / (p.q_heads * p.q_len), (idx / p.q_len) % p.q_heads, idx % p.q_len});
  }
  std::vector<RowId> rows;
  for (auto& [b, h, i] : picked) rows.push_back({b, h, i});
  return rows;
}

double value_error(double got, double want) {
  if (std::isnan(want) && std::isnan(got)) return 0.0;
  if (std::isinf(want) && got == want) return 0.0;
  if (!std::isfinite(got) || !std::isfinite(want)) return kInf;
  return std::fabs(got - want);
}

std::vector<int64_t> reference_keys(const Problem& p, const RowId& r) {
  std::vector<int64_t> keys;
  if (p.sparse()) {
    Pattern(p).keys(r.b, r.h, r.i, keys);
  } else {
    const Interval iv = p.visible(r.b, r.i);
    for (int64_t j = iv.lo; j < iv.hi; ++j) keys.push_back(j);
  }
  return keys;
}

namespace {

template <class E>
double reference_row_typed(const Problem& p, const TypedInputs<E>& in, const RowId& r, double* o_row,
                           double* row_scale) {
  const int64_t d_n = p.head_dim, dv_n = p.dim_v();
  const int64_t hk = p.kv_head_of(r.h);
  const std::vector<int64_t> keys = reference_keys(p, r);
  std::fill(o_row, o_row + dv_n, 0.0);
  *row_scale = 0.0;
  // A sink logit (score_mod.hpp) is one more term of the denominator: the max starts there.
  const double sink = p.sink_logit(r.h);
  if (keys.empty()) return sink;  // -inf without a sink logit
  const double scale = p.effective_scale();
  const ScoreMod mod = p.score_mod(r.b, r.h, r.i);
  const E* q = in.q.row(r.b, r.h, r.i);
  std::vector<double> s(keys.size());
  double m = sink;
  for (size_t x = 0; x < keys.size(); ++x) {
    const E* k = in.k.row(r.b, hk, keys[x]);
    double dot = 0;
    for (int64_t d = 0; d < d_n; ++d) dot += static_cast<double>(to_float(q[d])) * to_float(k[d]);
    const double sj = mod(scale * dot, keys[x]);
    s[x] = sj;
    if (!(sj <= m)) m = sj;  // a NaN score makes m NaN, and the whole row NaN
  }
  double l = sink == -kInf ? 0.0 : std::exp(sink - m), scale_sum = 0;
  for (size_t x = 0; x < keys.size(); ++x) {
    const double pj = std::exp(s[x] - m);
    l += pj;
    const E* v = in.v.row(r.b, hk, keys[x]);
    double vmax = 0;
    for (int64_t d = 0; d < dv_n; ++d) {
      const double vd = to_float(v[d]);
      o_row[d] += pj * vd;
      vmax = std::max(vmax, std::fabs(vd));
    }
    scale_sum += pj * vmax;
  }
  for (int64_t d = 0; d < dv_n; ++d) o_row[d] /= l;
  *row_scale = scale_sum / l;
  return m + std::log(l);
}
}  // namespace

// On the values the kernel receives: 16-bit storage widened exactly, then float64.
double reference_row(const Problem& p, const Inputs& in, const RowId& r, double* o_row, double* row_scale) {
  if (p.kv_quantized() || p.kv_paged())
    throw std::logic_error("reference_row: a quantized or paged cache; read it with dequantize_kv / unpage_kv first");
  return visit_inputs(in, [&](const auto& typed) { return reference_row_typed(p, typed, r, o_row, row_scale); });
}

Reference reference(const Problem& p, const Inputs& in, std::vector<RowId> rows) {
  if (p.kv_paged() || p.kv_quantized()) {
    return with_plain_cache(p, in, [&](const Problem& q, const Inputs& i) { return reference(q, i, std::move(rows)); });
  }
  Reference ref;
  ref.dim = p.dim_v();
  ref.rows = std::move(rows);
  ref.o.resize(ref.rows.size() * static_cast<size_t>(ref.dim));
  ref.lse.resize(ref.rows.size());
  ref.row_scale.resize(ref.rows.size());
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    ref.lse[r] = reference_row(p, in, ref.rows[r], &ref.o[r * ref.dim], &ref.row_scale[r]);
  }
  return ref;
}

Errors measure(const Reference& ref, const ConstView& o, const float* lse, const Problem& p) {
  Errors e;
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    const RowId& id = ref.rows[r];
    const float* l = lse ? lse + (id.b * p.q_heads + id.h) * p.q_len + id.i : nullptr;
    accumulate(e, ref, r, o.row(id.b, id.h, id.i), l);
  }
  return e;
}

namespace {
// Q as Arithmetic::Int8Products multiplies it: each row rounded by round_q_row (kv_quant.hpp) for
// the cache's type and read back as q * scale; a row with a NaN or Inf as it is (the kernel
// multiplies such a row unrounded). Contiguous (batch, heads, seq, dim) float32.
std::vector<float> int8_rounded_q(const Problem& p, const ConstView& q) {
  std::vector<float> out(static_cast<size_t>(q.batch * q.heads * q.seq * q.dim));
  std::vector<int8_t> codes(static_cast<size_t>(q.dim));
  std::vector<float> scales(static_cast<size_t>(q.dim));
  const int64_t block = q_block_values(p.kv_dtype, q.dim);
  float* dst = out.data();
  for (int64_t b = 0; b < q.batch; ++b)
    for (int64_t h = 0; h < q.heads; ++h)
      for (int64_t i = 0; i < q.seq; ++i, dst += q.dim) {
        const float* row = q.row(b, h, i);
        if (!round_q_row(p.kv_dtype, row, q.dim, codes.data(), scales.data())) {
          std::copy(row, row + q.dim, dst);
          continue;
        }
        for (int64_t d = 0; d < q.dim; ++d) dst[d] = static_cast<float>(codes[d]) * scales[d / block];
      }
  return out;
}

// K as flash_int8 multiplies it: per (batch, kv head), the sequence's keys smoothed by their mean
// and rounded per row (key_mean, round_smoothed_key: kv_quant.hpp), read back as q * scale - the
// remainder; the kernel adds q.mean to each score after its integer dot product, and so does the
// baseline (int8_dense_errors), so a mean that dwarfs the remainder costs both the same float32
// cancellation. A head whose keys hold NaN or Inf (or overflow when centred) keeps them as they
// are (smoothed[head] false), and the keys past a batch entry's kv_len too. Contiguous (batch,
// kv heads, seq, dim) float32.
struct SmoothedK {
  std::vector<float> k, mean;  // mean: (batch, kv heads, dim)
  std::vector<uint8_t> smoothed;
};
SmoothedK int8_smoothed_k(const Problem& p, const ConstView& k) {
  SmoothedK out;
  out.k.resize(static_cast<size_t>(k.batch * k.heads * k.seq * k.dim));
  out.mean.assign(static_cast<size_t>(k.batch * k.heads * k.dim), 0.f);
  out.smoothed.assign(static_cast<size_t>(k.batch * k.heads), 0);
  std::vector<int8_t> codes(static_cast<size_t>(k.dim));
  for (int64_t b = 0; b < k.batch; ++b)
    for (int64_t h = 0; h < k.heads; ++h) {
      float* head = out.k.data() + (b * k.heads + h) * k.seq * k.dim;
      float* mean = out.mean.data() + (b * k.heads + h) * k.dim;
      for (int64_t j = 0; j < k.seq; ++j) std::copy(k.row(b, h, j), k.row(b, h, j) + k.dim, head + j * k.dim);
      const int64_t n = p.kv_len_of(b);
      if (!key_mean(k.row(b, h, 0), k.stride_s, n, k.dim, mean)) continue;
      std::vector<float> rounded(static_cast<size_t>(n * k.dim));
      bool all = true;
      for (int64_t j = 0; j < n && all; ++j) {
        float scale = 0.f;
        all = round_smoothed_key(k.row(b, h, j), mean, k.dim, codes.data(), &scale);
        for (int64_t d = 0; d < k.dim; ++d) rounded[j * k.dim + d] = static_cast<float>(codes[d]) * scale;
      }
      if (!all) continue;
      std::copy(rounded.begin(), rounded.end(), head);
      out.smoothed[b * k.heads + h] = 1;
    }
  return out;
}

ConstView contiguous_view(const std::vector<float>& data, const ConstView& like) {
  return ConstView{data.data(),         like.batch, like.heads, like.seq, like.dim, like.heads * like.seq * like.dim,
                   like.seq * like.dim, like.dim};
}

// V as flash_int8's whole tiles multiply it on a VNNI CPU: per (batch, kv head), the sequence's
// value rows rounded per channel (round_v_channels, kv_quant.hpp); a head holding NaN or Inf keeps
// its V as it is (rounded[head] false). codes: (batch, kv heads, seq, dim_v), zero past kv_len.
struct RoundedV {
  std::vector<int8_t> codes;
  std::vector<float> scale;  // (batch, kv heads, dim_v)
  std::vector<uint8_t> rounded;
  int64_t seq = 0, dv = 0;
  const int8_t* row(int64_t head, int64_t j) const { return codes.data() + (head * seq + j) * dv; }
};
RoundedV int8_rounded_v(const Problem& p, const ConstView& v) {
  RoundedV out;
  out.seq = v.seq, out.dv = v.dim;
  out.codes.assign(static_cast<size_t>(v.batch * v.heads * v.seq * v.dim), 0);
  out.scale.assign(static_cast<size_t>(v.batch * v.heads * v.dim), 0.f);
  out.rounded.assign(static_cast<size_t>(v.batch * v.heads), 0);
  for (int64_t b = 0; b < v.batch; ++b)
    for (int64_t h = 0; h < v.heads; ++h) {
      const int64_t head = b * v.heads + h;
      out.rounded[head] = round_v_channels(v.row(b, h, 0), v.stride_s, p.kv_len_of(b), v.dim,
                                           out.codes.data() + head * v.seq * v.dim, out.scale.data() + head * v.dim);
    }
  return out;
}

// flash_int8's P.V on a VNNI CPU (int8_dot.hpp: pv_tile_u8), the row's weights s (n, in place)
// against V as stored: on every 64-key tile the row sees whole, P rounded to u8 codes by
// round_p_tile (against the tile's largest weight: the kernel's running max cancels) times V's
// codes and channel scales; the other keys unrounded. Like decode_i8's baseline, each row is
// charged one code across a half (the kernel's weights differ from these by float32 roundoff):
// flip gets the largest quantum x |V code x scale| of its rounded tiles, over l. Returns the LSE.
float u8_softmax_pv(float* s, const View4<const float>& v, const RoundedV& rv, int64_t b, int64_t hk,
                    const std::vector<int64_t>& keys, float* o, double* flip, float sink) {
  const int64_t n = static_cast<int64_t>(keys.size()), dv = rv.dv, head = b * v.heads + hk;
  constexpr int64_t kTile = 64;
  std::fill(o, o + dv, 0.f);
  *flip = 0;
  if (n == 0) return sink;
  float m = 0.f;
  const float l = textbook::exp_shifted(s, n, &m, sink);
  std::vector<double> acc(static_cast<size_t>(dv), 0.0);
  const float* vs = rv.scale.data() + head * dv;
  int32_t codes[kTile];
  for (int64_t x = 0; x < n;) {
    const int64_t j = keys[x];
    float quantum = 0.f;
    if (j % kTile == 0 && x + kTile <= n && keys[x + kTile - 1] == j + kTile - 1 &&
        round_p_tile(s + x, kTile, false, codes, &quantum)) {
      for (int64_t y = 0; y < kTile; ++y) {
        const int8_t* c = rv.row(head, j + y);
        for (int64_t i = 0; i < dv; ++i) {
          const double u = static_cast<double>(c[i]) * vs[i];
          acc[i] += static_cast<double>(quantum) * codes[y] * u;
          *flip = std::max(*flip, static_cast<double>(quantum) * std::fabs(u));
        }
      }
      x += kTile;
      continue;
    }
    const float* vr = v.row(b, hk, j);
    for (int64_t i = 0; i < dv; ++i) acc[i] += static_cast<double>(s[x]) * vr[i];
    ++x;
  }
  for (int64_t i = 0; i < dv; ++i) o[i] = static_cast<float>(acc[i] / l);
  *flip /= l;
  return m + std::log(l);
}

// flash_int8's baseline: the textbook's scores on Q rounded and K's smoothed remainder, plus
// scale * q.mean (Q rounded, summed in float32 as the kernel does), then its softmax and P.V; a row
// whose Q does not round, or whose head's keys were not smoothed, the textbook on its inputs as
// they are (the kernel's task multiplies them in float32: rounding Q there would turn an Inf
// product into 0 * Inf).
// bf16_pv (Int8Bf16Products): P and V rounded to bf16 for P.V on the rows that score in integers;
// else (Int8Products) P to u8 and V per channel on their whole tiles (u8_softmax_pv).
Errors int8_dense_errors(const Problem& p, const Inputs& in, Inputs rounded, const Reference& ref, bool bf16_pv) {
  const SmoothedK k = int8_smoothed_k(p, in.k);
  const RoundedV rv = bf16_pv ? RoundedV{} : int8_rounded_v(p, in.v);
  rounded.k = contiguous_view(k.k, in.k);
  std::vector<float> v;
  if (bf16_pv) {
    v.resize(static_cast<size_t>(in.v.batch * in.v.heads * in.v.seq * in.v.dim));
    float* dst = v.data();
    for (int64_t b = 0; b < in.v.batch; ++b)
      for (int64_t h = 0; h < in.v.heads; ++h)
        for (int64_t j = 0; j < in.v.seq; ++j)
          for (int64_t c = 0; c < in.v.dim; ++c) *dst++ = to_float(to_bf16(in.v.row(b, h, j)[c]));
    rounded.v = contiguous_view(v, in.v);
  }
  Errors e;
  std::vector<float> s(static_cast<size_t>(p.kv_len)), o(static_cast<size_t>(p.dim_v()));
  std::vector<int8_t> codes(static_cast<size_t>(p.head_dim));
  const TypedInputs<float> original = typed<float>(in), smoothed = typed<float>(rounded);
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    const RowId& id = ref.rows[r];
    const int64_t hk = p.kv_head_of(id.h);
    float scale = 0.f;
    const bool int8 = k.smoothed[id.b * p.kv_heads + hk] &&
                      round_q_row(KvDType::Same, in.q.row(id.b, id.h, id.i), p.head_dim, codes.data(), &scale);
    const std::vector<int64_t> keys = reference_keys(p, id);
    const textbook::KeyList list{keys.data(), static_cast<int64_t>(keys.size())};
    float lse = 0.f;
    if (!int8) {
      lse = textbook::row(p, original, id.b, id.h, id.i, list, s.data(), o.data());
    } else {
      textbook::scores(smoothed.q.row(id.b, id.h, id.i), smoothed.k, id.b, hk, list, p.effective_scale(), s.data());
      const float* mean = k.mean.data() + (id.b * p.kv_heads + hk) * p.head_dim;
      float qm = 0.f;
      for (int64_t d = 0; d < p.head_dim; ++d) qm += static_cast<float>(codes[d]) * mean[d];
      const float shift = qm * scale * p.effective_scale();
      // The kernel rounds each score of this split (an integer sum times two scales, plus the
      // shift: up to 3 roundings of values as large as |s| + |shift|) in another order than the
      // textbook here, so where the mean dwarfs the remainder the two cancel differently. Its
      // bound, not this baseline's luck, is what the row costs: 3 units of float32 roundoff of
      // the largest such magnitude, in the score and hence the LSE; exp(2 bound) - 1 in O.
      double big = 0;
      for (size_t x = 0; x < keys.size(); ++x) {
        big = std::max(big, std::fabs(static_cast<double>(s[x])) + std::fabs(static_cast<double>(shift)));
        s[x] += shift;
      }
      // The score modifications on the scaled integer scores, as the kernel's softmax applies them
      // (softcap's slope is at most 1: the bound below still holds).
      textbook::modify(p.score_mod(id.b, id.h, id.i), list, s.data());
      const float sink = p.sink_logit(id.h);
      const double bound = 3.0 * std::numeric_limits<float>::epsilon() / 2 * big;
      if (!bf16_pv && rv.rounded[id.b * p.kv_heads + hk]) {
        double flip = 0;
        lse = u8_softmax_pv(s.data(), smoothed.v, rv, id.b, hk, keys, o.data(), &flip, sink);
        Errors row;
        accumulate(row, ref, r, o.data(), &lse);
        const double at = std::isnan(ref.row_scale[r]) ? 1.0 : std::max(ref.row_scale[r], 1e-30);
        row.o_rel += flip / at;
        if (row.o_rel > e.o_rel) e.worst = id;
        e.o_rel = std::max(e.o_rel, row.o_rel);
        e.o_abs = std::max(e.o_abs, row.o_abs);
        e.lse = std::max(e.lse, row.lse);
        e.lse_checked = e.lse_checked || row.lse_checked;
      } else {
        lse = textbook::softmax_pv(s.data(), smoothed.v, id.b, hk, list, o.data(), bf16_pv, sink);
        accumulate(e, ref, r, o.data(), &lse);
      }
      if (std::isfinite(ref.lse[r])) e.lse = std::max(e.lse, bound / std::max(1.0, std::fabs(ref.lse[r])));
      e.o_rel = std::max(e.o_rel, std::min(2.0, std::expm1(2 * bound)));
      continue;
    }
    accumulate(e, ref, r, o.data(), &lse);
  }
  return e;
}

// Key j's V code in units of its scale (value = scale x unit): u8 / u4 c - zp, q8_0 c, q4_0 nibble - 8.
double v_unit(KvDType t, const std::byte* row, int64_t i) {
  const auto* u = reinterpret_cast<const uint8_t*>(row);
  switch (t) {
    case KvDType::U8: return static_cast<double>(u[8 + i]) - kv_read::load_f32(row + 4);
    case KvDType::U4:
      return static_cast<double>(i % 2 ? u[8 + i / 2] >> 4 : u[8 + i / 2] & 0x0f) - kv_read::load_f32(row + 4);
    case KvDType::Q8_0: return static_cast<int8_t>(u[i / 32 * 34 + 2 + i % 32]);
    case KvDType::Q4_0: {
      const uint8_t* blk = u + i / 32 * 18 + 2;
      const int64_t y = i % 32;
      return (y < 16 ? blk[y] & 0x0f : blk[y - 16] >> 4) - 8;
    }
    default: throw std::logic_error("v_unit: not an integer cache");
  }
}
double v_scale_of(KvDType t, const std::byte* row, int64_t block) {
  if (t == KvDType::U8 || t == KvDType::U4) return kv_read::load_f32(row);
  return kv_read::scale_f16(row + block * (t == KvDType::Q8_0 ? 34 : 18));
}

// decode_i8's baseline on an integer cache: the textbook's scores on Q rounded (int8_rounded_q)
// against the cache as stored, its softmax, and P.V with P rounded as the kernel rounds it - on
// every 64-key tile the row sees whole, per V scale block, P times V's scales by round_p_tile
// (kv_quant.hpp), each code then multiplying V's code (v_unit) by its quantum; the other keys
// unrounded. The rule rounds against the tile's largest weight, so the kernel's running max does
// not change the codes - but its scores differ from these by float32 roundoff, which can move a
// code across a half: each row is charged one such code (its tile's quantum times the largest
// |unit|), on top of the error it makes here. A kernel panel whose other rows do not see the tile
// whole multiplies it unrounded, a subset of this baseline's rounding.
Errors int8_cache_errors(const Problem& p, const Inputs& in, const Reference& ref) {
  const DequantizedKv dq = dequantize_kv(p, in);
  const TypedInputs<float> f = typed<float>(dq.inputs);
  const KvDType t = p.kv_dtype;
  const int64_t dv = p.dim_v(), nblk = (t == KvDType::U8 || t == KvDType::U4) ? 1 : dv / 32;
  const int64_t span = (t == KvDType::U8 || t == KvDType::U4) ? dv : 32;
  constexpr int64_t kTile = 64;
  Errors e;
  std::vector<float> s(static_cast<size_t>(p.kv_len));
  std::vector<double> o(static_cast<size_t>(dv));
  std::vector<float> of(static_cast<size_t>(dv));
  std::vector<float> w(static_cast<size_t>(nblk * kTile)), quantum(static_cast<size_t>(nblk));
  std::vector<int32_t> codes(static_cast<size_t>(nblk * kTile));
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    const RowId& id = ref.rows[r];
    const int64_t hk = p.kv_head_of(id.h);
    const std::vector<int64_t> keys = reference_keys(p, id);
    const int64_t n = static_cast<int64_t>(keys.size());
    std::fill(o.begin(), o.end(), 0.0);
    float lse = p.sink_logit(id.h);  // a row without keys: -inf, or the sink logit alone
    double flip = 0;  // one code across a half, at the largest quantum x |unit| of the row's rounded tiles
    if (n > 0) {
      const textbook::KeyList list{keys.data(), n};
      textbook::scores(f.q.row(id.b, id.h, id.i), f.k, id.b, hk, list, p.effective_scale(), s.data());
      textbook::modify(p.score_mod(id.b, id.h, id.i), list, s.data());
      float m = 0.f;
      const float l = textbook::exp_shifted(s.data(), n, &m, p.sink_logit(id.h));
      for (int64_t x = 0; x < n;) {
        const int64_t j = keys[x];
        const bool whole = j % kTile == 0 && x + kTile <= n && keys[x + kTile - 1] == j + kTile - 1;
        bool rounded = whole;
        for (int64_t b = 0; b < nblk && rounded; ++b) {
          for (int64_t y = 0; y < kTile; ++y) {
            w[b * kTile + y] = s[x + y] * static_cast<float>(v_scale_of(t, in.vq.row(id.b, hk, j + y), b));
          }
          rounded = round_p_tile(&w[b * kTile], kTile, p_codes_signed(t), &codes[b * kTile], &quantum[b]);
        }
        if (!rounded) {  // a key as it is
          const float* vr = f.v.row(id.b, hk, j);
          for (int64_t i = 0; i < dv; ++i) o[i] += static_cast<double>(s[x]) * vr[i];
          ++x;
          continue;
        }
        for (int64_t y = 0; y < kTile; ++y) {
          const std::byte* vr = in.vq.row(id.b, hk, j + y);
          for (int64_t i = 0; i < dv; ++i) {
            const int64_t b = i / span;
            const double u = v_unit(t, vr, i);
            o[i] += static_cast<double>(quantum[b]) * codes[b * kTile + y] * u;
            flip = std::max(flip, static_cast<double>(quantum[b]) * std::fabs(u));
          }
        }
        x += kTile;
      }
      for (int64_t i = 0; i < dv; ++i) o[i] /= l;
      flip /= l;
      lse = m + std::log(l);
    }
    for (int64_t i = 0; i < dv; ++i) of[i] = static_cast<float>(o[i]);
    Errors row;
    accumulate(row, ref, r, of.data(), &lse);
    const double scale = std::isnan(ref.row_scale[r]) ? 1.0 : std::max(ref.row_scale[r], 1e-30);
    row.o_rel += flip / scale;
    if (r == 0 || row.o_rel > e.o_rel) e.worst = id;
    e.o_rel = std::max(e.o_rel, row.o_rel);
    e.o_abs = std::max(e.o_abs, row.o_abs);
    e.lse = std::max(e.lse, row.lse);
    e.lse_checked = true;
  }
  return e;
}
}  // namespace

Errors baseline_errors(const Problem& p, const Inputs& in, const Reference& ref, Arithmetic arithmetic) {
  if (arithmetic == Arithmetic::Int8Products || arithmetic == Arithmetic::Int8Bf16Products) {
    // Integer K: a q8_0, q4_0, u8 or u4 cache's codes as stored (decode_i8), or a dense float32
    // K smoothed and rounded (flash_int8). A kernel of this arithmetic refuses the other
    // problems (fp8 caches, other dtypes), which then multiply as the textbook.
    const bool cache = p.kv_quantized() && kv_int_dot(p.kv_dtype);
    if ((!cache && p.kv_quantized()) || in.dtype != DType::F32) return baseline_errors(p, in, ref, Arithmetic::F32);
    if (!cache && p.kv_paged()) {
      const UnpagedKv u = unpage_kv(p, in);
      return baseline_errors(u.problem, u.inputs, ref, arithmetic);
    }
    const std::vector<float> q = int8_rounded_q(p, in.q);
    Inputs rounded = in;
    rounded.q = contiguous_view(q, in.q);
    if (cache) {
      if (!p.kv_paged()) return int8_cache_errors(p, rounded, ref);
      const UnpagedKv u = unpage_kv(p, rounded);
      return int8_cache_errors(u.problem, u.inputs, ref);
    }
    return int8_dense_errors(p, in, rounded, ref, arithmetic == Arithmetic::Int8Bf16Products);
  }
  if (p.kv_paged() || p.kv_quantized()) {
    return with_plain_cache(p, in,
                            [&](const Problem& q, const Inputs& i) { return baseline_errors(q, i, ref, arithmetic); });
  }
  const bool round_p = arithmetic == Arithmetic::Bf16Products;
  Errors e;
  std::vector<float> s(static_cast<size_t>(p.kv_len)), o(static_cast<size_t>(p.dim_v()));
  visit_inputs(in, [&](const auto& typed) {
    for (size_t r = 0; r < ref.rows.size(); ++r) {
      const RowId& id = ref.rows[r];
      const std::vector<int64_t> keys = reference_keys(p, id);
      const float lse =
          textbook::row(p, typed, id.b, id.h, id.i, textbook::KeyList{keys.data(), static_cast<int64_t>(keys.size())},
                        s.data(), o.data(), round_p);
      accumulate(e, ref, r, o.data(), &lse);
    }
  });
  return e;
}

Tolerance Tolerance::from_baseline(const Errors& baseline, double o_floor) {
  Tolerance t;
  // A NaN row in the inputs makes the baseline infinite; keep the tolerance finite so the
  // check stays meaningful for the other rows.
  const double o = std::isfinite(baseline.o_rel) ? baseline.o_rel : 0.0;
  const double l = std::isfinite(baseline.lse) ? baseline.lse : 0.0;
  t.o_rel = kFactor * o + o_floor;
  t.lse = kFactor * l + kFloor;
  return t;
}

// Only by a finite error: an expected file with a NaN/finite mismatch already fails on its own,
// and an infinite widening would let every kernel pass against it.
Tolerance Tolerance::widened_by(const Errors& external) const {
  Tolerance t = *this;
  if (std::isfinite(external.o_rel)) t.o_rel += external.o_rel;
  if (std::isfinite(external.lse)) t.lse += external.lse;
  return t;
}

bool Tolerance::passes(const Errors& e) const { return why_failed(e).empty(); }

std::string Tolerance::why_failed(const Errors& e) const {
  std::ostringstream s;
  if (!(e.o_rel <= o_rel)) {
    s << "O error " << e.o_rel << " (relative to row scale) > tolerance " << o_rel << " at row (b=" << e.worst.b
      << ", h=" << e.worst.h << ", i=" << e.worst.i << ")";
  }
  if (e.lse_checked && !(e.lse <= lse)) {
    if (s.tellp() > 0) s << "; ";
    s << "LSE error " << e.lse << " > tolerance " << lse;
  }
  return s.str();
}

}  // namespace attnlab

namespace attnlab {

Agreement prepare_agreement(const Problem& p, const Inputs& in, std::vector<RowId> rows) {
  if (p.topk()) {
    throw InvalidInput("topk_tokens " + std::to_string(p.topk_tokens) +
                       ": an approximation is judged by the recall and O's error of its pages (kv_summary.hpp's "
                       "selection_accuracy), not by the float64 agreement rule");
  }
  if (p.kv_paged() || p.kv_quantized()) {  // made once for both: a quantized cache agrees on its dequantized K/V
    return with_plain_cache(
        p, in, [&](const Problem& q, const Inputs& i) { return prepare_agreement(q, i, std::move(rows)); });
  }
  Agreement a;
  a.ref = reference(p, in, std::move(rows));
  a.baseline = baseline_errors(p, in, a.ref, Arithmetic::F32);
  a.tol = Tolerance::from_baseline(a.baseline);
  return a;
}

Tolerance tolerance_for(Arithmetic arithmetic, const Problem& p, const Inputs& in, const Agreement& a) {
  if (arithmetic == Arithmetic::F32) return a.tol;
  // Int8Products: float32's floor; the rounding of Q, K and (whole tiles, flash_int8 and decode_i8) P and V
  // is in the baseline.
  const double floor = arithmetic == Arithmetic::Int8Products ? Tolerance::kFloor : Tolerance::kFloorBf16P;
  return Tolerance::from_baseline(baseline_errors(p, in, a.ref, arithmetic), floor).widened_by(a.widen);
}

Tolerance tolerance_for(const Kernel& k, const Problem& p, const Inputs& in, const Agreement& a) {
  return tolerance_for(k.arithmetic(), p, in, a);
}

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::Pass: return "PASS";
    case Verdict::Fail: return "FAIL";
    case Verdict::Skip: return "SKIP";
  }
  return "?";
}

// allocate_outputs: O and LSE.
size_t check_output_bytes(const Problem& p) {
  return allocated_bytes(static_cast<size_t>(p.o_elems()) * sizeof(float)) +
         allocated_bytes(static_cast<size_t>(p.lse_elems()) * sizeof(float));
}

size_t verification_bytes(const Kernel& k, const Problem& p, size_t rows, int threads) {
  const size_t total_rows = static_cast<size_t>(p.batch * p.q_heads * p.q_len);
  const size_t n = std::min(rows, total_rows);
  const size_t dim = static_cast<size_t>(p.dim_v()), kv = static_cast<size_t>(p.kv_len);
  // sample_rows: a std::set node per row (3 int64 + ~32 bytes of tree links) and a vector
  // that may double while it grows.
  const size_t sampling = n * (64 + 2 * sizeof(RowId));
  // Reference: per row its id, head_dim_v doubles of O, LSE and row scale.
  const size_t reference = n * (sizeof(RowId) + (dim + 2) * sizeof(double));
  // reference_row's scores (doubles) and baseline_errors' scores and O row (floats).
  const size_t row_scratch = kv * sizeof(double) + (kv + dim) * sizeof(float);
  // A quantized cache is read back as float32 K and V for the reference (dequantize_kv).
  const size_t dequantized =
      p.kv_quantized() ? allocated_bytes(static_cast<size_t>(p.kv_elems() + p.v_elems()) * sizeof(float)) : 0;
  // A paged cache is copied into a contiguous one first (unpage_kv).
  const size_t unpaged = p.kv_paged() ? unpaged_bytes(p) : 0;
  // A topk point (check_topk): the problem masked to its chosen pages, one byte per (b, h, i, j), and a
  // second O and LSE for the dense comparison.
  const size_t masked =
      p.topk() ? static_cast<size_t>(p.batch * p.q_heads * p.q_len * p.kv_len) + check_output_bytes(p) : 0;
  return sampling + reference + row_scratch + dequantized + unpaged + masked + check_output_bytes(p) +
         allocated_bytes(k.workspace_bytes(p, threads)) + kVerifyBookkeeping;
}

KernelCheck check_kernel(const Kernel& k, const Problem& p, const Inputs& in, const Agreement& a, int threads) {
  KernelCheck c;
  c.kernel = std::string(k.name());
  if (Support s = can_run(k, p, threads); !s) {
    c.reason = s.reason;
    return c;
  }
  // Outputs only, not a second Q, K, V: check_output_bytes is what this allocates.
  Tensors out = allocate_outputs(p);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::fill(out.o.get(), out.o.get() + p.o_elems(), nan);
  std::fill(out.lse.get(), out.lse.get() + p.lse_elems(), nan);
  Session session(k, p, threads);
  session.run(in, out.outputs);
  c.errors = measure(a.ref, as_const(out.outputs.o), out.outputs.lse, p);
  c.tol = tolerance_for(k, p, in, a);
  c.reason = c.tol.why_failed(c.errors);
  c.verdict = c.reason.empty() ? Verdict::Pass : Verdict::Fail;
  return c;
}

}  // namespace attnlab
