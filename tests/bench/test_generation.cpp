// The generation loop (src/bench/generation/generation.hpp) and Session::resize_kv, which it rests on:
// every step verified against the float64 reference, contexts and bytes as the steps run,
// a shrunk session computing exactly what a fresh one does, and bad configurations refused
// with the field named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "attnlab/kernel.hpp"
#include "bench/generation/generation.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

bench::GenerationConfig small(DType dtype = DType::F32) {
  bench::GenerationConfig c;
  c.name = "t";
  c.head.q_heads = 6, c.head.kv_heads = 2, c.head.head_dim = 40;
  c.head.dtype = dtype;
  c.prompt = 700, c.steps = 9, c.capacity = 1000;  // decode's key chunks crossed by the prompt
  c.threads = 2;
  c.verify_steps = 9;  // every step
  c.repetitions = 2;
  return c;
}

void expect_every_step_verified(const bench::GenerationResult& r) {
  const auto& c = r.config;
  ASSERT_EQ(static_cast<int64_t>(r.steps.size()), c.steps);
  for (size_t s = 0; s < r.steps.size(); ++s) {
    const auto& st = r.steps[s];
    EXPECT_EQ(st.context, c.prompt + static_cast<int64_t>(s) + 1);
    EXPECT_EQ(st.verdict, "PASS") << "step " << s << ": error " << st.err_o_rel << " > " << st.tol_o_rel;
    // The bytes a step reads: the K and V rows of its context, once per kv head.
    EXPECT_DOUBLE_EQ(st.kv_read_bytes, static_cast<double>(st.context) * c.kv_bytes_per_token());
    EXPECT_GT(st.attention_s, 0.0);
    EXPECT_GT(st.repeat_s, 0.0);
    EXPECT_DOUBLE_EQ(st.flops,
                     2.0 * (c.head.head_dim + c.head.dim_v()) * static_cast<double>(c.head.q_heads * st.context));
  }
  EXPECT_GT(r.median_repeat_s(), 0.0);
}

TEST(Generation, EveryStepAgreesWithTheReference) {
  const bench::GenerationResult r = bench::run_generation(small());
  expect_every_step_verified(r);
  EXPECT_EQ(r.prefill_verdict, "PASS");
  EXPECT_GT(r.prefill_s, 0.0);
}

TEST(Generation, SixteenBitCacheAndHeadDimV) {
  bench::GenerationConfig c = small(DType::BF16);
  c.head.head_dim_v = 24;
  c.head.kv_heads = 1;  // MQA
  const bench::GenerationResult r = bench::run_generation(c);
  expect_every_step_verified(r);
  EXPECT_DOUBLE_EQ(c.kv_bytes_per_token(), 2.0 * (40 + 24));
}

// A quantized cache: each token's K/V rows are written by the layout's rule as they are appended,
// decode reads them (every step verified against float64 on the cache), flash prefills the prompt
// over them, and the bytes per token are the layout's.
TEST(Generation, QuantizedCacheAppendsRowsAsTheLayoutWritesThem) {
  for (KvDType t : {KvDType::Q8_0, KvDType::Q4_0, KvDType::U8, KvDType::Fp8E5M2}) {
    bench::GenerationConfig c = small();
    c.head.head_dim = 64;
    c.head.kv_dtype = t;
    c.steps = 4, c.verify_steps = 4;
    const bench::GenerationResult r = bench::run_generation(c);
    SCOPED_TRACE(to_string(t));
    expect_every_step_verified(r);
    EXPECT_EQ(r.prefill_verdict, "PASS") << r.prefill_note;
    EXPECT_DOUBLE_EQ(c.kv_bytes_per_token(), 2.0 * c.head.kv_heads * static_cast<double>(kv_row_bytes(t, 64)));
  }
}

// A paged cache: tokens are appended into blocks taken from the pool as the sequence grows (its
// table growing, the blocks scattered), flash prefills the prompt and decode reads every step
// through the table - verified against float64 on the same cache at every step, for float32,
// 16-bit and quantized rows, blocks smaller and larger than decode's key chunk, a prompt ending
// mid-block (700 = 43 x 16 + 12) so steps fill it and take new ones.
TEST(Generation, PagedCacheTakesBlocksAsTokensArrive) {
  for (const auto& [dtype, kv, block] : std::vector<std::tuple<DType, KvDType, int64_t>>{
           {DType::F32, KvDType::Same, 16}, {DType::BF16, KvDType::Same, 256}, {DType::F32, KvDType::Q4_0, 64}}) {
    bench::GenerationConfig c = small(dtype);
    c.head.head_dim = 64;
    c.head.kv_dtype = kv;
    c.head.kv_block = block;
    SCOPED_TRACE(std::string(to_string(dtype)) + " " + to_string(kv) + " block " + std::to_string(block));
    const bench::GenerationResult r = bench::run_generation(c);
    expect_every_step_verified(r);
    EXPECT_EQ(r.prefill_verdict, "PASS") << r.prefill_note;
  }
}

// A query-aware sparse decode (Problem::topk): the cache keeps K's page summaries as rows are appended
// (contiguous and paged, float and u8 rows), every step attends the pages its query ranks first and is
// exact over them (verified against the problem masked to those pages), reads the budget's keys and the
// summaries instead of the whole context, and the prompt is prefilled over every key.
TEST(Generation, SparseDecodeKeepsSummariesAsTokensArrive) {
  for (const auto& [kv, block] : std::vector<std::pair<KvDType, int64_t>>{
           {KvDType::Same, 0}, {KvDType::U8, 0}, {KvDType::Same, 64}, {KvDType::U8, 16}}) {
    bench::GenerationConfig c = small();
    c.head.head_dim = 64, c.head.kv_dtype = kv, c.head.kv_block = block;
    c.head.topk_tokens = 256, c.head.topk_sinks = 16, c.head.topk_recent = 32;
    c.steps = 5, c.verify_steps = 5;
    SCOPED_TRACE(std::string(to_string(kv)) + " block " + std::to_string(block));
    const bench::GenerationResult r = bench::run_generation(c);
    ASSERT_EQ(static_cast<int64_t>(r.steps.size()), c.steps);
    EXPECT_EQ(r.prefill_verdict, "PASS") << r.prefill_note;
    for (const auto& st : r.steps) {
      EXPECT_EQ(st.verdict, "PASS") << "step " << st.step << ": error " << st.err_o_rel << " > " << st.tol_o_rel;
      EXPECT_LT(st.kv_read_bytes, 0.5 * static_cast<double>(st.context) * c.kv_bytes_per_token()) << st.step;
    }
  }
}

// MLA's latent cache: V is the first head_dim_v columns of K's rows; only K rows are appended.
// Each step equals the unshared problem whose V rows are those columns (verified against float64
// on the shared cache), and a token costs K's bytes only.
TEST(Generation, SharedLatentCacheWritesKOnly) {
  bench::GenerationConfig c = small();
  c.head.q_heads = 8, c.head.kv_heads = 1, c.head.head_dim = 72, c.head.head_dim_v = 64;
  c.head.kv_shared = true;
  for (int64_t block : {int64_t{0}, int64_t{32}}) {
    c.head.kv_block = block;
    const bench::GenerationResult r = bench::run_generation(c);
    expect_every_step_verified(r);
    EXPECT_DOUBLE_EQ(c.kv_bytes_per_token(), 72.0 * 4) << "K's row only";
  }
}

TEST(Generation, LongPromptsAreNotPrefilledAndSaySo) {
  bench::GenerationConfig c = small();
  c.prefill_max_tokens = 100;
  c.verify_steps = 1;
  const bench::GenerationResult r = bench::run_generation(c);
  EXPECT_LT(r.prefill_s, 0.0);
  EXPECT_NE(r.prefill_note.find("prefill_max_tokens"), std::string::npos) << r.prefill_note;
  EXPECT_EQ(r.steps.back().verdict, "PASS");
  EXPECT_EQ(r.steps.front().verdict, "");
}

TEST(Generation, BadConfigurationsNameTheField) {
  bench::GenerationConfig c = small();
  c.capacity = 100;
  EXPECT_THROW(
      {
        try {
          c.validate();
        } catch (const InvalidInput& e) {
          EXPECT_EQ(std::string(e.what()).rfind("capacity:", 0), 0u) << e.what();
          throw;
        }
      },
      InvalidInput);
  c = small();
  c.head.kv_heads = 4;  // does not divide 6
  EXPECT_THROW(c.validate(), InvalidInput);
  c = small();
  c.kernel = "flash_bf16";  // f32 cache: refused with the reason
  EXPECT_THROW(bench::run_generation(c), InvalidInput);
}

TEST(Generation, ExperimentFilesExpandRunsTimesPrompts) {
  const auto dir = std::filesystem::temp_directory_path() / ("attn_gen_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& text) {
    std::ofstream(dir / "g.json") << text;
    return (dir / "g.json").string();
  };
  const auto configs = bench::load_generation_experiment(
      write(R"({"kind": "generation", "description": "d", "q_heads": 8, "head_dim": 64, "prompts": [10, 20],
                "steps": 3, "runs": [{"name": "mha", "kv_heads": 8}, {"name": "mqa", "kv_heads": 1, "dtype": "bf16"}]})"),
      2);
  ASSERT_EQ(configs.size(), 4u);
  EXPECT_EQ(configs[0].name, "mha");
  EXPECT_EQ(configs[1].prompt, 20);
  EXPECT_EQ(configs[3].head.kv_heads, 1);
  EXPECT_EQ(configs[3].head.dtype, DType::BF16);
  EXPECT_EQ(configs[3].threads, 2);
  const auto refused = [&](const std::string& text, const std::string& want) {
    try {
      bench::load_generation_experiment(write(text), 2);
      ADD_FAILURE() << "accepted: " << text;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused(R"({"description": "d", "runs": [{"name": "a"}]})", "'kind'");
  refused(R"({"kind": "generation", "description": "d", "runs": [{"name": "a", "colour": 1}]})",
          "unknown key 'colour'");
  refused(R"({"kind": "generation", "description": "d", "steps": 0, "runs": [{"name": "a"}]})", "key 'steps'");
  refused(R"({"kind": "generation", "description": "d", "runs": [{"name": "a/b"}]})", "name");
  // The heads and settings are the point schema's axes, with their grammar and errors.
  refused(R"({"kind": "generation", "description": "d", "runs": [{"name": "a", "dtype": "f8"}]})",
          "run 'a': key 'dtype': bad value \"f8\"; allowed: \"f32\", \"bf16\", \"f16\"");
  refused(R"({"kind": "generation", "description": "d", "q_heads": 8, "runs": [{"name": "a", "gqa_groups": 3}]})",
          "key 'gqa_groups': bad value 3");
  refused(R"({"kind": "generation", "description": "d", "layout": "bshd", "runs": [{"name": "a"}]})",
          "layout: bshd; allowed: bhsd");
  const auto grouped = bench::load_generation_experiment(
      write(R"({"kind": "generation", "description": "d", "q_heads": 8, "runs": [{"name": "a", "gqa_groups": 4}]})"),
      2);
  EXPECT_EQ(grouped[0].head.kv_heads, 2) << "gqa_groups sets kv_heads from q_heads";
  std::filesystem::remove_all(dir);
}

// A session shrunk with resize_kv computes bit for bit what a session made for that kv_len
// does, and refuses to grow past what it was made for.
TEST(Session, ResizeKvMatchesAFreshSession) {
  Problem big = test::shape(1, 8, 2, 1, 1500, 64);
  big.causal = CausalAlign::BottomRight;
  Problem p = big;
  p.kv_len = 777;
  Tensors t = random_tensors(big, 3);
  Inputs in = t.inputs;
  in.k.seq = in.v.seq = p.kv_len;  // the first 777 keys of the bigger cache
  const Kernel& k = kernel_or_throw("decode");
  Session grown(k, big, 2), fresh(k, p, 2);
  grown.resize_kv(p.kv_len);
  Tensors a = allocate_outputs(p), b = allocate_outputs(p);
  grown.run(in, a.outputs);
  fresh.run(in, b.outputs);
  for (int64_t n = 0; n < p.o_elems(); ++n) ASSERT_EQ(a.o[n], b.o[n]) << n;
  EXPECT_THROW(grown.resize_kv(1501), InvalidInput);
  EXPECT_THROW(grown.resize_kv(0), InvalidInput);
}

}  // namespace
}  // namespace attnlab
