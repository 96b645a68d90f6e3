// Experiment files (experiments/*.json): one question, a grid of points to measure.
//
// The keys from batch to threads are the point schema's axes (point_schema.cpp, axes()): a new
// axis there is a key here with nothing else to edit; the list below documents today's.
//   {
//     "description": "what the experiment asks (required)",
//     "implementations": "all" | ["naive", "flash", ...]       default "all" (the registry)
//     "batch":      INTS                                          default 1
//     "q_heads":    INTS                                          default 8
//     "kv_heads":   INTS | "q_heads" (also in a list)              default "q_heads"
//     "gqa_groups": INTS      (q_heads / kv_heads; instead of kv_heads)
//     "q_len":      INTS                                          required
//     "kv_len":     INTS | "q_len" (also in a list)                default "q_len"
//     "head_dim":   INTS                                          default 128
//     "d_model":    INTS      (head_dim = d_model / q_heads; instead of head_dim)
//     "head_dim_v": INTS      (of V and O; 0 = head_dim: MLA's d_v != d_qk)   default 0
//     "model":      NAME      a label naming the configuration in every row (letters, digits, . _ -)
//     "causal":     MASK | [MASK, ...]  with MASK = false | true | "top_left"   default false
//     "window":     null | [L, R] | [null | [L, R], ...]  (-1 = unbounded)   default null
//     "layout":     "bhsd" | "bshd" | [...]                       default "bhsd"
//     "dtype":      "f32" | "bf16" | "f16" | [...]  storage of Q, K, V   default "f32"
//     "kv_dtype":   "dtype" | "q8_0" | "q4_0" | "u8" | "u4" | "fp8_e4m3" | "fp8_e5m2" | [...]
//                   K/V as a quantized cache (kv_quant.hpp)    default "dtype" (as Q)
//     "pass":       "forward" | "backward" | "forward_backward" | [...]  what a point computes and
//                   times: O and LSE, or dQ, dK, dV (Problem::pass; FLOPs 2.5x, both 3.5x)  default "forward"
//     "threads":    INTS | "all" | [int or "all", ...]            default "all"
//     "isa":        "all" | NAME | [NAME, ...]                    default: not an axis
//   The rest of the mask: a mixed-length batch and the sparse pattern terms (include/attnlab/
//   pattern.hpp), axes like the others (a list of their values is an axis), resolved per point
//   where they depend on the lengths:
//     "kv_lens":    null | [length, ...]  batch entries' cache lengths, each <= kv_len   default null
//     "sinks":      INTS (>= 0)                                   default 0
//     "global":     null | [position, ...] | {"spread": N}  (positions i * kv_len / N)   default null
//     "doc_lens":   null | [length, ...] | {"mean": M}  (M/2, 3M/2, M repeating, the last cut to fit)
//     "dilation":   INTS (>= 1)                                   default 1
//     "bigbird":    null | [BLOCK, RANDOM, SEED]                  default null
//     "mask_file":  null | "PATH.npy" (a boolean mask)            default null
//     "repetitions": int >= 1          timed repetitions per point (median, spread)  default 3
//     "rounds":      int 1..100        passes over the points: with N > 1 every point is timed
//                    N times (its repetitions each time), pass after pass, so points compared
//                    with each other (a pattern against dense, a kernel against a peer) saw the
//                    same drifting host; medians are over all passes' repetitions   default 1
//     "min_time_s":  number > 0        minimum time of one repetition                default 0.05
//     "time_cap_s":  number > 0        skip a point estimated to take longer         default 60
//     "memory_budget_mib": number > 0  skip a point needing more memory      default RAM / 2
//     "verify_rows": int >= 1          rows checked against the reference per point  default 64
//     "seed":        int >= 0          random inputs                                 default 1
//     "needles":     {"per_row": N, "mass": M}  the random inputs with N keys per query row planted
//                    to hold M of its softmax mass (include/attnlab/workload.hpp: sparse attention
//                    for query-aware sparse decode's accuracy)   default none
//     "peers":       [NAME, ...] | "a,b"  peers measured beside the kernels on every shape of
//                    the grids (bench/peers/peers.hpp: torch, ort, jax, ggml or their kernels
//                    torch_sdpa, torch_flex, ort_mha, ort_gqa, ov_sdpa, ov_decode, jax_dpa, ggml_fa)  default none
//     "grids": [ {GRID KEYS}, ... ]    several grids in one experiment (see below)
//   }
//   INTS = n | [n, ...] | {"pow2": [lo, hi]} (powers of two lo..hi) | {"range": [start, stop, step]}
//          (stop inclusive)
// The grid is the Cartesian product of every list. With "grids", each entry (an object of
// grid keys: implementations, batch ... threads) overrides the top-level grid keys, and the
// experiment is the union of those grids, e.g. prefill and decode shapes in one question:
//   "q_heads": 32, "gqa_groups": [1, 4, 32], "grids": [{"q_len": 1024}, {"q_len": 1, "kv_len": 8192}]
// (a grid setting kv_heads drops a top-level gqa_groups, and d_model drops head_dim, and
// vice versa). Unknown keys are errors; every error names the file, the key, the bad value
// and what is allowed (InvalidInput).
//
// "isa" is an axis like threads, over the instruction-set targets (include/attnlab/isa.hpp):
// each point of a kernel built per target (simd, threaded, flash, decode) runs once per
// listed target; kernels built once (naive, blocked, cuda_*) run once, whatever it says.
// "all" is every target of this build that this CPU runs; a NAME must be a target of this
// build (else an error naming them), and a point whose target this CPU cannot run is
// skipped with that reason, not failed. Without the key the SIMD kernels run the default
// target (--isa, ATTN_ISA, else the widest) and point ids are as they were before the
// axis existed; with it, their ids and names end in the target (flash-...-t2-avx2,
// attn/flash/.../t:2/isa:avx2), so the variants of one shape never share an id.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attnlab/problem.hpp"
#include "attnlab/workload.hpp"
#include "bench/using.hpp"

namespace attnlab::bench {

// The values one axis (point_schema.hpp) takes in a grid.
struct AxisValues {
  const Axis* axis;
  std::vector<Json> values;  // normalized, as Axis::parse gives them
};

// One Cartesian grid.
struct Grid {
  std::vector<std::string> implementations;  // kernel names
  std::vector<AxisValues> axes;              // the axes the grid sets (given or default), in axes() order
  std::string model;                         // "model" label of every point ("" = none)
  std::vector<std::string> isa;              // targets named by "isa", narrowest first; empty = key absent
  std::string where;                         // the grid in errors: "FILE" or "FILE grids[i]"
  // The values of `key`; nullptr when the grid does not set it (its alternative is set).
  const std::vector<Json>* values(std::string_view key) const;
  // Replaces the values of `key` (an axis of the table), e.g. a command line's override.
  void set(std::string_view key, std::vector<Json> values);
};

// What the "isa" key may name: this build's targets, the ones this CPU runs ("all"), and
// which kernels have a variant per target (the others ignore the axis).
struct IsaChoices {
  std::vector<std::string> built;               // narrowest first
  std::vector<std::string> runnable;            // subset of built
  std::vector<std::string> per_target_kernels;  // kernel names
  // built_isas(), runnable_isas(), and the registry's kernels whose isa() is a built target.
  static IsaChoices here();
};

struct Experiment {
  std::string name;  // file stem
  std::string description;
  nlohmann::json source;  // the document as read (copied into the results folder)

  std::vector<std::string> implementations;  // every kernel of any grid, in known order
  std::vector<std::string> peers;            // peer kernels (peers.hpp), report order
  std::vector<Grid> grids;                   // one, or one per "grids" entry
  IsaChoices isa_choices;                    // as parsed against

  int repetitions = 3;
  int rounds = 1;
  double min_time_s = 0.05;
  double time_cap_s = 60;
  double memory_budget_mib = 0;  // 0 = half the physical memory
  int verify_rows = 64;
  uint64_t seed = 1;
  Needles needles;  // the inputs' planted needles (none: random_tensors)
};

// `known_kernels`: the names "all" expands to and that implementations may list; `isas`:
// what "isa" may name (tests pass their own).
Experiment parse_experiment(const nlohmann::json& doc, const std::string& name,
                            const std::vector<std::string>& known_kernels, const IsaChoices& isas = IsaChoices::here());
// Parses JSON text (the file reader's core; `name` appears in messages); syntax errors name
// the position.
Experiment parse_experiment_text(const std::string& text, const std::string& name,
                                 const std::vector<std::string>& known_kernels,
                                 const IsaChoices& isas = IsaChoices::here());
// Replaces doc's values of the keys in `overrides` (grid keys, e.g. a command line's flags), at
// the top level and in every "grids" entry; an axis's alternative goes with it (kv_heads drops
// gqa_groups).
void override_keys(nlohmann::json& doc, const nlohmann::json& overrides);
// Reads and parses a file (name = file stem); JSON syntax errors name the file and position.
// `overrides` (grid keys, e.g. a sweep's --dtype) replace the file's values of those keys,
// at the top level and in every "grids" entry (an axis's alternative goes with it).
Experiment load_experiment(const std::string& path, const std::vector<std::string>& known_kernels,
                           const IsaChoices& isas = IsaChoices::here(),
                           const nlohmann::json& overrides = nlohmann::json::object());
// The registry's kernel names.
std::vector<std::string> registry_kernel_names();

struct GridPoint {
  std::string kernel;
  std::string isa;    // the target named by "isa" (BenchPoint::named_isa); "" = the default / built once
  std::string model;  // the grid's "model" label, in the id and name when set ("" = none)
  Problem problem;
  int threads = 1;
  double flops = 0;  // problem.flops(), the sort key
  std::string id() const;
};

// Every grid point, deduplicated, each problem validated (an invalid combination is an
// error naming it), in a fixed order: ascending FLOP count, then kernel order, then
// target (narrowest first), then shape. `all_threads` is what "all" means. Throws
// InvalidInput.
std::vector<GridPoint> expand(const Experiment& e, int all_threads);

}  // namespace attnlab::bench
