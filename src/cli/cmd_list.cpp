// attnlab list: every kernel, what it is, whether it can run here, and per kernel the
// instruction-set targets it is built for, the ones this CPU runs and the one it uses by
// default (include/attnlab/isa.hpp); above the table, the CPU's features and cache sizes.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "attnlab/auto.hpp"
#include "attnlab/isa.hpp"
#include "attnlab/kernel.hpp"
#include "common.hpp"

namespace attnlab::cli {

namespace {

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// A kernel's capabilities in a few words (kernel.hpp's Capabilities): "sparse" patterns, "dv" (d_v != d),
// "quant" / "int-codes" caches, "paged", "bwd" (backward), the limits (q<=16, d<=128); "interval"
// for none of them.
std::string runs_what(const Capabilities& c) {
  std::vector<std::string> w;
  if (c.patterns) w.push_back("sparse");
  if (c.head_dim_v) w.push_back("dv");
  if (c.kv_quant) w.push_back(c.kv_int_codes_only ? "int-codes" : "quant");
  if (c.paged) w.push_back("paged");
  if (c.backward) w.push_back("bwd");
  if (c.max_q_len > 0) w.push_back("q<=" + std::to_string(c.max_q_len));
  if (c.max_head_dim > 0) w.push_back("d<=" + std::to_string(c.max_head_dim));
  return w.empty() ? "interval" : join(w, ",");
}

std::string kib(int64_t bytes) {
  if (bytes <= 0) return "?";
  std::ostringstream s;
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    s << (bytes >> 20) << " MiB";
  } else {
    s << (bytes >> 10) << " KiB";
  }
  return s.str();
}

}  // namespace

Command add_list(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("list", "list the kernels, whether each is available here, and their targets");
  return {sub, [] {
            const CacheSizes& c = cache();
            const std::string def = default_isa();  // a bad ATTN_ISA fails before anything is printed
            std::cout << "CPU features: " << cpu_isa_features() << "\n"
                      << "caches: L1d " << kib(c.l1d) << ", L2 " << kib(c.l2) << ", L3 " << kib(c.l3) << " ("
                      << c.source << "); tiles planned for L2 " << kib(planning_l2_bytes()) << "\n"
                      << "targets built: " << join(built_isas(), ", ")
                      << "; this CPU runs: " << join(runnable_isas(), ", ") << "; default: " << def
                      << " (--isa NAME or ATTN_ISA=NAME to force one)\n\n";
            // Columns as wide as their longest entry (plus two spaces): a long name or precision
            // never runs into the next column.
            size_t name_w = 12, prec_w = 58, caps_w = 14;
            for (const Kernel* k : registry()) {
              name_w = std::max(name_w, k->name().size() + 2);
              prec_w = std::max(prec_w, k->precision().size() + 2);
              caps_w = std::max(caps_w, runs_what(k->capabilities()).size() + 2);
            }
            const auto nw = static_cast<int>(name_w), pw = static_cast<int>(prec_w), cw = static_cast<int>(caps_w);
            std::cout << std::left << std::setw(nw) << "kernel" << std::setw(11) << "available" << std::setw(22)
                      << "targets" << std::setw(22) << "runs here" << std::setw(13) << "default" << std::setw(pw)
                      << "precision (storage in; compute)" << std::setw(cw) << "runs"
                      << "description\n";
            for (const Kernel* k : registry()) {
              const Support a = k->available();
              std::vector<std::string> runs;
              const std::vector<std::string> targets = kernel_isas(k->name());
              for (const auto& t : targets) {
                const Kernel* v = find_kernel(k->name(), t);
                if (v && v->available()) runs.push_back(t);
              }
              std::cout << std::left << std::setw(nw) << k->name() << std::setw(11) << (a ? "yes" : "no")
                        << std::setw(22) << join(targets, ",") << std::setw(22)
                        << (runs.empty() ? "-" : join(runs, ",")) << std::setw(13) << k->isa() << std::setw(pw)
                        << k->precision() << std::setw(cw) << runs_what(k->capabilities()) << k->description();
              if (!a) std::cout << "  [unavailable: " << a.reason << "]";
              std::cout << "\n";
            }
            std::cout << "\nkernel \"auto\" (attnlab run / verify --impl auto, attnlab.attention's default): the first "
                         "row that holds, its first candidate that runs the problem here\n"
                      << auto_table();
            return 0;
          }};
}

}  // namespace attnlab::cli
