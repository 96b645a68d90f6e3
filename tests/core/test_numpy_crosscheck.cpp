// Outputs made elsewhere: scripts/numpy_attention.py computes attention with numpy from a
// dense mask built PyTorch-style (tril offsets, repeat_interleave for GQA, padding masks),
// sharing no code with the lab; `attnlab verify --expect` must accept them for every
// kernel, and must reject them when the mask flags differ.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

namespace {

namespace fs = std::filesystem;

int run(const std::string& cmd, std::string* out) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), pipe)) out->append(buf.data(), n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

struct Case {
  const char* name;
  const char* shape;  // numpy_attention.py shape flags
  const char* mask;   // mask flags, identical for both tools
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name << ": " << c.shape << " " << c.mask; }

class NumpyCrossCheck : public ::testing::TestWithParam<Case> {};

TEST_P(NumpyCrossCheck, EveryKernelAgreesWithNumpy) {
  const Case& c = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("attn_np_" + std::to_string(::getpid()) + c.name);
  std::string out;
  const std::string gen = std::string("/usr/bin/python3 ") + ATTNLAB_SOURCE_DIR + "/scripts/numpy_attention.py " +
                          dir.string() + " " + c.shape + " " + c.mask;
  ASSERT_EQ(run(gen, &out), 0) << gen << "\n" << out;
  const std::string files = " --q " + (dir / "q.npy").string() + " --k " + (dir / "k.npy").string() + " --v " +
                            (dir / "v.npy").string() + " --expect " + (dir / "o.npy").string();
  const std::string verify = std::string(ATTNLAB_EXE) + " verify --impl all" + files + " --expect-lse " +
                             (dir / "lse.npy").string() + " " + c.mask;
  out.clear();
  EXPECT_EQ(run(verify, &out), 0) << verify << "\n" << out;
  EXPECT_NE(out.find("-> agrees"), std::string::npos) << out;
  // The same files checked without the mask must fail (the check has teeth).
  if (std::string(c.mask).find("--layout bshd") == std::string::npos) {
    out.clear();
    EXPECT_EQ(run(std::string(ATTNLAB_EXE) + " verify --impl naive" + files, &out), 1) << out;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Semantics, NumpyCrossCheck,
    ::testing::Values(
        Case{"causal_short_query_gqa", "--batch 2 --q-heads 6 --kv-heads 2 --q-len 5 --kv-len 37 --head-dim 24",
             "--causal"},
        Case{"causal_long_query_kvlens_bshd", "--batch 3 --q-heads 4 --kv-heads 1 --q-len 40 --kv-len 17 --head-dim 80",
             "--causal --kv-lens 17,0,9 --layout bshd"},
        Case{"top_left_pytorch", "--batch 1 --q-heads 2 --kv-heads 2 --q-len 7 --kv-len 30 --head-dim 32",
             "--causal-top-left"},
        Case{"window_both_sides", "--batch 2 --q-heads 8 --kv-heads 2 --q-len 33 --kv-len 65 --head-dim 64",
             "--window 6,2 --kv-lens 65,20"},
        Case{"decode_mqa_scale", "--batch 1 --q-heads 8 --kv-heads 1 --q-len 1 --kv-len 500 --head-dim 128",
             "--causal --scale 0.3"},
        // d_v != d_qk (MLA): V's (and O's) last dimension differs from Q's and K's.
        Case{"head_dim_v_mla", "--batch 2 --q-heads 4 --kv-heads 1 --q-len 9 --kv-len 70 --head-dim 72 --head-dim-v 40",
             "--causal"},
        // The score modifications, written as the models' eager code writes them (a sink logit as a
        // column appended to the scores), with a batch entry whose rows see no key.
        Case{"score_mods", "--batch 2 --q-heads 6 --kv-heads 2 --q-len 9 --kv-len 70 --head-dim 32",
             "--causal --kv-lens 70,0 --softcap 2.5 --alibi --sink-logits 0.5,-1,2,0,1,3"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
