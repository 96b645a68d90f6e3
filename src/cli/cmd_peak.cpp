// attnlab peak: the machine's float32 FMA throughput, streaming read bandwidth and vector
// exp throughput, for 1 thread and all threads, for every instruction-set target this CPU
// runs (or the ones --isa names) (src/peaks/peak.hpp says how).
#include <cstdio>
#include <iostream>

#include "attnlab/isa.hpp"
#include "attnlab/npy.hpp"
#include "peaks/peak.hpp"
#include "common.hpp"

namespace attnlab::cli {

namespace {
struct PeakArgs {
  std::string json;
  std::string threads;
  int repeats = 5;
  double buffer_mib = 512;
  double seconds = 0.1;
  IsaFlag isa;
};
}  // namespace

Command add_peak(CLI::App& app) {
  auto args = std::make_shared<PeakArgs>();
  CLI::App* sub = app.add_subcommand("peak", "measure FMA GFLOP/s, read GB/s and exp throughput (medians) per target");
  sub->add_option("--json", args->json, "also write the table as JSON to this file (atomically)");
  sub->add_option("--repeats", args->repeats, "runs per figure; the median is reported");
  sub->add_option("--threads", args->threads, "thread counts, comma separated (default: 1 and all cores)");
  sub->add_option("--buffer-mib", args->buffer_mib, "read-bandwidth buffer in MiB (far above the L3 size)");
  sub->add_option("--seconds", args->seconds, "target length of one FMA/exp run in seconds");
  args->isa.add_to(*sub, true);
  sub->footer(
      "--isa: the targets to measure (default: every target this CPU runs). One target is measured "
      "alone (it becomes the default); with several, the default target (ATTN_ISA, else the widest) is "
      "measured too: its read bandwidth is what % of read bandwidth is against.");
  return {sub, [args] {
            peaks::PeakOptions o;
            o.isas = args->isa.apply();
            if (o.isas.empty()) o.isas = runnable_isas();
            if (!args->threads.empty()) {
              for (int64_t t : parse_int_list("threads", args->threads)) o.threads.push_back(static_cast<int>(t));
            }
            if (args->buffer_mib < 1 || args->buffer_mib > 65536) {
              throw InvalidInput("buffer-mib: " + std::to_string(args->buffer_mib) +
                                 " is not allowed; allowed: 1 to 65536");
            }
            if (args->seconds <= 0 || args->seconds > 60) {
              throw InvalidInput("seconds: " + std::to_string(args->seconds) + " is not allowed; allowed: (0, 60]");
            }
            o.repeats = args->repeats;
            o.buffer_bytes = static_cast<size_t>(args->buffer_mib * (1 << 20));
            o.seconds_per_run = args->seconds;
            const peaks::Peaks peaks = peaks::measure_peaks(o);
            std::fputs(peaks::format_peaks(peaks).c_str(), stdout);
            if (!args->json.empty()) write_file_atomic(args->json, peaks.to_json().dump(2) + "\n");
            return 0;
          }};
}

}  // namespace attnlab::cli
