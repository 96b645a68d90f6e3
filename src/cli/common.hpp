// Flags shared by the attnlab subcommands, and the problem they describe.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnlab/problem.hpp"
#include "schema/point_schema.hpp"

namespace attnlab::cli {

// The point schema's axes of some kinds as flags (schema/point_schema.hpp): --q-len, --kv-heads,
// --gqa-groups, ... for the sizes, --layout, --dtype (every setting axis) for the settings.
// Values are what the experiment key takes, written "a,b" for a list: the same parser and the
// same checks, so a new axis of the table is a flag of every command that takes its kind.
struct AxisFlags {
  AxisFlags() = default;
  AxisFlags(const AxisFlags&) = default;
  // Takes o's values into the flags' own storage, which the CLI::App holds references to:
  // `flags = AxisFlags{}` resets them to "not given" between two parses (the fuzz harness).
  AxisFlags& operator=(const AxisFlags& o);
  void add_to(CLI::App& app, std::initializer_list<schema::AxisKind> kinds);
  void add_to(CLI::App& app, bool (*pick)(const schema::Axis&));
  bool given(const std::string& key) const;
  bool any_given() const;
  std::string text(const std::string& key) const;  // "" when not given
  // Another flag for the same axis: `name` alone sets `value` ("--causal-top-left", "top_left"),
  // or takes the value like the axis's own flag (value nullptr: "--mask" for --mask-file).
  CLI::Option* alias(CLI::App& app, const std::string& key, const std::string& name, const char* value,
                     const std::string& help);
  // Sets each given flag's value into p, in the table's order; one value each (InvalidInput).
  void apply(Problem& p) const;
  // The given flags as experiment keys (a sweep's flags replace the experiment's values).
  nlohmann::json as_experiment_keys() const;

 private:
  std::map<std::string, std::string> text_;  // key -> the flag's text ("" not given)
};

// The problem's flags beside its sizes (run and verify): the schema's mask axes (--causal alone
// or --causal=top_left, --window, --kv-lens and every sparse pattern term: --sinks, --global,
// --doc-lens, --dilation, --bigbird, --mask-file), its setting axes (--layout, --dtype, ...),
// the scale and the threads. --causal-top-left and --mask are the CLI's older spellings.
struct MaskFlags {
  AxisFlags masks;
  std::optional<float> scale;
  AxisFlags settings;  // --layout, --dtype (""/absent: f32, or inferred from .npy inputs ('<f2' files: f16))
  int threads = 0;     // 0 = all cores
  void add_to(CLI::App& app);
  // Fills the mask/scale/setting fields of p (throws InvalidInput on a bad value, naming the flag).
  void apply(Problem& p) const;
  int thread_count() const;
};

// Explicit shape flags (verify with random inputs): the schema's size axes, over a base shape.
struct ShapeFlags {
  AxisFlags sizes;
  uint64_t seed = 1;
  void add_to(CLI::App& app);
  bool any_given() const { return sizes.any_given(); }
  // The base shape (b 1, h 8/2, q 65, kv 127, d 64: odd lengths, GQA) with the given flags.
  void apply(Problem& p) const;
};

std::vector<int64_t> parse_int_list(const std::string& field, const std::string& text);

// --isa (include/attnlab/isa.hpp): which instruction-set target the SIMD kernels run.
struct IsaFlag {
  std::string value;   // "" = not given
  bool lists = false;  // whether "all" and comma-separated lists are accepted (verify, peak)
  void add_to(CLI::App& app, bool accept_lists);
  // The targets named, each checked (InvalidInput, exit 2: not a target of this build, or
  // one this CPU cannot run; the message names what the CPU runs); "all" = every target of
  // this build that the CPU runs. Empty when not given.
  std::vector<std::string> targets() const;
  // When one target is named: makes it the default for this process (set_default_isa), so
  // registry() and the measured peaks use it. Returns targets().
  std::vector<std::string> apply() const;
};

// Subcommands. Each adds itself to the app and runs when selected; the runner returns
// the process exit code (0 ok, 1 verification failed or a sweep point failed, 2 bad input,
// 3 not verified (verify: a kernel named in --impl ran on no shape) or another error, 4 I/O
// error: a file could not be written; main.cpp maps the exceptions).
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};
Command add_list(CLI::App& app);
Command add_run(CLI::App& app);
Command add_verify(CLI::App& app);
Command add_peak(CLI::App& app);      // cmd_peak.cpp
Command add_sweep(CLI::App& app);     // cmd_sweep.cpp
Command add_merge(CLI::App& app);     // cmd_merge.cpp
Command add_cuda(CLI::App& app);      // cmd_cuda.cpp
Command add_generate(CLI::App& app);  // cmd_generate.cpp

}  // namespace attnlab::cli
