// attnlab generate: the KV-cache generation loop (src/bench/generation/generation.hpp), one configuration
// from flags or every configuration of a generation experiment; writes generation.json,
// steps.csv, summary.csv and machine.json into --out, each rewritten whole after every
// configuration (an interrupted run keeps what it measured).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>

#include "attnlab/atomic_write.hpp"
#include "attnlab/isa.hpp"
#include "attnlab/limits.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/generation/generation.hpp"
#include "bench/results/machine.hpp"
#include "peaks/peak.hpp"
#include "peaks/stats.hpp"
#include "common.hpp"

namespace attnlab::cli {

namespace {
struct GenerateArgs {
  std::string experiment, out;
  bench::GenerationConfig one;
  AxisFlags head;   // --q-heads, --kv-heads, --head-dim, --head-dim-v, --dtype, ... (bench::is_generation_axis)
  int threads = 0;  // 0 = all cores
  bool no_bandwidth = false;
  IsaFlag isa;
};
}  // namespace

Command add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand(
      "generate", "token-by-token generation against a preallocated KV cache: per step, append + decode, timed");
  sub->add_option("--experiment", a->experiment, "a generation experiment (experiments/generation.json)");
  sub->add_option("--out", a->out, "folder for generation.json, steps.csv, summary.csv, machine.json")->required();
  sub->add_option("--name", a->one.name, "label of the configuration (without --experiment)");
  a->head.add_to(*sub, bench::is_generation_axis);  // default 32/8 heads, d 128, f32
  sub->add_option("--prompt", a->one.prompt, "tokens in the cache before the first step");
  sub->add_option("--steps", a->one.steps, "generated tokens");
  sub->add_option("--capacity", a->one.capacity, "cache rows (default prompt + steps)");
  sub->add_option("--impl", a->one.kernel, "the step's kernel (default decode)");
  sub->add_option("--prefill-impl", a->one.prefill_kernel, "the prompt's kernel (default flash)");
  sub->add_option("--prefill-max", a->one.prefill_max_tokens, "longest prompt that is prefilled (default 4096)");
  sub->add_option("--verify-steps", a->one.verify_steps, "steps checked against the float64 reference");
  sub->add_option("--repetitions", a->one.repetitions, "the same decode call repeated after each step (steady decode)");
  sub->add_option("--seed", a->one.seed, "seed of the token values");
  sub->add_option("--threads", a->threads, "threads (0 = all cores; an experiment's own key wins)");
  sub->add_flag("--no-bandwidth", a->no_bandwidth, "skip measuring the read bandwidth and the FMA peak");
  a->isa.add_to(*sub, false);
  return {sub, [a, sub] {
            a->isa.apply();
            const int threads = thread_count(a->threads);
            std::vector<bench::GenerationConfig> configs;
            if (!a->experiment.empty()) {
              for (const char* flag : {"--name", "--prompt", "--steps", "--capacity"}) {
                if (sub->count(flag) > 0) {
                  throw InvalidInput(std::string(flag) + ": not allowed with --experiment (the file sets it)");
                }
              }
              if (a->head.any_given()) {
                throw InvalidInput(schema::flag_of(a->head.as_experiment_keys().begin().key()) +
                                   ": not allowed with --experiment (the file sets it)");
              }
              configs = bench::load_generation_experiment(a->experiment, threads);
            } else {
              a->head.apply(a->one.head);
              a->one.threads = threads;
              a->one.validate();
              configs.push_back(a->one);
            }
            std::filesystem::create_directories(a->out);
            nlohmann::json machine = bench::describe_machine();
            std::map<int, double> bandwidth, fma;  // per thread count
            if (!a->no_bandwidth) {
              for (const auto& c : configs) {
                if (bandwidth.count(c.threads)) continue;
                // What the steps' bytes per second are compared with, measured in the same run.
                bandwidth[c.threads] = peaks::measure_read_bandwidth(c.threads, size_t{512} << 20, 3);
                std::vector<double> runs;
                for (int r = 0; r < 3; ++r) runs.push_back(peaks::measure_fma_flops(c.threads, 0.1));
                fma[c.threads] = peaks::median(runs);
              }
              for (const auto& [t, bw] : bandwidth) machine["read_bandwidth"][std::to_string(t)] = bw;
              for (const auto& [t, f] : fma) machine["fma_flops"][std::to_string(t)] = f;
            }
            write_file_atomic(a->out + "/machine.json", machine.dump(2) + "\n");
            std::vector<bench::GenerationResult> results;
            int failed = 0;
            for (const auto& c : configs) {
              std::printf("%s: %d/%d heads, d %lld/%lld, %s, prompt %lld + %lld steps, %d thread(s)\n", c.name.c_str(),
                          static_cast<int>(c.head.q_heads), static_cast<int>(c.head.kv_heads),
                          static_cast<long long>(c.head.head_dim), static_cast<long long>(c.head.dim_v()),
                          c.cache_text().c_str(), static_cast<long long>(c.prompt), static_cast<long long>(c.steps),
                          c.threads);
              std::fflush(stdout);
              bench::GenerationResult r = bench::run_generation(c);
              r.read_bytes_per_s = bandwidth.count(c.threads) ? bandwidth[c.threads] : 0;
              r.peak_flops = fma.count(c.threads) ? fma[c.threads] : 0;
              int bad = 0;
              for (const auto& s : r.steps) bad += s.verdict == "FAIL";
              failed += bad + (r.prefill_verdict == "FAIL");
              std::printf(
                  "  %.3f ms per token (append %.4f ms + attention %.3f ms; steady decode %.3f ms), "
                  "KV %.0f B/token, prefill %s%s\n",
                  r.median_token_s() * 1e3, r.median_append_s() * 1e3, r.median_attention_s() * 1e3,
                  r.median_repeat_s() * 1e3, c.kv_bytes_per_token(),
                  r.prefill_s >= 0 ? (std::to_string(r.prefill_s * 1e3) + " ms " + r.prefill_verdict).c_str()
                                   : r.prefill_note.c_str(),
                  bad ? ", VERIFICATION FAILED" : "");
              results.push_back(std::move(r));
              nlohmann::json all_json = nlohmann::json::array();
              for (const auto& x : results) all_json.push_back(x.to_json());
              write_file_atomic(a->out + "/generation.json", nlohmann::json{{"schema", "attnlab-generation-1"},
                                                                            {"experiment", a->experiment},
                                                                            {"results", all_json}}
                                                                     .dump(1) +
                                                                 "\n");
              write_file_atomic(a->out + "/steps.csv", bench::generation_steps_csv(results));
              write_file_atomic(a->out + "/summary.csv", bench::generation_summary_csv(results));
            }
            std::printf("wrote %s/{generation.json,steps.csv,summary.csv,machine.json}\n", a->out.c_str());
            return failed ? 1 : 0;
          }};
}

}  // namespace attnlab::cli
