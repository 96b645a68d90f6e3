// Experiment files: the shipped ones parse, the grid expands as documented, and every
// malformed file gets an error naming the key, the bad value and the allowed values.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include <filesystem>
#include <fstream>

#include "attnlab/isa.hpp"
#include "bench/sweep/bench_point.hpp"
#include "bench/sweep/experiment.hpp"
#include "bench/results/files.hpp"
#include "bench/generation/generation.hpp"

namespace attnlab::bench {
namespace {

using Json = nlohmann::json;

const std::vector<std::string> kKernels = {"naive", "blocked", "flash"};

Experiment parse(const std::string& text) { return parse_experiment(Json::parse(text), "t.json", kKernels); }

std::vector<GridPoint> grid(const std::string& text, int all_threads = 2) { return expand(parse(text), all_threads); }

// The InvalidInput message of parsing `text` (with `parser`), or "" when it parses.
std::string error_of(const std::string& text, Experiment (*parser)(const std::string&) = parse) {
  try {
    parser(text);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

TEST(Experiment, ShippedExperimentsParseAndExpand) {
  const std::string dir = std::string(ATTNLAB_SOURCE_DIR) + "/experiments";
  const std::vector<std::string> required = {"quick",  "seq_len_scaling", "heads",   "gqa_groups",
                                             "decode", "head_dim",        "threads", "masks"};
  const auto files = list_files(dir, ".json");
  for (const std::string& name : required) {
    SCOPED_TRACE(name);
    ASSERT_NE(std::find(files.begin(), files.end(), name + ".json"), files.end());
  }
  for (const std::string& f : files) {
    SCOPED_TRACE(f);
    if (read_text_file(dir + "/" + f).find("\"kind\": \"generation\"") != std::string::npos) {
      EXPECT_FALSE(load_generation_experiment(dir + "/" + f, 2).empty());  // attnlab generate's
      EXPECT_THROW(load_experiment(dir + "/" + f, registry_kernel_names()), InvalidInput);
      continue;
    }
    const Experiment e = load_experiment(dir + "/" + f, registry_kernel_names());
    EXPECT_EQ(e.name + ".json", f);
    EXPECT_FALSE(e.description.empty());
    if (std::find(required.begin(), required.end(), e.name) != required.end()) {
      EXPECT_EQ(e.implementations, registry_kernel_names()) << "the issue's experiments run every kernel";
    }
    EXPECT_FALSE(expand(e, 2).empty());
  }
  // isa.json: the ladder on every target this CPU runs; naive and the like are not in it.
  const Experiment isa = load_experiment(dir + "/isa.json", registry_kernel_names());
  EXPECT_EQ(isa.implementations, (std::vector<std::string>{"simd", "threaded", "flash"}));
  for (const Grid& g : isa.grids) EXPECT_EQ(g.isa, runnable_isas());
  std::set<std::string> planned;
  for (const auto& p : expand(isa, 2)) planned.insert(p.isa);
  const std::vector<std::string> runs = runnable_isas();
  EXPECT_EQ(planned, std::set<std::string>(runs.begin(), runs.end()));
}

TEST(Experiment, ListsRangesAndPowersOfTwo) {
  auto g = grid(R"({"description": "d", "implementations": ["naive"], "q_len": {"pow2": [128, 1024]}})");
  std::vector<int64_t> lens;
  for (const auto& p : g) lens.push_back(p.problem.q_len);
  EXPECT_EQ(lens, (std::vector<int64_t>{128, 256, 512, 1024}));
  for (const auto& p : g) EXPECT_EQ(p.problem.kv_len, p.problem.q_len) << "kv_len defaults to q_len";

  g = grid(R"({"description": "d", "implementations": ["naive"], "q_len": 8, "kv_len": {"range": [10, 30, 10]}})");
  lens.clear();
  for (const auto& p : g) lens.push_back(p.problem.kv_len);
  EXPECT_EQ(lens, (std::vector<int64_t>{10, 20, 30}));

  g = grid(R"({"description": "d", "implementations": ["naive"], "q_len": [64, 32, 64]})");
  EXPECT_EQ(g.size(), 2u) << "duplicates are dropped";
}

TEST(Experiment, CartesianProductDefaultsAndOrder) {
  const auto g = grid(R"({"description": "d", "implementations": "all", "q_len": [64, 16],
                          "causal": [false, true], "threads": [1, "all"]})",
                      4);
  EXPECT_EQ(g.size(), 3u * 2 * 2 * 2);
  for (size_t i = 1; i < g.size(); ++i) EXPECT_LE(g[i - 1].flops, g[i].flops) << "ascending FLOP order";
  std::set<int> threads;
  for (const auto& p : g) {
    threads.insert(p.threads);
    EXPECT_EQ(p.problem.q_heads, 8);
    EXPECT_EQ(p.problem.kv_heads, 8);
    EXPECT_EQ(p.problem.head_dim, 128);
    EXPECT_EQ(p.problem.batch, 1);
    EXPECT_EQ(p.problem.layout, Layout::BHSD);
  }
  EXPECT_EQ(threads, (std::set<int>{1, 4})) << "\"all\" means all_threads";
  std::set<std::string> ids;
  for (const auto& p : g) ids.insert(p.id());
  EXPECT_EQ(ids.size(), g.size()) << "ids are unique";
}

TEST(Experiment, GqaGroupsAndModelWidth) {
  auto g = grid(R"({"description": "d", "implementations": ["naive"], "q_len": 8, "q_heads": 32,
                    "gqa_groups": [1, 4, 32]})");
  std::set<int64_t> kv;
  for (const auto& p : g) kv.insert(p.problem.kv_heads);
  EXPECT_EQ(kv, (std::set<int64_t>{32, 8, 1}));

  g = grid(R"({"description": "d", "implementations": ["naive"], "q_len": 8, "q_heads": [1, 4, 16],
               "d_model": 256})");
  for (const auto& p : g) EXPECT_EQ(p.problem.q_heads * p.problem.head_dim, 256);

  g = grid(R"({"description": "d", "implementations": ["naive"], "q_len": 8, "q_heads": 8, "kv_heads": [8, 2]})");
  EXPECT_EQ(g.size(), 2u);
}

TEST(Experiment, MasksWindowsAndLayouts) {
  auto e = parse(R"({"description": "d", "q_len": 8, "window": [128, 0]})");
  ASSERT_EQ(e.grids.size(), 1u);
  ASSERT_EQ(e.grids[0].values("window")->size(), 1u) << "[L, R] is one window";
  EXPECT_EQ(e.grids[0].values("window")->at(0), Json::parse("[128, 0]"));
  e = parse(R"({"description": "d", "q_len": 8, "window": [null, [128, 0], [-1, 4]]})");
  ASSERT_EQ(e.grids[0].values("window")->size(), 3u);
  EXPECT_EQ(e.grids[0].values("window")->at(0), Json::parse("[-1, -1]")) << "null is no window";
  EXPECT_EQ(e.grids[0].values("window")->at(2), Json::parse("[-1, 4]"));
  e = parse(R"({"description": "d", "q_len": 8, "causal": [false, true, "top_left"], "layout": ["bhsd", "bshd"]})");
  EXPECT_EQ(*e.grids[0].values("causal"), (std::vector<Json>{false, true, "top_left"}));
  EXPECT_EQ(*e.grids[0].values("layout"), (std::vector<Json>{"bhsd", "bshd"}));
  const auto g = expand(e, 1);
  EXPECT_EQ(g.size(), kKernels.size() * 3 * 2);
}

TEST(Experiment, DtypeAxis) {
  auto e = parse(R"({"description": "d", "q_len": 8})");
  EXPECT_EQ(*e.grids[0].values("dtype"), (std::vector<Json>{"f32"})) << "the default";
  e = parse(R"({"description": "d", "q_len": 8, "dtype": ["f32", "bf16", "f16"]})");
  const auto g = expand(e, 1);
  ASSERT_EQ(g.size(), kKernels.size() * 3);
  std::set<std::string> ids;
  for (const auto& pt : g) ids.insert(pt.id());
  EXPECT_EQ(ids.size(), g.size()) << "the dtype is part of a point's id";
  EXPECT_EQ(g.front().problem.flops(), g.back().problem.flops());
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 8, "dtype": "fp8"})").find("key 'dtype'"), std::string::npos);
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 8, "dtype": []})").find("\"f32\", \"bf16\", \"f16\""),
            std::string::npos);
}

// A paged cache's block size is an axis; a mixed-length batch is a per-grid list (kv_lens).
TEST(Experiment, KvBlockAxisAndMixedLengthBatches) {
  auto e = parse(R"({"description": "d", "implementations": ["flash"], "q_len": 1, "kv_len": 4096, "batch": 3,
                     "kv_block": [0, 16, 256], "kv_lens": [100, 4096, 0]})");
  const auto g = expand(e, 1);
  ASSERT_EQ(g.size(), 3u);
  std::map<int64_t, const GridPoint*> by_block;
  for (const auto& pt : g) by_block[pt.problem.kv_block] = &pt;
  ASSERT_EQ(by_block.size(), 3u);
  EXPECT_EQ(by_block[0]->id(), "flash-b3-hq8-hkv8-sq1-sk4096-d128-none-lens100.4096.0-t1");
  EXPECT_EQ(by_block[16]->id(), "flash-b3-hq8-hkv8-sq1-sk4096-d128-none-kb16-lens100.4096.0-t1");
  EXPECT_EQ(by_block[256]->problem.kv_lens, (std::vector<int64_t>{100, 4096, 0}));
  EXPECT_EQ(by_block[256]->problem.kv_pool_blocks(), 1 + 16);
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 1, "kv_len": 64, "kv_block": 48})")
                .find("kv_block: 48 is not "
                      "allowed"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 1, "kv_len": 64, "batch": 2, "kv_lens": [64]})")
                .find("kv_lens: 1 entries given; allowed: exactly batch (2)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 1, "kv_len": 64, "kv_lens": [-1]})").find("key 'kv_lens'"),
            std::string::npos);
}

TEST(Experiment, SparsePatternKeysResolvePerPoint) {
  const auto e = parse(R"({"description": "d", "implementations": ["flash"], "q_len": [1000, 4096],
                           "grids": [{"causal": true, "window": [512, 0], "sinks": 4},
                                     {"window": [256, 256], "global": {"spread": 16}},
                                     {"window": [96, 96], "global": [0, 7], "bigbird": [64, 3, 1]},
                                     {"causal": true, "doc_lens": {"mean": 1024}},
                                     {"causal": true, "window": [2048, 0], "dilation": 4}]})");
  const auto g = expand(e, 1);
  ASSERT_EQ(g.size(), 10u);
  std::set<std::string> ids;
  for (const auto& pt : g) {
    const Problem& p = pt.problem;
    EXPECT_TRUE(p.sparse()) << p.describe();
    ids.insert(pt.id());
    if (!p.globals.empty() && p.globals.size() != 2) {
      EXPECT_EQ(p.globals.size(), 16u);
      EXPECT_EQ(p.globals[1], p.kv_len / 16) << "spread over the sequence";
    }
    if (!p.doc_lens.empty()) {
      int64_t sum = 0;
      for (int64_t len : p.doc_lens) sum += len;
      EXPECT_EQ(sum, p.q_len);
      EXPECT_EQ(p.doc_lens[0], 512);
    }
  }
  EXPECT_EQ(ids.size(), g.size()) << "the pattern is part of a point's id";
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 8, "window": [2, 0], "sinks": -1})").find("key 'sinks'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 8, "window": [2, 0], "bigbird": [8, 2]})")
                .find("[BLOCK, RANDOM, SEED]"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"description": "d", "q_len": 8, "global": {"every": 2}})").find("spread"), std::string::npos);
  // A pattern the problem refuses names the point and the field.
  try {
    expand(parse(R"({"description": "d", "q_len": 8, "sinks": 2})"), 1);
    ADD_FAILURE() << "sinks without a window accepted";
  } catch (const InvalidInput& err) {
    EXPECT_NE(std::string(err.what()).find("sinks"), std::string::npos) << err.what();
  }
}

TEST(Experiment, SeveralGridsOverrideTheTopLevelKeys) {
  const auto e = parse(R"({"description": "d", "q_heads": 8, "gqa_groups": [1, 8], "head_dim": 32,
                           "implementations": ["naive", "flash"],
                           "grids": [{"q_len": 64},
                                     {"q_len": 1, "kv_len": [128, 256], "implementations": ["blocked"]},
                                     {"q_len": 16, "kv_heads": 2, "d_model": 128}]})");
  ASSERT_EQ(e.grids.size(), 3u);
  EXPECT_EQ(e.implementations, (std::vector<std::string>{"naive", "blocked", "flash"})) << "known order";
  const auto g = expand(e, 1);
  // grid 0: 2 kernels x 2 groups; grid 1: 1 kernel x 2 groups x 2 kv_len; grid 2: 2 kernels, kv_heads 2.
  ASSERT_EQ(g.size(), 4u + 4u + 2u);
  size_t decode = 0, third = 0;
  for (const auto& p : g) {
    if (p.problem.q_len == 1) {
      ++decode;
      EXPECT_EQ(p.kernel, "blocked");
      EXPECT_NE(p.problem.kv_len, 1);
    }
    if (p.problem.q_len == 16) {
      ++third;
      EXPECT_EQ(p.problem.kv_heads, 2) << "kv_heads in a grid replaces the top-level gqa_groups";
      EXPECT_EQ(p.problem.head_dim, 16) << "d_model in a grid replaces the top-level head_dim";
    }
  }
  EXPECT_EQ(decode, 4u);
  EXPECT_EQ(third, 2u);
}

TEST(Experiment, RunSettings) {
  const auto e = parse(R"({"description": "d", "q_len": 8, "repetitions": 7, "min_time_s": 0.25,
                           "time_cap_s": 9, "memory_budget_mib": 100, "verify_rows": 5, "seed": 42})");
  EXPECT_EQ(e.repetitions, 7);
  EXPECT_DOUBLE_EQ(e.min_time_s, 0.25);
  EXPECT_DOUBLE_EQ(e.time_cap_s, 9);
  EXPECT_DOUBLE_EQ(e.memory_budget_mib, 100);
  EXPECT_EQ(e.verify_rows, 5);
  EXPECT_EQ(e.seed, 42u);
}

struct BadCaseIsa {
  const char* doc;
  std::vector<std::string> expect;  // substrings the message must contain
};

// What "isa" may name in these tests: a build of three targets on a CPU that runs two, with
// flash built per target (the shape of this lab on an AVX2 machine, fixed whatever runs the test).
const IsaChoices kIsas = {{"scalar", "avx2", "avx512"}, {"scalar", "avx2"}, {"flash"}};

Experiment parse_isa(const std::string& text) { return parse_experiment(Json::parse(text), "t.json", kKernels, kIsas); }

std::string isa_error_of(const std::string& text) { return error_of(text, parse_isa); }

TEST(Experiment, IsaAxisRunsEachPerTargetKernelOncePerTarget) {
  // "all": every target the CPU runs, narrowest first; naive (built once) runs once.
  auto e = parse_isa(R"({"description": "d", "implementations": ["naive", "flash"], "q_len": 16, "isa": "all"})");
  EXPECT_EQ(e.grids[0].isa, (std::vector<std::string>{"scalar", "avx2"}));
  auto g = expand(e, 2);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].kernel, "naive");
  EXPECT_EQ(g[0].isa, "");
  EXPECT_EQ(g[0].id(), "naive-b1-hq8-hkv8-sq16-sk16-d128-none-t2") << "a kernel built once keeps its id";
  EXPECT_EQ(g[1].kernel, "flash");
  EXPECT_EQ(g[1].isa, "scalar");
  EXPECT_EQ(g[1].id(), "flash-b1-hq8-hkv8-sq16-sk16-d128-none-t2-scalar");
  EXPECT_EQ(g[2].isa, "avx2");
  EXPECT_EQ(g[2].id(), "flash-b1-hq8-hkv8-sq16-sk16-d128-none-t2-avx2");

  // A list: build order, duplicates dropped; a target this CPU cannot run is planned (the
  // sweep skips it with the reason). One name alone is a list of one.
  e = parse_isa(
      R"({"description": "d", "implementations": ["flash"], "q_len": 16, "isa": ["avx512", "scalar", "avx512"]})");
  EXPECT_EQ(e.grids[0].isa, (std::vector<std::string>{"scalar", "avx512"}));
  EXPECT_EQ(expand(e, 2).size(), 2u);
  e = parse_isa(R"({"description": "d", "implementations": ["flash"], "q_len": 16, "isa": "avx2"})");
  g = expand(e, 2);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].id(), "flash-b1-hq8-hkv8-sq16-sk16-d128-none-t2-avx2") << "a named target is in the id";

  // Without the key: the default target, ids as before the axis (old folders resume).
  e = parse_isa(R"({"description": "d", "implementations": ["flash"], "q_len": 16})");
  EXPECT_TRUE(e.grids[0].isa.empty());
  g = expand(e, 2);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].isa, "");
  EXPECT_EQ(g[0].id(), "flash-b1-hq8-hkv8-sq16-sk16-d128-none-t2");

  // An axis like any other: per grid, multiplied with threads, in the size bound.
  e = parse_isa(R"({"description": "d", "implementations": ["flash"], "q_len": 16, "threads": [1, 2],
                    "grids": [{"isa": "all"}, {"q_len": 32}]})");
  g = expand(e, 2);
  EXPECT_EQ(g.size(), 2u * 2 + 2);
  std::set<std::string> ids;
  for (const auto& p : g) ids.insert(p.id());
  EXPECT_EQ(ids.size(), g.size());
  EXPECT_NE(
      isa_error_of(R"({"description": "d", "q_len": {"range": [1, 4000, 1]}, "kv_len": {"range": [1, 20, 1]},
                              "isa": ["scalar", "avx2"]})")
          .find("x 2 values of implementations x batch x q_heads x kv_heads x q_len x kv_len x head_dim x "
                "head_dim_v x causal "
                "x window x kv_lens x sinks x global x doc_lens x dilation x bigbird x mask_file x softcap x alibi "
                "x sink_logits x layout x dtype "
                "x kv_dtype x kv_block x kv_shared x topk_tokens x topk_sinks x topk_recent x pass x threads x isa"),
      std::string::npos);
}

TEST(Experiment, IsaErrorsNameTheAllowedTargets) {
  const std::string allowed =
      "allowed: \"all\" (every target this CPU runs: scalar, avx2), a target of this build (scalar, avx2, avx512) "
      "or a list of them";
  const std::vector<BadCaseIsa> cases = {
      {R"({"description": "d", "q_len": 8, "isa": "avx1024"})", {"key 'isa': bad value \"avx1024\"", allowed.c_str()}},
      {R"({"description": "d", "q_len": 8, "isa": ["scalar", "neon"]})",
       {"key 'isa'", "[\"scalar\",\"neon\"]", allowed.c_str()}},
      {R"({"description": "d", "q_len": 8, "isa": ["all"]})", {"key 'isa'", allowed.c_str()}},
      {R"({"description": "d", "q_len": 8, "isa": []})", {"key 'isa'", "not an empty list"}},
      {R"({"description": "d", "q_len": 8, "isa": 2})", {"key 'isa': bad value 2", allowed.c_str()}},
      {R"({"description": "d", "q_len": 8, "isa": null})", {"key 'isa': bad value null"}},
      {R"({"description": "d", "q_len": 8, "grids": [{"isa": "sse9"}]})", {"grids[0]", "key 'isa'", "\"sse9\""}},
      {R"({"description": "d", "q_len": 8, "isas": "all"})", {"unknown key 'isas'", "isa"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.doc);
    const std::string msg = isa_error_of(c.doc);
    ASSERT_FALSE(msg.empty()) << "must be rejected";
    EXPECT_NE(msg.find("t.json"), std::string::npos) << msg;
    for (const std::string& x : c.expect)
      EXPECT_NE(msg.find(x), std::string::npos) << "missing '" << x << "' in: " << msg;
  }
}

struct BadCase {
  const char* doc;
  std::vector<const char*> expect;  // substrings the message must contain
};

TEST(Experiment, MalformedFilesNameKeyValueAndAllowed) {
  const std::vector<BadCase> cases = {
      {R"({"description": "d", "q_len": 8, "q_lens": 8})",
       {"unknown key 'q_lens'", "allowed keys:", "q_len", "gqa_groups"}},
      {R"({"q_len": 8})", {"missing key 'description'"}},
      {R"({"description": "", "q_len": 8})", {"'description'", "non-empty string"}},
      {R"({"description": "d"})", {"missing key 'q_len'", "pow2"}},
      {R"({"description": "d", "q_len": "long"})", {"'q_len'", "\"long\"", "allowed:", "pow2"}},
      {R"({"description": "d", "q_len": 0})", {"'q_len'", "bad value 0", ">= 1"}},
      {R"({"description": "d", "q_len": []})", {"'q_len'", "[]", "not an empty list"}},
      {R"({"description": "d", "q_len": {"pow2": [100, 200]}})", {"'q_len'", "{\"pow2\":[100,200]}", "powers of two"}},
      {R"({"description": "d", "q_len": {"range": [1, 10, 0]}})", {"'q_len'", "step >= 1"}},
      {R"({"description": "d", "q_len": {"steps": [1, 2]}})", {"'q_len'", "{\"steps\":[1,2]}"}},
      {R"({"description": "d", "q_len": 8, "implementations": ["fast"]})",
       {"'implementations'", "\"fast\"", "naive, blocked, flash"}},
      {R"({"description": "d", "q_len": 8, "implementations": "some"})", {"'implementations'", "\"all\""}},
      {R"({"description": "d", "q_len": 8, "kv_heads": 2, "gqa_groups": 2})",
       {"'kv_heads' and 'gqa_groups' exclude each other"}},
      {R"({"description": "d", "q_len": 8, "q_heads": 32, "gqa_groups": [4, 3]})",
       {"'gqa_groups'", "bad value 3", "divisors"}},
      {R"({"description": "d", "q_len": 8, "q_heads": 3, "d_model": 256})", {"'d_model'", "256", "q_heads"}},
      {R"({"description": "d", "q_len": 8, "head_dim": 64, "d_model": 256})", {"'head_dim' and 'd_model'"}},
      {R"({"description": "d", "q_len": 8, "causal": "yes"})", {"'causal'", "\"yes\"", "top_left"}},
      {R"({"description": "d", "q_len": 8, "window": [1, 2, 3]})", {"'window'", "[1,2,3]", "[L, R]"}},
      {R"({"description": "d", "q_len": 8, "window": [-5, 0]})", {"'window'", "-1 = unbounded"}},
      {R"({"description": "d", "q_len": 8, "layout": "bsdh"})", {"'layout'", "\"bsdh\"", "\"bshd\""}},
      {R"({"description": "d", "q_len": 8, "head_dim_v": -1})", {"'head_dim_v'", "bad value -1", ">= 0"}},
      {R"({"description": "d", "q_len": 8, "head_dim_v": 600})", {"head_dim_v: 600", "1 to 576"}},
      {R"({"description": "d", "q_len": 8, "model": "llama 3"})", {"'model'", "\"llama 3\"", "letters, digits"}},
      {R"({"description": "d", "q_len": 8, "model": 3})", {"'model'", "bad value 3", "letters, digits"}},
      {R"({"description": "d", "q_len": 8, "kind": "generation"})", {"'kind'", "attnlab generate"}},
      {R"({"description": "d", "q_len": 8, "threads": 0})", {"'threads'", "bad value 0", "\"all\""}},
      {R"({"description": "d", "q_len": 8, "threads": "many"})", {"'threads'", "\"many\""}},
      {R"({"description": "d", "q_len": 8, "repetitions": 0})", {"'repetitions'", "bad value 0", "from 1"}},
      {R"({"description": "d", "q_len": 8, "rounds": 0})", {"'rounds'", "bad value 0", "from 1 to 100"}},
      {R"({"description": "d", "q_len": 8, "rounds": "3"})", {"'rounds'", "\"3\"", "from 1 to 100"}},
      {R"({"description": "d", "q_len": 8, "min_time_s": -1})", {"'min_time_s'", "> 0"}},
      {R"({"description": "d", "q_len": 8, "time_cap_s": "long"})", {"'time_cap_s'", "> 0"}},
      {R"({"description": "d", "q_len": 8, "verify_rows": 1.5})", {"'verify_rows'", "1.5"}},
      {R"({"description": "d", "q_len": 8, "head_dim": 1024})", {"head_dim", "1024", "allowed"}},
      {R"([1, 2])", {"JSON object"}},
      {R"({"description": "d", "q_len": 8, "grids": []})", {"'grids'", "non-empty list"}},
      {R"({"description": "d", "q_len": 8, "grids": [5]})", {"grids[0]", "'grids'", "bad value 5"}},
      {R"({"description": "d", "q_len": 8, "grids": [{"seed": 1}]})",
       {"grids[0]", "unknown key 'seed'", "allowed keys in a grid"}},
      {R"({"description": "d", "grids": [{"q_len": 8}, {"head_dim": 8}]})", {"grids[1]", "missing key 'q_len'"}},
      {R"({"description": "d", "q_len": 8, "grids": [{"causal": "no"}]})", {"grids[0]", "'causal'", "\"no\""}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.doc);
    const std::string msg = error_of(c.doc);
    ASSERT_FALSE(msg.empty()) << "must be rejected";
    EXPECT_NE(msg.find("t.json"), std::string::npos) << msg;
    for (const char* s : c.expect) EXPECT_NE(msg.find(s), std::string::npos) << "missing '" << s << "' in: " << msg;
  }
}

TEST(Experiment, SyntaxErrorsAndMissingFilesNameTheFile) {
  const std::string dir = ::testing::TempDir() + "/attn_experiment_syntax";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/broken.json";
  std::ofstream(path) << R"({"description": "d", "q_len": 8,})";
  try {
    load_experiment(path, kKernels);
    FAIL() << "must be rejected";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_experiment(dir + "/absent.json", kKernels), InvalidInput);
}

TEST(Experiment, GridSizeIsBounded) {
  const std::string msg = error_of(R"({"description": "d", "q_len": {"range": [1, 4000, 1]},
                                       "kv_len": {"range": [1, 4000, 1]}})");
  EXPECT_NE(msg.find("the grids have 4.8e+07 points (this grid: 3 x 1 x 1 x 1 x 4000 x 4000 x 1"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("allowed: at most 100000 points"), std::string::npos) << msg;
  // Points of several grids add up; sizes whose product wraps size_t are still counted.
  EXPECT_NE(error_of(R"({"description": "d", "implementations": ["naive"],
                         "grids": [{"q_len": {"range": [1, 4000, 1]}, "kv_len": {"range": [1, 20, 1]}},
                                   {"q_len": {"range": [1, 4000, 1]}, "kv_len": {"range": [21, 40, 1]}}]})")
                .find("the grids have 160000 points"),
            std::string::npos);
  // 3 * 4096^6 points: more than int64 holds.
  std::string lists = R"(, "window": [[0, 0])";
  for (int i = 1; i < 4096; ++i) lists += ", [" + std::to_string(i) + ", 0]";
  lists += "]";
  for (const char* key : {"batch", "q_heads", "q_len", "kv_len", "head_dim"}) {
    lists += std::string(", \"") + key + "\": {\"range\": [1, 4096, 1]}";
  }
  const std::string huge = error_of(R"({"description": "d")" + lists + "}");
  EXPECT_NE(huge.find("the grids have 1.41671e+22 points"), std::string::npos) << huge;
}

// The reproductions of issue 8: generators ending near INT64_MAX used to loop forever
// (x *= 2 and x += step wrapped). Every one is now an error naming the count and the limit.
TEST(Experiment, GeneratorsAreBoundedAndNeverWrap) {
  std::string causal_4097 = "false";
  for (int i = 1; i < 4097; ++i) causal_4097 += ", false";
  const std::vector<std::pair<std::string, std::vector<const char*>>> cases = {
      {R"({"description": "d", "q_len": {"range": [1, 9223372036854775807, 1]}})",
       {"'q_len'", "at most 4096 values per key (this gives 9223372036854775807)"}},
      {R"({"description": "d", "q_len": {"range": [9223372036854775000, 9223372036854775807, 1]}})",
       {"q_len=9223372036854775000 ", "allowed: at most 2^36"}},  // 808 values, the first one too large
      {R"({"description": "d", "q_len": {"range": [1, 5000, 1]}})", {"'q_len'", "this gives 5000"}},
      {R"({"description": "d", "q_len": {"range": [2, 9223372036854775807, 4611686018427387904]}})",
       {"q_len=4611686018427387906", "Q: batch * q_heads * q_len * head_dim", "at most 2^36"}},
      {R"({"description": "d", "q_len": {"pow2": [1, 4611686018427387904]}})",
       {"grid point", "q_len=134217728", "at most 2^36 (68719476736) elements per tensor"}},
      {R"({"description": "d", "q_len": {"range": [1, 18446744073709551615, 1]}})", {"'q_len'", "allowed:"}},
      {R"({"description": "d", "q_len": 8, "window": [18446744073709551615, 0]})", {"'window'", "-1 = unbounded"}},
      {R"({"description": "d", "q_len": 8, "causal": [)" + causal_4097 + "]}",
       {"'causal'", "at most 4096 values per key (this gives 4097)"}},
  };
  for (const auto& [doc, expect] : cases) {
    SCOPED_TRACE(doc.substr(0, 120));
    const std::string msg = error_of(doc);
    ASSERT_FALSE(msg.empty()) << "must be rejected";
    for (const char* x : expect) EXPECT_NE(msg.find(x), std::string::npos) << "missing '" << x << "' in: " << msg;
  }
  // A pow2 list up to 2^62 stops at its bound (the next doubling would wrap).
  const Experiment e = parse(R"({"description": "d", "implementations": ["naive"], "head_dim": 1,
                                 "q_heads": 1, "q_len": 1, "kv_len": {"pow2": [1, 34359738368]}})");
  EXPECT_EQ(expand(e, 1).size(), 36u);  // kv_len 2^0 .. 2^35
  EXPECT_NE(error_of(R"({"description": "d", "implementations": ["naive"], "head_dim": 1, "q_heads": 1,
                         "q_len": 1, "kv_len": {"pow2": [1, 4611686018427387904]}})")
                .find("kv_len=137438953472"),
            std::string::npos);
}

}  // namespace
}  // namespace attnlab::bench
