// The sweep's side of the peer path (bench/peers/peers.hpp) through a stand-in server: peers run
// every shape after the kernels, verified, timed, failed, skipped and died peers are recorded
// as such, a missing environment skips with the reason, and peer names parse or are refused.
#include <fstream>

#include "sweep_fixture.hpp"

namespace attnlab::bench {
namespace {

// Peers through a stand-in server (tests/peers/fake_serve.py, Debian's python3 with numpy):
// the sweep's side of the peer path, without torch, ONNX Runtime or JAX installed.
struct SweepPeers : SweepRun {
  const std::string fake = std::string(ATTNLAB_SOURCE_DIR) + "/tests/peers/fake_serve.py";
  Experiment peer_experiment() {
    return parse_experiment(
        Json::parse(R"({"description": "d", "implementations": ["naive"], "q_len": [8, 16], "q_heads": 2,
                        "head_dim": 16, "causal": [false, true], "threads": 1, "repetitions": 2, "min_time_s": 0.001,
                        "peers": ["torch_sdpa", "ort", "jax_dpa"]})"),
        "peers", names);
  }
  SweepOptions peer_options(const std::string& dir) {
    SweepOptions o = options(dir);
    o.peers_python = "/usr/bin/python3";
    o.peers_serve = fake;
    return o;
  }
  // The experiment (JSON text) swept against the stand-in server into a fresh folder `name`: its points.
  std::vector<PointFile> sweep_points(const std::string& name, const char* experiment) {
    const std::string dir = fresh_dir(name);
    run_sweep(parse_experiment(Json::parse(experiment), name, names), peer_options(dir));
    return read_points(dir);
  }
  void TearDown() override {
    ::unsetenv("ATTN_FAKE_PEER");
    ::unsetenv("ATTN_FAKE_PEER_UNAVAILABLE");
  }
};

TEST_F(SweepPeers, PeersRunEveryShapeAfterTheKernels) {
  const Experiment e = peer_experiment();
  EXPECT_EQ(e.peers, (std::vector<std::string>{"torch_sdpa", "ort_mha", "ort_gqa", "jax_dpa"}))
      << "a family names all of its kernels, in report order";
  const auto grid = expand(e, 2);
  ASSERT_EQ(grid.size(), 4u * 5u) << "4 shapes x (naive + 4 peers)";
  for (size_t i = 0; i < grid.size(); i += 5) {
    EXPECT_EQ(grid[i].kernel, "naive") << "at one shape the lab's kernels come first";
    for (size_t j = 1; j < 5; ++j) {
      EXPECT_EQ(grid[i + j].kernel, e.peers[j - 1]);
      EXPECT_EQ(grid[i + j].problem.describe(), grid[i].problem.describe());
      EXPECT_TRUE(grid[i + j].isa.empty());
    }
  }
}

TEST_F(SweepPeers, VerifiedTimedFailedSkippedAndDiedPeersAreRecordedAsSuch) {
  ::setenv("ATTN_FAKE_PEER", "torch_sdpa=exact,ort_mha=wrong,ort_gqa=skip,jax_dpa=die", 1);
  const std::string dir = fresh_dir("peers");
  const SweepSummary s = run_sweep(peer_experiment(), peer_options(dir));
  EXPECT_EQ(s.ok, 8u) << log.str();  // naive and torch_sdpa at 4 shapes
  EXPECT_EQ(s.failed, 8u);           // ort_mha disagrees, jax_dpa's server dies (each time)
  EXPECT_EQ(s.skipped, 4u);
  std::map<std::string, int> seen;
  for (const auto& pf : read_points(dir)) {
    const PointRecord& r = pf.record;
    ++seen[r.kernel];
    if (r.kernel == "naive") continue;
    EXPECT_EQ(r.isa, kPeerIsa);
    if (r.kernel == "torch_sdpa") {
      EXPECT_EQ(r.status, PointStatus::Ok) << r.reason;
      EXPECT_EQ(r.verdict, "PASS");
      EXPECT_EQ(r.times.size(), 2u);
      EXPECT_EQ(r.iterations, 7);
      EXPECT_EQ(r.version, "fake 1.0");
      EXPECT_EQ(r.how, "fake exact; threads 1");
      EXPECT_GT(r.peak_flops, 0) << "% of peak against the default target's";
      EXPECT_EQ(pf.gbench_runs.size(), 2u + 3u) << "iterations and mean/median/stddev, as Google Benchmark writes";
    } else if (r.kernel == "ort_mha") {
      EXPECT_EQ(r.status, PointStatus::Failed);
      EXPECT_EQ(r.verdict, "FAIL");
      EXPECT_NE(r.reason.find("disagrees with the float64 reference"), std::string::npos) << r.reason;
      EXPECT_TRUE(r.times.empty()) << "a disagreeing peer is not timed";
      EXPECT_TRUE(pf.gbench_runs.empty());
    } else if (r.kernel == "ort_gqa") {
      EXPECT_EQ(r.status, PointStatus::Skipped);
      EXPECT_EQ(r.reason, "fake: not this shape");
    } else {
      EXPECT_EQ(r.status, PointStatus::Failed);
      EXPECT_NE(r.reason.find("server died"), std::string::npos) << r.reason;
    }
  }
  EXPECT_EQ(seen, (std::map<std::string, int>{
                      {"naive", 4}, {"torch_sdpa", 4}, {"ort_mha", 4}, {"ort_gqa", 4}, {"jax_dpa", 4}}));
  const std::string csv = read_text_file(dir + "/results.csv");
  EXPECT_NE(csv.find(",torch_sdpa,peer,ok,,,fake 1.0,fake exact; threads 1,"), std::string::npos) << csv.substr(0, 600);
  EXPECT_NE(read_text_file(dir + "/bench.json").find("attn/torch_sdpa/"), std::string::npos);
}

// A backward point hands the peer dO and checks the gradients it returns (on sampled rows and
// keys, against float64 given the lab's flash forward): exact ones are timed, a wrong dK fails.
TEST_F(SweepPeers, BackwardPeersAreCheckedOnTheirGradients) {
  ::setenv("ATTN_FAKE_PEER", "torch_sdpa=exact,jax_dpa=wrongdk", 1);
  const std::string dir = fresh_dir("peers_backward");
  const Experiment e = parse_experiment(
      Json::parse(R"({"description": "d", "implementations": ["naive"], "q_len": 24, "kv_len": 40, "q_heads": 4,
                      "gqa_groups": 2, "head_dim": 16, "causal": [false, true], "layout": ["bhsd", "bshd"],
                      "pass": "backward", "threads": 1, "repetitions": 2, "min_time_s": 0.001, "verify_rows": 16,
                      "peers": ["torch_sdpa", "jax_dpa"]})"),
      "peers_backward", names);
  const SweepSummary s = run_sweep(e, peer_options(dir));
  EXPECT_EQ(s.ok, 8u) << log.str();  // naive and torch_sdpa at 4 shapes
  EXPECT_EQ(s.failed, 4u);           // jax_dpa's dK
  for (const auto& pf : read_points(dir)) {
    const PointRecord& r = pf.record;
    if (r.kernel == "jax_dpa") {
      EXPECT_NE(r.reason.find("gradients disagree with the float64 reference: dK error"), std::string::npos)
          << r.reason;
      EXPECT_LT(r.err_grad.dq, 1e-5) << "dQ was right";
    } else {
      EXPECT_EQ(r.status, PointStatus::Ok) << r.id << ": " << r.reason;
      for (double err : {r.err_grad.dq, r.err_grad.dk, r.err_grad.dv}) EXPECT_LT(err, 1e-5) << r.id;
    }
  }
}

// A peer's tolerance policy is its catalogue row's (scripts/peers/catalogue.json "tolerance"): every
// row names one the lab knows, and a name it does not know is refused naming the allowed ones.
TEST(PeerCatalogue, EveryPeerNamesAKnownTolerancePolicy) {
  for (const auto& [kernel, family] : peer_kernels()) EXPECT_NO_THROW(peer_policy(kernel)) << kernel;
  EXPECT_EQ(peer_policy("ov_sage"), PeerPolicy::OpenvinoSage);
  EXPECT_EQ(peer_policy("ggml_fa"), PeerPolicy::GgmlCache);
  EXPECT_EQ(peer_policy("ort_gqa"), PeerPolicy::OrtIntCache);
  EXPECT_EQ(peer_policy("torch_sdpa"), PeerPolicy::Float32);
  try {
    parse_peer_policy("bf16");
    ADD_FAILURE() << "an unknown policy was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: float32, bf16_products"), std::string::npos) << e.what();
  }
}

// Which peers run a 16-bit or quantized cache is one rule (peer_tolerance.cpp peer_keeps_own_cache): ggml_fa on its
// f16 / q8_0 / q4_0, ov_decode on f16 / u8 / u4, ov_sdpa on bf16 (its bf16 precision hint), ort_gqa on the integer
// caches (its own int8 / int4 cache) - handed the
// stored values as float32 and verified - and every other peer skips with the reason, so no peer
// is timed on values it was not given.
TEST_F(SweepPeers, OnlyPeersWithTheirOwnCacheRunQuantizedOr16BitPoints) {
  ::setenv("ATTN_FAKE_PEER", "ov_decode=exact,ov_sdpa=exact,ggml_fa=exact,ort_gqa=exact", 1);
  const auto points =
      sweep_points("peers_caches",
                   R"({"description": "d", "implementations": ["naive"], "q_len": 1, "kv_len": 64, "q_heads": 4,
          "gqa_groups": 2, "head_dim": 32, "causal": true, "threads": 1, "repetitions": 2,
          "min_time_s": 0.001, "grids": [{"dtype": ["f32", "f16", "bf16"]}, {"kv_dtype": ["u8", "q8_0", "u4"]}],
          "peers": ["ov_sdpa", "ov_decode", "ggml_fa", "ort_gqa"]})");
  std::map<std::string, std::string> got;  // "kernel dtype/kv_dtype" -> status
  for (const auto& pf : points) {
    const PointRecord& r = pf.record;
    if (r.kernel == "naive") continue;
    const std::string key = r.kernel + " " + to_string(r.problem.dtype) + "/" + to_string(r.problem.kv_dtype);
    got[key] = r.status == PointStatus::Ok        ? "ok"
               : r.status == PointStatus::Skipped ? "skipped"
                                                  : "failed: " + r.reason;
    if (key == "ov_sdpa bf16/dtype") {
      EXPECT_NE(r.how.find("tolerance: the bf16-products policy"), std::string::npos) << r.how;
      EXPECT_GE(r.tol_o_rel, Tolerance::kFloorBf16P) << "flash_bf16's floor, not float32's";
    }
    if (r.status == PointStatus::Ok && r.problem.kv_quantized()) {
      // as a kernel's row: O against the stored values, and against the values the cache was
      // written from (what the cache type costs), which a 4/8-bit cache moves by far more
      EXPECT_GT(r.err_o_rel_f32_inputs, 10 * r.err_o_rel) << key;
    } else if (r.status == PointStatus::Ok && r.problem.dtype == DType::F32) {
      EXPECT_EQ(r.err_o_rel_f32_inputs, r.err_o_rel) << key;
    }
    if (r.status == PointStatus::Skipped) {
      EXPECT_TRUE(r.reason.find("peers run float32 points") != std::string::npos ||
                  r.reason.find("the peers take float32 K/V") != std::string::npos)
          << key << ": " << r.reason;
    }
  }
  EXPECT_EQ(got,
            (std::map<std::string, std::string>{
                {"ov_sdpa f32/dtype", "ok"},   {"ov_sdpa f16/dtype", "skipped"},  {"ov_sdpa bf16/dtype", "ok"},
                {"ov_sdpa f32/u8", "skipped"}, {"ov_sdpa f32/q8_0", "skipped"},   {"ov_sdpa f32/u4", "skipped"},
                {"ov_decode f32/dtype", "ok"}, {"ov_decode f16/dtype", "ok"},     {"ov_decode bf16/dtype", "skipped"},
                {"ov_decode f32/u8", "ok"},    {"ov_decode f32/q8_0", "skipped"}, {"ov_decode f32/u4", "ok"},
                {"ggml_fa f32/dtype", "ok"},   {"ggml_fa f16/dtype", "ok"},       {"ggml_fa bf16/dtype", "skipped"},
                {"ggml_fa f32/u8", "skipped"}, {"ggml_fa f32/q8_0", "ok"},        {"ggml_fa f32/u4", "skipped"},
                {"ort_gqa f32/dtype", "ok"},   {"ort_gqa f16/dtype", "skipped"},  {"ort_gqa bf16/dtype", "skipped"},
                {"ort_gqa f32/u8", "ok"},      {"ort_gqa f32/q8_0", "ok"},        {"ort_gqa f32/u4", "ok"}}));
}

// ov_sage rounds Q and K to int8 and V to u8: its tolerance is the bf16-products policy plus 4x what
// those roundings move the float64 O (peer_tolerance.cpp peer_tolerance), so a peer erring by exactly that
// rounding passes as ov_sage and fails as a float32 peer, held to the float32 policy.
TEST_F(SweepPeers, OvSageIsJudgedByWhatItsRoundingCosts) {
  ::setenv("ATTN_FAKE_PEER", "ov_sage=sage,torch_sdpa=sage", 1);
  std::map<std::string, PointRecord> got;
  for (const auto& pf : sweep_points("peers_sage",
                                     R"({"description": "d", "implementations": ["naive"], "q_len": 64, "kv_len": 64,
                                         "q_heads": 4, "kv_heads": 2, "head_dim": 32, "causal": true, "threads": 1,
                                         "repetitions": 2, "min_time_s": 0.001, "peers": ["ov_sage", "torch_sdpa"]})"))
    got[pf.record.kernel] = pf.record;
  for (const char* k : {"naive", "ov_sage", "torch_sdpa"}) ASSERT_EQ(got.count(k), 1u) << k;
  const PointRecord& sage = got["ov_sage"];
  EXPECT_EQ(sage.status, PointStatus::Ok) << sage.reason;
  EXPECT_NE(sage.how.find("what rounding Q and K to int8 per token and V to u8"), std::string::npos) << sage.how;
  EXPECT_GT(sage.err_o_rel, got["naive"].tol_o_rel) << "the rounding is far above the float32 policy";
  EXPECT_LT(sage.err_o_rel, sage.tol_o_rel);
  EXPECT_EQ(got["torch_sdpa"].status, PointStatus::Failed) << "the same O from a float32 peer";
}

// ort_gqa on an integer cache keeps ONNX Runtime's own int8 / int4 cache (a scale per kv head and
// channel): judged by the float32 policy plus 4x what that rounding moves the float64 O, so a peer
// erring by exactly that rounding passes as ort_gqa and fails as a float32 peer (ggml_fa on the same
// u4 point is not run: it skips).
TEST_F(SweepPeers, OrtGqaIntCacheIsJudgedByWhatItsRoundingCosts) {
  ::setenv("ATTN_FAKE_PEER", "ort_gqa=ortint,ov_decode=ortint", 1);
  std::map<std::string, PointRecord> got;
  for (const auto& pf : sweep_points("peers_ortint",
                                     R"({"description": "d", "implementations": ["naive"], "q_len": 1, "kv_len": 96,
                                         "q_heads": 4, "kv_heads": 2, "head_dim": 32, "causal": true, "threads": 1,
                                         "kv_dtype": ["u8", "u4"], "repetitions": 2, "min_time_s": 0.001,
                                         "peers": ["ort_gqa", "ov_decode"]})"))
    got[pf.record.kernel + " " + to_string(pf.record.problem.kv_dtype)] = pf.record;
  for (const char* kv : {"u8", "u4"}) {
    const PointRecord& ort = got["ort_gqa " + std::string(kv)];
    EXPECT_EQ(ort.status, PointStatus::Ok) << kv << ": " << ort.reason;
    EXPECT_NE(ort.how.find("as ONNX Runtime's " + std::string(kv == std::string("u8") ? "int8" : "int4")),
              std::string::npos)
        << ort.how;
    EXPECT_GT(ort.err_o_rel, got["naive " + std::string(kv)].tol_o_rel) << kv << ": above the float32 policy";
    EXPECT_LT(ort.err_o_rel, ort.tol_o_rel) << kv;
    EXPECT_EQ(got["ov_decode " + std::string(kv)].status, PointStatus::Failed)
        << kv << ": the same O from a peer held to the float32 policy";
  }
}

TEST_F(SweepPeers, MissingEnvironmentOrLibrarySkipsWithTheReason) {
  {
    SweepOptions o = peer_options(fresh_dir("peers_nopython"));
    o.peers_python = "/nonexistent/bin/python";
    const SweepSummary s = run_sweep(peer_experiment(), o);
    EXPECT_EQ(s.ok, 4u);
    EXPECT_EQ(s.skipped, 16u);
    for (const auto& pf : read_points(o.out_dir)) {
      if (pf.record.kernel == "naive") continue;
      EXPECT_NE(pf.record.reason.find("no peers environment: /nonexistent/bin/python does not exist (scripts/lab "
                                      "peers-setup"),
                std::string::npos)
          << pf.record.reason;
    }
  }
  ::setenv("ATTN_FAKE_PEER_UNAVAILABLE", "1", 1);
  const std::string dir = fresh_dir("peers_unavailable");
  const SweepSummary s = run_sweep(peer_experiment(), peer_options(dir));
  EXPECT_EQ(s.skipped, 16u);
  for (const auto& pf : read_points(dir)) {
    if (pf.record.kernel != "naive") {
      EXPECT_EQ(pf.record.reason.rfind("fake ", 0), 0u) << pf.record.reason;
    }
  }
}

// A family with a venv of its own in the catalogue (zentorch: built for another torch than the torch
// family's) runs in that venv's Python whatever the pool's is; every other family in the pool's.
TEST(SweepPeerNames, AFamilyWithItsOwnVenvRunsInIt) {
  std::ifstream f(std::string(ATTNLAB_SOURCE_DIR) + "/scripts/peers/catalogue.json");
  ASSERT_TRUE(f) << "scripts/peers/catalogue.json";
  const Json doc = Json::parse(f);
  std::ostringstream log;
  PeerPool pool(log, "/the/pool/bin/python");
  int own = 0;
  for (const auto& [family, spec] : doc.at("families").items()) {
    if (spec.at("module").is_null()) continue;  // (no peer runs in it)
    const std::string want = spec.contains("venv") ? std::string(ATTNLAB_SOURCE_DIR) + "/" +
                                                         spec.at("venv").get<std::string>() + "/bin/python"
                                                   : "/the/pool/bin/python";
    EXPECT_EQ(pool.python_for(family), want) << family;
    own += spec.contains("venv");
  }
  EXPECT_EQ(pool.python_for("zentorch"), std::string(ATTNLAB_SOURCE_DIR) + "/.venv-zentorch/bin/python");
  EXPECT_GE(own, 1);
}

// The sweep's peers are the catalogue's rows (scripts/peers/catalogue.json, read by CMake): the same
// names, families and order.
TEST(SweepPeerNames, AreThePeersCatalogue) {
  std::ifstream f(std::string(ATTNLAB_SOURCE_DIR) + "/scripts/peers/catalogue.json");
  ASSERT_TRUE(f) << "scripts/peers/catalogue.json";
  const Json doc = Json::parse(f);
  std::vector<std::pair<std::string, std::string>> rows;
  for (const Json& p : doc.at("peers")) rows.emplace_back(p.at("name"), p.at("family"));
  EXPECT_EQ(peer_kernels(), rows);
  for (const auto& [name, family] : rows) EXPECT_NE(allowed_peers().find(name), std::string::npos) << name;
}

TEST(SweepPeerNames, FamiliesAndKernelsParseOthersAreRefusedByName) {
  EXPECT_EQ(parse_peers({"jax", "torch_sdpa", "ort_gqa"}, "peers"),
            (std::vector<std::string>{"torch_sdpa", "ort_gqa", "jax_dpa"}));
  EXPECT_EQ(parse_peers(split_list("torch,,ort"), "peers").size(), 4u);
  try {
    parse_peers({"tensorflow"}, "peers");
    FAIL() << "tensorflow accepted";
  } catch (const InvalidInput& e) {
    const std::string m = e.what();
    for (const char* part :
         {"peers: 'tensorflow' is not a peer", "torch, ort, ov, jax, ggml", "torch_flex", "ov_sdpa", "jax_dpa"}) {
      EXPECT_NE(m.find(part), std::string::npos) << m;
    }
  }
  const std::vector<std::string> names = {"naive"};
  for (const auto& [doc, part] : std::vector<std::pair<std::string, std::string>>{
           {R"({"description": "d", "q_len": 8, "peers": ["tf"]})", "key 'peers': peers: 'tf' is not a peer"},
           {R"({"description": "d", "q_len": 8, "peers": 3})", "key 'peers': bad value 3"},
           {R"({"description": "d", "q_len": 8, "peers": [1]})", "a list of peer names"}}) {
    try {
      parse_experiment(Json::parse(doc), "x", names);
      FAIL() << doc << " accepted";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  }
  const Experiment e = parse_experiment(Json::parse(R"({"description": "d", "q_len": 8, "peers": "ort"})"), "x", names);
  EXPECT_EQ(e.peers, (std::vector<std::string>{"ort_mha", "ort_gqa"}));
}

}  // namespace
}  // namespace attnlab::bench
