// kernel "auto" (include/attnlab/auto.hpp): one table, rows in order, the first row whose regime holds
// names the candidates; the first candidate that can run the problem here (can_run: available on this
// CPU, supports it, fits the memory budget) is the choice, else the fallback ladder. Every row rests on
// committed paired runs, named in it; a CPU or shape none of them measured is said to be unmeasured.
#include "attnlab/auto.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "attnlab/isa.hpp"
#include "attnlab/kv_quant.hpp"
#include "cpu/dispatch/isa_internal.hpp"

namespace attnlab {
namespace {

enum class Regime { Backward, DecodeIntCache, Decode, PrefillBf16, PrefillInt8, Prefill };

struct Row {
  Regime regime;
  const char* when;
  std::vector<const char*> candidates;
  const char* evidence;
};

// q_len <= 16 against a longer cache: decode's range (decode.cpp: kMaxQLen).
bool decode_shape(const Problem& p) { return p.q_len <= 16 && p.q_len < p.kv_len; }

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
      {Regime::Backward,
       "a backward pass",
       {"flash"},
       "flash's backward is the lab's tiled one (flash.cpp; naive's is the textbook's); "
       "results/2026-12-05-training_paired"},
      {Regime::DecodeIntCache,
       "decode (q_len <= 16 < kv_len) on a q8_0, q4_0, u8 or u4 cache",
       {"decode_i8", "decode"},
       "results/2026-12-05-narrow (the AMX Xeon, AVX512_VNNI, 2 threads): decode_i8 1.05-2.1x decode's speed at "
       "32/8 (4k-128k), 32/2 and 32/32 on all four; its error against float64 on the unrounded inputs 1.0-1.4x "
       "decode's (the cache's rounding dominates: q4_0/u4 1.0x, q8_0/u8 1.2-1.4x), so under either arithmetic. "
       "Only where its target's VNNI unit runs (without it decode_i8's P.V stays float32 and its K.Q is "
       "vpmaddubsw: not measured ahead of decode); more than 16 rows per kv head (MQA 32/1) it refuses"},
      {Regime::Decode,
       "decode (q_len <= 16 < kv_len), any other cache",
       {"decode", "flash"},
       "results/2026-12-06-decode_roofline (Zen 4, 2 threads: flash 0.96-1.09x decode's speed at q_len 1 on float "
       "caches - the same tile engine; decode first because it splits the keys into tasks, so the cores fill "
       "when batch x kv heads is below their count, where flash has one task per (batch, kv head))"},
      {Regime::PrefillBf16,
       "prefill, bf16 inputs (arithmetic native or int8)",
       {"flash_amx", "flash_bf16", "flash"},
       "results/2026-12-05-prefill_peers (the AMX Xeon: flash_amx 3.6-5.3x flash, while flash_bf16 there ran "
       "0.70-0.72x flash - AMX comes first); results/2026-12-06-prefill_peers-3 (Zen 4, no AMX: flash_bf16 1.74-1.89x "
       "flash); a CPU with AVX512_BF16 and no AMX other than Zen 4 is unmeasured"},
      {Regime::PrefillInt8,
       "prefill, float32 inputs, arithmetic int8 allowed",
       {"flash_int8_amx", "flash_int8", "flash"},
       "results/2026-12-04-narrow_prefill-2 (the AMX Xeon: flash_int8_amx 1.7-4.8x flash, flash_int8 1.07-1.5x); "
       "results/2026-12-06-prefill_peers-3 (Zen 4: flash_int8 1.85-2.57x flash)"},
      {Regime::Prefill,
       "prefill, any other problem (float32 products)",
       {"flash"},
       "flash leads the float32 ladder in every committed sweep (e.g. results/2026-12-06-prefill_f32)"},
  };
  return rows;
}

// After the row's candidates: the rest of the ladder, fastest first.
const std::vector<const char*>& fallback() {
  static const std::vector<const char*> f = {"flash", "decode", "threaded", "simd", "blocked", "naive"};
  return f;
}

// A candidate's own condition beyond can_run: decode_i8 only where its target's vpdpbusd unit
// (AVX512-VNNI / AVX-VNNI: TargetTable's i8_unit) runs on this CPU - the only unit it was measured
// ahead of decode with (NEON's sdot, vpmaddubsw without VNNI: not measured). "" when it holds.
std::string unmet(const Kernel& k) {
  if (k.name() != "decode_i8") return "";
  const TargetTable* t = target_table_for(k.isa());
  if (t && t->peak.i8_unit && *t->peak.i8_unit && cpu_runs_isa(t->peak.i8_unit)) return "";
  return "no vpdpbusd unit for its target on this CPU (decode_i8 is measured ahead of decode only with one)";
}

bool holds(Regime r, const Problem& p, AutoArithmetic a) {
  const bool backward = p.pass != Pass::Forward;
  switch (r) {
    case Regime::Backward: return backward;
    case Regime::DecodeIntCache: return !backward && decode_shape(p) && p.kv_quantized() && kv_int_dot(p.kv_dtype);
    case Regime::Decode: return !backward && decode_shape(p);
    case Regime::PrefillBf16: return !backward && p.dtype == DType::BF16 && a != AutoArithmetic::F32;
    case Regime::PrefillInt8: return !backward && a == AutoArithmetic::Int8 && p.dtype == DType::F32;
    case Regime::Prefill: return true;
  }
  return false;
}

}  // namespace

AutoArithmetic parse_auto_arithmetic(const std::string& text) {
  if (text == "native") return AutoArithmetic::Native;
  if (text == "f32") return AutoArithmetic::F32;
  if (text == "int8") return AutoArithmetic::Int8;
  throw InvalidInput("arithmetic: '" + text +
                     "'; allowed: native (the inputs' own: bf16 products for bf16 inputs, else float32), f32 "
                     "(float32 products always), int8 (int8 products allowed for float32 inputs)");
}

std::string AutoChoice::describe() const {
  std::string s = kernel_label(*kernel) + " (" + rule;
  if (!passed_over.empty()) s += "; passed over: " + passed_over;
  return s + ")";
}

AutoChoice choose_kernel(const Problem& p, int threads, AutoArithmetic arithmetic) {
  const bool backward = p.pass != Pass::Forward;
  for (const Row& row : table()) {
    if (!holds(row.regime, p, arithmetic)) continue;
    AutoChoice c;
    c.rule = row.when;
    std::vector<const char*> order = row.candidates;
    for (const char* f : fallback()) {
      if (std::find(order.begin(), order.end(), std::string_view(f)) == order.end()) order.push_back(f);
    }
    std::string refusals;
    for (size_t i = 0; i < order.size(); ++i) {
      const Kernel* k = find_kernel(order[i]);
      if (k == nullptr) continue;  // (not in this build)
      Support s = can_run(*k, p, threads, backward);
      if (s && i < row.candidates.size()) {
        if (std::string why = unmet(*k); !why.empty()) s = Support::no(why);
      }
      if (s) {
        c.kernel = k;
        if (i >= row.candidates.size()) c.rule += ", the fallback ladder";
        return c;
      }
      const std::string why = kernel_label(*k) + ": " + s.reason;
      refusals += (refusals.empty() ? "" : "; ") + why;
      if (i < row.candidates.size()) c.passed_over += (c.passed_over.empty() ? "" : "; ") + why;
    }
    throw InvalidInput("impl: auto: no kernel runs this problem here: " + refusals);
  }
  throw std::logic_error("auto: the table's last row holds for every problem");
}

AutoChoice resolve_kernel(std::string_view name, std::string_view isa, const Problem& p, int threads,
                          AutoArithmetic arithmetic) {
  if (name != kAutoKernel) {
    AutoChoice c;
    c.kernel = &kernel_or_throw(name, isa);
    c.rule = "named";
    return c;
  }
  if (!isa.empty()) {
    throw InvalidInput("isa: '" + std::string(isa) +
                       "' with impl auto; allowed: no isa (auto runs each kernel's default target) or a named kernel");
  }
  return choose_kernel(p, threads, arithmetic);
}

std::string auto_table() {
  std::ostringstream out;
  int n = 1;
  for (const Row& row : table()) {
    out << n++ << ". " << row.when << ": ";
    for (size_t i = 0; i < row.candidates.size(); ++i) out << (i ? " > " : "") << row.candidates[i];
    out << "\n   evidence: " << row.evidence << "\n";
  }
  out << "then any kernel that runs it, in this order: ";
  for (size_t i = 0; i < fallback().size(); ++i) out << (i ? " > " : "") << fallback()[i];
  out << "\n";
  return out.str();
}

}  // namespace attnlab
