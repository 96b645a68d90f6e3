// The CUDA kernels (issue 5), in three layers:
//  1. host side, every build: registry entries, the availability reason ("built without CUDA" /
//     "no CUDA device (...)"), `attnlab list`, a clear error instead of a crash when run without
//     a device, and how Problem + views become the kernels' DeviceArgs;
//  2. the device code itself, through the host emulation (src/cuda/emu.hpp): cuda_naive and
//     cuda_flash as compiled from src/cuda/*.cu, against the float64 reference, on every machine
//     (plus self-tests showing the emulation notices missing and divergent barriers);
//  3. the real device: event timing and non-dense output views; skipped (GTEST_SKIP with the
//     reason) without one. The agreement grid on the device is tests/kernels/test_agreement.cpp, which
//     takes the kernels from the registry.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "attnlab/cuda.hpp"
#include "attnlab/kernel.hpp"
#include "attnlab/verify.hpp"
#include "cuda/host_args.hpp"
#include "cuda/tile_plan.hpp"
#include "cuda/fragments.hpp"
#if defined(ATTN_HAS_CUDA)
#include "cuda/tensor_core_check.hpp"
#endif
#include "cuda_emu.hpp"
#include "test_util.hpp"

namespace attnlab::cuda_emu::selftest {  // tests/kernels/cuda_emu_kernels.cpp
void run(int which, float* out, unsigned threads);
void mma(const uint16_t* A, const uint16_t* B, const float* C, float* D, int leave_lane);
void ldmatrix(const uint16_t* M, uint32_t* out, bool trans);
void ldmatrix_then_mma(const uint16_t* A, const uint16_t* B, float* D);
}  // namespace attnlab::cuda_emu::selftest

namespace attnlab {
namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

std::string run_command(const std::string& cmd, int* rc) {
  std::string out;
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  *rc = pclose(f);
  return out;
}

// ---- 1. host side ----------------------------------------------------------------------

TEST(Cuda, KernelsAreRegisteredLastInLadderOrder) {
  const auto& reg = registry();
  ASSERT_GE(reg.size(), 5u);
  EXPECT_EQ(reg[reg.size() - 4], &cuda::naive());
  EXPECT_EQ(reg[reg.size() - 3], &cuda::flash());
  EXPECT_EQ(reg[reg.size() - 2], &cuda::flash_bf16());
  EXPECT_EQ(reg[reg.size() - 1], &cuda::decode());
  EXPECT_EQ(find_kernel("cuda_naive"), &cuda::naive());
  EXPECT_EQ(find_kernel("cuda_flash"), &cuda::flash());
  EXPECT_EQ(find_kernel("cuda_flash_bf16"), &cuda::flash_bf16());
  EXPECT_TRUE(cuda::is_cuda_kernel(cuda::flash_bf16()));
  EXPECT_EQ(find_kernel("cuda_decode"), &cuda::decode());
  EXPECT_TRUE(cuda::is_cuda_kernel(cuda::decode()));
  EXPECT_EQ(cuda::flash_bf16().arithmetic(), Arithmetic::Bf16Products);
  // One list (src/cuda/kernel_list.hpp): the registry's CUDA kernels are cuda::kernels(), in order,
  // and each emulated kernel declares its registry kernel's capabilities.
  const auto& all = cuda::kernels();
  ASSERT_EQ(all.size(), 4u);
  EXPECT_TRUE(std::equal(all.begin(), all.end(), reg.end() - 4));
  for (const Kernel* k : all) {
    const std::string id = std::string(k->name()).substr(5);  // "cuda_<id>"
    const Capabilities c = k->capabilities(), e = test::emulated_cuda(id).capabilities();
    EXPECT_EQ(e.patterns, c.patterns) << id;
    EXPECT_EQ(e.kv_quant, c.kv_quant) << id;
    EXPECT_EQ(e.max_q_len, c.max_q_len) << id;
    EXPECT_EQ(e.max_head_dim, c.max_head_dim) << id;
    EXPECT_EQ(e.arithmetic, c.arithmetic) << id;
    EXPECT_EQ(test::emulated_cuda(id).name(), "emu_" + std::string(k->name()));
  }
  EXPECT_TRUE(cuda::is_cuda_kernel(cuda::flash()));
  EXPECT_FALSE(cuda::is_cuda_kernel(*reg[0]));
}

TEST(Cuda, AvailabilityExplainsItself) {
  const Support s = cuda::device_status();
  for (const Kernel* k : {&cuda::naive(), &cuda::flash(), &cuda::flash_bf16()}) {
    EXPECT_EQ(k->available().ok, s.ok);
    EXPECT_EQ(k->available().reason, s.reason);
  }
#if defined(ATTN_HAS_CUDA)
  if (s) {
    ASSERT_TRUE(cuda::device_info());
    GTEST_SKIP() << "a CUDA device is present: " << cuda::device_info()->describe();
  }
  EXPECT_TRUE(starts_with(s.reason, "no CUDA device (") || starts_with(s.reason, "no supported CUDA device ("))
      << s.reason;
  EXPECT_EQ(s.reason.back(), ')') << s.reason;
  EXPECT_GT(s.reason.size(), std::string("no CUDA device ()").size()) << "the runtime's error text is missing";
  EXPECT_FALSE(cuda::device_info());
#else
  EXPECT_FALSE(s);
  EXPECT_TRUE(starts_with(s.reason, "built without CUDA")) << s.reason;
  EXPECT_FALSE(cuda::device_info());
#endif
}

TEST(Cuda, RunningWithoutADeviceIsAClearErrorNotACrash) {
  const Support status = cuda::device_status();
  if (status) GTEST_SKIP() << "a CUDA device is present";
  Problem p = test::shape(1, 2, 1, 5, 7, 16);
  Tensors t = random_tensors(p, 1);
  for (const Kernel* k : {&cuda::naive(), &cuda::flash()}) {
    try {
      Session s(*k, p, 1);
      ADD_FAILURE() << k->name() << ": Session accepted a kernel that cannot run";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(status.reason), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string(k->name())), std::string::npos) << e.what();
    }
    // Bypassing Session: still an exception with the reason, never a crash or silent success.
    RunContext ctx;
    try {
      k->run(p, t.inputs, t.outputs, ctx);
      ADD_FAILURE() << k->name() << ": run() returned without a device";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_TRUE(what.find("CUDA") != std::string::npos) << what;
    }
    const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
    const KernelCheck c = check_kernel(*k, p, t.inputs, a, 1);
    EXPECT_EQ(c.verdict, Verdict::Skip);
    EXPECT_EQ(c.reason, status.reason);
  }
  EXPECT_FALSE(cuda::last_timing());
  cuda::release_device_memory();  // harmless without a device
}

TEST(Cuda, ListShowsTheCudaKernelsWithTheReason) {
  int rc = -1;
  const std::string out = run_command(test::attnlab_exe() + " list", &rc);
  EXPECT_EQ(rc, 0) << out;
  for (const char* name : {"cuda_naive", "cuda_flash"}) {
    EXPECT_NE(out.find(name), std::string::npos) << out;
  }
  const Support s = cuda::device_status();
  if (!s) {
    EXPECT_NE(out.find("[unavailable: " + s.reason + "]"), std::string::npos) << out;
  }
}

TEST(Cuda, CudaCommandSaysWhyThereIsNoDevice) {
  const Support s = cuda::device_status();
  if (s) GTEST_SKIP() << "a CUDA device is present";
  int rc = -1;
  std::string out = run_command(test::attnlab_exe() + " cuda", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("CUDA: unavailable: " + s.reason), std::string::npos) << out;
  out = run_command(test::attnlab_exe() + " cuda --time --q-len 64", &rc);
  EXPECT_EQ(WEXITSTATUS(rc), 2) << out;  // bad input: no device to time
  EXPECT_NE(out.find(s.reason), std::string::npos) << out;
}

TEST(Cuda, DeviceArgsCarryStridesMaskAndScale) {
  Problem p = test::shape(3, 6, 2, 9, 20, 24);
  p.layout = Layout::BSHD;
  p.kv_lens = {0, 20, 7};
  p.window_left = 4, p.window_right = 0;
  Tensors t = random_tensors(p, 3);
  const cuda_impl::DeviceArgs a = cuda_impl::device_args(p, t.inputs, t.outputs);
  EXPECT_EQ(a.q, t.inputs.q.data);
  EXPECT_EQ(a.o, t.outputs.o.data);
  EXPECT_EQ(a.lse, t.outputs.lse);
  EXPECT_EQ(a.qs.s, p.q_heads * p.head_dim);  // BSHD: a sequence step skips every head
  EXPECT_EQ(a.ks.h, p.head_dim);
  EXPECT_EQ(a.os.b, t.outputs.o.stride_b);
  EXPECT_EQ(a.group(), 3);
  EXPECT_FLOAT_EQ(a.scale, 1.f / std::sqrt(24.f));
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t i = 0; i < p.q_len; ++i) {
      EXPECT_EQ(a.mask(b).row(i).lo, p.visible(b, i).lo);
      EXPECT_EQ(a.mask(b).row(i).hi, p.visible(b, i).hi);
    }
  EXPECT_EQ(cuda_impl::span_elems(t.inputs.q), p.q_elems());
  EXPECT_EQ(cuda_impl::span_elems(t.inputs.k), p.kv_elems());
  EXPECT_EQ(a.lse_index(2, 5, 8), p.lse_elems() - 1);
  EXPECT_EQ(a.dtype, DType::F32);
  // 16-bit storage: the 16-bit views, their strides and extents (elements of 2 bytes).
  Problem p16 = p;
  p16.dtype = DType::BF16;
  const Tensors t16 = random_tensors(p16, 3);
  const cuda_impl::DeviceArgs a16 = cuda_impl::device_args(p16, t16.inputs, t16.outputs);
  EXPECT_EQ(a16.dtype, DType::BF16);
  EXPECT_EQ(a16.k, t16.inputs.k16.data);
  EXPECT_EQ(a16.ks.s, a.ks.s);
  EXPECT_EQ(cuda_impl::input_extents(t16.inputs).v, p.kv_elems());

  Outputs bad = t.outputs;
  bad.o.stride_s = -bad.o.stride_s;
  EXPECT_THROW(cuda_impl::device_args(p, t.inputs, bad), InvalidInput);
  Inputs overlap = t.inputs;
  overlap.k.stride_s = p.head_dim - 1;
  EXPECT_THROW(cuda_impl::device_args(p, overlap, t.outputs), InvalidInput);
}

TEST(Cuda, FlashRefusesShapesBeyondTheGridLimits) {
  Problem p = test::shape(1, 70000, 70000, 4, 4, 64);
  const char* why = cuda_emu::flash_ops.unsupported(cuda_impl::problem_args(p));
  EXPECT_NE(std::string(why).find("kv_heads"), std::string::npos) << why;
  p = test::shape(70000, 1, 1, 4, 4, 64);
  EXPECT_NE(std::string(cuda_emu::flash_ops.unsupported(cuda_impl::problem_args(p))).find("batch"), std::string::npos);
  p = test::shape(2, 8, 2, 300, 300, 64);
  EXPECT_STREQ(cuda_emu::flash_ops.unsupported(cuda_impl::problem_args(p)), "");
  // Shared memory stays within what sm_86/89 parts allow (99 KiB) for every head_dim bucket.
  for (int64_t d : {1, 32, 33, 64, 96, 128, 200, 256, 512}) {
    p.head_dim = d;
    EXPECT_LE(cuda_emu::flash_ops.smem_bytes(cuda_impl::problem_args(p)), 99 * 1024) << d;
  }
  // The bucket holds the wider of head_dim and head_dim_v; above 512 the reason names both.
  p.head_dim = 64, p.head_dim_v = 200;
  EXPECT_EQ(cuda_emu::flash_ops.smem_bytes(cuda_impl::problem_args(p)),
            cuda_emu::flash_ops.smem_bytes(cuda_impl::problem_args(test::shape(2, 8, 2, 300, 300, 256))));
  p.head_dim = 576, p.head_dim_v = 512;
  EXPECT_NE(std::string(cuda_emu::flash_ops.unsupported(cuda_impl::problem_args(p))).find("head_dim_v"),
            std::string::npos);
}

// cuda_flash's tile plan, exhaustively over small masks: every visible key of a block lies in
// the visited span, and a tile said to need no mask is seen whole by every row of the block.
TEST(Cuda, FlashTilePlanCoversEveryKeyAndMasksEveryCutTile) {
  int64_t full_tiles = 0, masked_tiles = 0;
  for (int64_t q_len = 1; q_len <= 9; ++q_len)
    for (int64_t kv_len : {1, 2, 5, 9, 16})
      for (CausalAlign causal : {CausalAlign::None, CausalAlign::BottomRight, CausalAlign::TopLeft})
        for (int64_t left : {-1, 0, 2})
          for (int64_t right : {-1, 0, 3})
            for (int64_t group : {1, 3})
              for (int64_t rows : {1, 4, 6})
                for (int64_t width : {1, 3, 4}) {
                  const MaskSpec mask{q_len, kv_len, causal, left, right};
                  const int64_t rows_total = group * q_len;
                  for (int64_t t0 = 0; t0 < rows_total; t0 += rows) {
                    const cuda_impl::TilePlan plan = cuda_impl::plan_block(mask, t0, rows, rows_total, group);
                    for (int64_t t = t0; t < std::min(t0 + rows, rows_total); ++t) {
                      const Interval iv = mask.row(t / group);
                      if (iv.empty()) continue;
                      ASSERT_LE(plan.span.lo, iv.lo);
                      ASSERT_GE(plan.span.hi, iv.hi);
                    }
                    for (int64_t j0 = plan.span.lo; j0 < plan.span.hi; j0 += width) {
                      if (plan.needs_mask(j0, width)) {
                        ++masked_tiles;
                        continue;
                      }
                      ++full_tiles;
                      for (int64_t t = t0; t < t0 + rows; ++t) {
                        ASSERT_LT(t, rows_total) << "a block with absent rows has no mask-free tile";
                        const Interval iv = mask.row(t / group);
                        ASSERT_TRUE(iv.lo <= j0 && j0 + width <= iv.hi)
                            << "tile [" << j0 << ", " << j0 + width << ") row " << t / group << " sees [" << iv.lo
                            << ", " << iv.hi << ")";
                      }
                    }
                  }
                }
  // Both kinds occur: the plan neither masks everything (no speed-up) nor nothing.
  EXPECT_GT(full_tiles, 1000);
  EXPECT_GT(masked_tiles, 1000);
}

// ---- 2. device code under the host emulation -------------------------------------------

TEST(CudaEmulation, NoticesAMissingBarrier) {
  constexpr unsigned kThreads = 64;
  std::vector<float> out(kThreads);
  cuda_emu::selftest::run(0, out.data(), kThreads);
  int wrong = 0;
  for (unsigned t = 0; t < kThreads; ++t) wrong += out[t] != static_cast<float>((t + 1) % kThreads);
  EXPECT_GT(wrong, 0) << "without __syncthreads some thread must read a slot not yet written";
  cuda_emu::selftest::run(1, out.data(), kThreads);
  for (unsigned t = 0; t < kThreads; ++t) EXPECT_EQ(out[t], static_cast<float>((t + 1) % kThreads));
}

// cp.async's model: a copy read before its wait (and the barrier after it) may not have landed.
TEST(CudaEmulation, CpAsyncLandsByTheWaitNotBefore) {
  constexpr unsigned kThreads = 128;
  std::vector<float> out(kThreads);
  cuda_emu::selftest::run(9, out.data(), kThreads);  // waited, then the barrier
  for (unsigned t = 0; t < kThreads; ++t) EXPECT_EQ(out[t], static_cast<float>(4 * ((t + 1) % kThreads))) << t;
  cuda_emu::selftest::run(10, out.data(), kThreads);  // the barrier without the wait
  int unlanded = 0;
  for (unsigned t = 0; t < kThreads; ++t) unlanded += std::isnan(out[t]);
  EXPECT_GT(unlanded, 10) << "copies not waited for must be able to land late";
  EXPECT_LT(unlanded, 118) << "and early";
  for (const int which : {11, 12}) {
    try {
      cuda_emu::selftest::run(which, out.data(), kThreads);
      ADD_FAILURE() << (which == 11 ? "a misaligned cp.async" : "copies never waited for") << " accepted";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(which == 11 ? "addresses not aligned" : "never waited for"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(CudaEmulation, ReportsADivergentBarrierInsteadOfHanging) {
  std::vector<float> out(64);
  EXPECT_THROW(cuda_emu::selftest::run(2, out.data(), 64), std::runtime_error);
}

TEST(CudaEmulation, ChecksShuffleMasks) {
  constexpr unsigned kThreads = 64;
  std::vector<float> out(kThreads, -1.f);
  try {
    cuda_emu::selftest::run(4, out.data(), kThreads);
    ADD_FAILURE() << "a mask that leaves out lanes taking part was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves out its own lane"), std::string::npos) << e.what();
  }
  try {
    cuda_emu::selftest::run(5, out.data(), kThreads);
    ADD_FAILURE() << "a read from a lane outside the mask was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("leaves out the lane it reads, 16"), std::string::npos) << e.what();
  }
  cuda_emu::selftest::run(6, out.data(), kThreads);  // legal: each half-warp with its own mask
  for (unsigned t = 0; t < kThreads; ++t) EXPECT_EQ(out[t], static_cast<float>(t ^ 1u)) << t;
}

// ---- tensor cores (src/cuda/tensor_core.cuh): the PTX ISA's fragment tables ----------------

// Small integers (exact in bf16, their products and sums exact in float32).
std::vector<uint16_t> bf16_matrix(int rows, int cols, int mul, int mod) {
  std::vector<uint16_t> m(static_cast<size_t>(rows * cols));
  for (int e = 0; e < rows * cols; ++e) m[e] = to_bf16(static_cast<float>(e * mul % mod - mod / 2)).bits;
  return m;
}
float bf16_value(uint16_t bits) { return to_float(bf16{bits}); }

// The checks, for any runner of the self-test kernels (src/cuda/tensor_core_selftest.cuh): the
// emulation's here, the GPU's under CudaDevice below.
using MmaRun = std::function<void(const uint16_t*, const uint16_t*, const float*, float*)>;
using LdmatrixRun = std::function<void(const uint16_t*, uint32_t*, bool)>;
using LdmatrixMmaRun = std::function<void(const uint16_t*, const uint16_t*, float*)>;

void expect_mma_follows_the_tables(const MmaRun& run) {
  // mma.m16n8k16 .bf16 with fragments gathered by the tables (groupID g = lane / 4, t = lane % 4):
  // A's a0..a7 at rows g, g + 8 and columns 2t (+1), +8; B's b0..b3 at k 2t (+1), +8 and column g;
  // C/D's c0..c3 at rows g, g + 8 and columns 2t, 2t + 1. D = A B + C must land in those registers.
  const std::vector<uint16_t> A = bf16_matrix(16, 16, 7, 11), B = bf16_matrix(16, 8, 5, 9);
  std::vector<float> C(16 * 8), D(32 * 4, std::nanf(""));
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 8; ++c) C[r * 8 + c] = static_cast<float>(r - c);
  run(A.data(), B.data(), C.data(), D.data());
  const auto want = [&](int r, int c) {
    float acc = C[r * 8 + c];
    for (int k = 0; k < 16; ++k) acc += bf16_value(A[r * 16 + k]) * bf16_value(B[k * 8 + c]);
    return acc;
  };
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
      EXPECT_EQ(D[lane * 4 + i], want(row, col)) << "lane " << lane << " d" << i;
    }
  }
  // The tables' own corners: lane 0 holds D[0][0], D[0][1], D[8][0], D[8][1]; lane 5 (group 1,
  // thread 1) D[1][2], D[1][3], D[9][2], D[9][3]; lane 31 D[7][6], D[7][7], D[15][6], D[15][7].
  EXPECT_EQ(D[0 * 4 + 2], want(8, 0));
  EXPECT_EQ(D[5 * 4 + 1], want(1, 3));
  EXPECT_EQ(D[31 * 4 + 3], want(15, 7));
}

void expect_ldmatrix_follows_the_tables(const LdmatrixRun& run) {
  // Lane l gives row l % 8 of matrix l / 8; it receives, of each matrix j, the elements at row
  // l / 4, columns 2 (l % 4) and +1 (low half first) - with .trans, column l / 4 of rows 2 (l % 4), +1.
  std::vector<uint16_t> M(256);
  for (int e = 0; e < 256; ++e) M[e] = static_cast<uint16_t>(1000 + e);
  for (bool trans : {false, true}) {
    std::vector<uint32_t> out(128, 0xdeadbeefu);
    run(M.data(), out.data(), trans);
    for (int lane = 0; lane < 32; ++lane) {
      for (int j = 0; j < 4; ++j) {
        for (int h = 0; h < 2; ++h) {
          const int r = trans ? 2 * (lane % 4) + h : lane / 4, c = trans ? lane / 4 : 2 * (lane % 4) + h;
          EXPECT_EQ(out[lane * 4 + j] >> (16 * h) & 0xffffu, M[j * 64 + r * 8 + c])
              << (trans ? ".trans " : "") << "lane " << lane << " matrix " << j << " half " << h;
        }
      }
    }
  }
}

void expect_ldmatrix_feeds_mma(const LdmatrixMmaRun& run) {
  // A (16 x 16) by ldmatrix_x4 and B (16 x 16, k down, as V is stored) by ldmatrix_x4.trans, two
  // m16n8k16 products: D = A B whole.
  const std::vector<uint16_t> A = bf16_matrix(16, 16, 7, 11), B = bf16_matrix(16, 16, 5, 13);
  std::vector<float> D(256, std::nanf(""));
  run(A.data(), B.data(), D.data());
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      float acc = 0;
      for (int k = 0; k < 16; ++k) acc += bf16_value(A[r * 16 + k]) * bf16_value(B[k * 16 + c]);
      EXPECT_EQ(D[r * 16 + c], acc) << "D[" << r << "][" << c << "]";
    }
  }
}

TEST(CudaEmulation, MmaFragmentsFollowThePtxTables) {
  expect_mma_follows_the_tables(
      [](const uint16_t* A, const uint16_t* B, const float* C, float* D) { cuda_emu::selftest::mma(A, B, C, D, -1); });
  for (int lane = 0; lane < 32; ++lane) {  // the kernels' copy of the tables (src/cuda/fragments.hpp)
    for (int i = 0; i < 4; ++i) {
      const tensor_core::Coord c = tensor_core::mma_c(lane, i);
      EXPECT_TRUE(c.row == lane / 4 + 8 * (i / 2) && c.col == 2 * (lane % 4) + i % 2)
          << "mma_c(" << lane << ", " << i << ")";
    }
    for (int i = 0; i < 8; ++i) {
      const tensor_core::Coord a = tensor_core::mma_a(lane, i);
      EXPECT_TRUE(a.row == lane / 4 + 8 * ((i == 2 || i == 3 || i == 6 || i == 7) ? 1 : 0) &&
                  a.col == 2 * (lane % 4) + (i & 1) + (i >= 4 ? 8 : 0))
          << "mma_a(" << lane << ", " << i << ")";
    }
    for (int i = 0; i < 4; ++i) {
      const tensor_core::Coord b = tensor_core::mma_b(lane, i);
      EXPECT_TRUE(b.row == 2 * (lane % 4) + (i & 1) + (i >= 2 ? 8 : 0) && b.col == lane / 4)
          << "mma_b(" << lane << ", " << i << ")";
    }
  }
}

TEST(CudaEmulation, LdmatrixDeliversTheTablesElements) {
  expect_ldmatrix_follows_the_tables(cuda_emu::selftest::ldmatrix);
}

TEST(CudaEmulation, LdmatrixFeedsMmaAsAFlashKernelUsesThem) {
  expect_ldmatrix_feeds_mma(cuda_emu::selftest::ldmatrix_then_mma);
}

TEST(CudaEmulation, LdmatrixNeedsAlignedSharedRows) {
  std::vector<float> out(32);
  try {
    cuda_emu::selftest::run(8, out.data(), 32);
    ADD_FAILURE() << "a misaligned ldmatrix row was accepted";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();  // (the lane that reports first: the fibers run shuffled)
    EXPECT_TRUE(what.find("ldmatrix_x4 at lane ") != std::string::npos &&
                what.find(": a row address that is not 16 bytes of shared memory") != std::string::npos)
        << what;
  }
}

TEST(CudaEmulation, MmaNeedsTheWholeWarp) {
  const std::vector<uint16_t> A = bf16_matrix(16, 16, 7, 11), B = bf16_matrix(16, 8, 5, 9);
  std::vector<float> C(128, 0.f), D(128);
  try {
    cuda_emu::selftest::mma(A.data(), B.data(), C.data(), D.data(), 31);  // lane 31 returns first
    ADD_FAILURE() << "an mma without lane 31 was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("lane 31 of the warp is not at it"), std::string::npos) << e.what();
  }
}

TEST(CudaEmulation, UnwrittenSharedMemoryIsNan) {
  constexpr unsigned kThreads = 32;
  std::vector<float> out(kThreads, 1.f);
  cuda_emu::selftest::run(7, out.data(), kThreads);
  for (unsigned t = 0; t < kThreads; ++t)
    EXPECT_TRUE(std::isnan(out[t])) << "0 x unwritten memory must stay visible, lane " << t;
}

// Fully masked rows are written (O = 0, LSE = -inf), not left to whatever the buffer held: the
// emulated kernels start from NaN outputs, as fresh device memory could hold, and the host
// buffer's zeros here would otherwise hide a missing write.
TEST(CudaEmulation, FullyMaskedRowsAreWrittenFromANanStart) {
  Problem p = test::shape(1, 2, 1, 12, 5, 16);
  p.causal = CausalAlign::BottomRight;  // rows 0..6 see no key
  Tensors t = random_tensors(p, 5);
  for (const char* which : {"naive", "flash"}) {
    std::fill_n(t.outputs.o.data, p.q_elems(), 0.f);
    Session s(test::emulated_cuda(which), p, 1);
    s.run(t.inputs, t.outputs);
    for (int64_t i = 0; i < 7; ++i) {
      EXPECT_EQ(t.outputs.o.row(0, 1, i)[0], 0.f) << which << " row " << i;
      EXPECT_EQ(t.outputs.lse[p.q_len + i], -std::numeric_limits<float>::infinity()) << which << " row " << i;
    }
  }
}

// A non-dense O with one query row: the seq stride is never used (any value passes the view
// check), so the 2-D copy back must not take it as its pitch (cudaMemcpy2D needs pitch >= width).
TEST(Cuda, OneRowOutputCopiesBackWithAValidPitch) {
  Problem p = test::shape(2, 3, 1, 1, 40, 24);
  Tensors t = random_tensors(p, 2);
  std::vector<float> o(static_cast<size_t>(p.batch * p.q_heads * (p.head_dim + 5)));
  for (int64_t stride_s : {int64_t{0}, int64_t{1}, int64_t{7}}) {
    const Outputs out{MutView{o.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.q_heads * (p.head_dim + 5),
                              p.head_dim + 5, stride_s},
                      t.outputs.lse};
    const cuda_impl::DeviceArgs a = cuda_impl::device_args(p, t.inputs, out);
    const cuda_impl::RowBlockCopy c = cuda_impl::o_row_blocks(a);
    EXPECT_EQ(c.width, p.head_dim);
    EXPECT_EQ(c.rows, 1);
    EXPECT_GE(c.pitch, c.width) << "seq stride " << stride_s;
  }
  p.q_len = 5;
  const int64_t pitch = 31;
  std::vector<float> o5(static_cast<size_t>(p.batch * p.q_heads * p.q_len * pitch));
  Tensors t5 = random_tensors(p, 2);
  const Outputs out5{
      MutView{o5.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.q_heads * p.q_len * pitch, p.q_len * pitch, pitch},
      t5.outputs.lse};
  const cuda_impl::RowBlockCopy c5 = cuda_impl::o_row_blocks(cuda_impl::device_args(p, t5.inputs, out5));
  EXPECT_EQ(c5.pitch, pitch);
  EXPECT_EQ(c5.rows, 5);
}

TEST(Cuda, TimeLaunchesRefusesWhatItCannotTime) {
  Problem p = test::shape(1, 2, 1, 8, 8, 16);
  Tensors t = random_tensors(p, 1);
  Session cpu(*registry().front(), p, 1);
  try {
    cuda::time_launches(cpu, t.inputs, t.outputs, 3);
    ADD_FAILURE() << "a CPU kernel was timed as a CUDA kernel";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("is not a CUDA kernel"), std::string::npos) << e.what();
  }
  // Without a device there is no CUDA session to time: the session says why.
  if (Support s = cuda::device_status(); !s) {
    try {
      Session gpu(cuda::flash(), p, 1);
      ADD_FAILURE() << "a CUDA session without a device";
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find(s.reason), std::string::npos) << e.what();
    }
    return;
  }
  Session gpu(cuda::flash(), p, 1);
  EXPECT_THROW(cuda::time_launches(gpu, t.inputs, t.outputs, 0), InvalidInput);
}

TEST(CudaEmulation, GroupReductionsStayInTheirGroup) {
  constexpr unsigned kThreads = 64;
  std::vector<float> out(2 * kThreads);
  cuda_emu::selftest::run(3, out.data(), kThreads);
  for (unsigned t = 0; t < kThreads; ++t) {
    const unsigned g0 = t / 16 * 16;
    EXPECT_EQ(out[2 * t], static_cast<float>(g0 + 15)) << t;
    EXPECT_EQ(out[2 * t + 1], static_cast<float>(16 * g0 + 120)) << t;  // sum g0..g0+15
  }
}

const Kernel& emulated(const std::string& which) { return test::emulated_cuda(which); }

struct EmuCase {
  std::string kernel;
  Problem p;
  std::string name;
};

// Small shapes (the emulation runs every CUDA thread as a fiber): every head_dim bucket and
// its edges, GQA 6/2, MQA decode, both causal alignments with q_len < and > kv_len (fully
// masked rows), windows, kv_lens with a zero, BSHD, several query tiles and key tiles.
std::vector<EmuCase> emu_cases() {
  struct Shape {
    int64_t b, hq, hkv, sq, sk, d;
    CausalAlign causal;
    int64_t wl, wr;
    std::vector<int64_t> kv_lens;
    Layout layout;
    const char* tag;
    int64_t dv = 0;  // head_dim_v (0 = d)
  };
  const auto N = CausalAlign::None, BR = CausalAlign::BottomRight, TL = CausalAlign::TopLeft;
  const auto H = Layout::BHSD, S = Layout::BSHD;
  const std::vector<Shape> shapes = {
      {1, 2, 2, 70, 63, 64, N, -1, -1, {}, H, "mha"},
      {2, 6, 2, 17, 150, 64, BR, -1, -1, {}, H, "gqa6x2_causal"},
      {1, 4, 1, 1, 300, 128, BR, -1, -1, {}, H, "mqa_decode"},
      {1, 2, 1, 40, 9, 32, BR, -1, -1, {}, S, "causal_qlong_fully_masked_rows"},
      {1, 2, 2, 9, 40, 80, TL, -1, -1, {}, H, "causal_topleft"},
      {1, 3, 3, 100, 100, 96, BR, 16, 0, {}, S, "window16_0"},
      {1, 2, 1, 33, 70, 17, N, 5, 3, {}, H, "window5_3_d17"},
      {3, 4, 2, 13, 64, 24, N, -1, -1, {0, 64, 33}, S, "kvlens_zero"},
      {3, 2, 2, 20, 50, 128, BR, -1, -1, {50, 0, 7}, H, "kvlens_causal"},
      {1, 2, 2, 5, 3, 1, N, -1, -1, {}, H, "d1"},
      {1, 1, 1, 19, 45, 200, BR, -1, -1, {}, H, "d200"},
      {1, 2, 1, 35, 40, 256, N, 7, 7, {}, S, "d256_window"},
      {1, 1, 1, 18, 37, 512, BR, -1, -1, {}, H, "d512"},
      {1, 8, 8, 2, 5, 16, N, -1, -1, {}, H, "tiny"},
      {1, 4, 4, 40, 70, 192, BR, -1, -1, {}, H, "mla_prefill_d192v128", 128},
      {1, 2, 1, 20, 90, 40, N, 5, 3, {}, S, "d40v72", 72},
      {2, 6, 2, 9, 33, 96, BR, -1, -1, {9, 0}, H, "d96v8_kvlens", 8},
      {1, 4, 1, 2, 150, 576, BR, -1, -1, {}, H, "mla_decode_d576v512", 512},
  };
  std::vector<EmuCase> out;
  // Seeded random shapes on top: tile-boundary coincidences (a tile ending exactly at, one
  // before or one after an interval end) that hand-picked shapes miss.
  std::mt19937_64 rng(2024);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t heads[][2] = {{1, 1}, {2, 1}, {4, 2}, {3, 3}, {6, 2}};
  std::vector<Shape> random_shapes;
  for (int n = 0; n < 24; ++n) {
    const auto& h = heads[pick(0, 4)];
    Shape s{pick(1, 2), h[0], h[1], pick(1, 80), pick(1, 140),       n % 8 == 7 ? pick(129, 512) : pick(1, 128),
            N,          -1,   -1,   {},          pick(0, 1) ? H : S, nullptr};
    switch (pick(0, 5)) {
      case 0: break;
      case 1: s.causal = BR; break;
      case 2: s.causal = TL; break;
      case 3: s.causal = BR, s.wl = pick(0, 40); break;
      case 4: s.wl = pick(0, 30), s.wr = pick(0, 30); break;
      case 5:
        for (int64_t b = 0; b < s.b; ++b) s.kv_lens.push_back(pick(0, s.sk));
        s.causal = pick(0, 1) ? BR : N;
        break;
    }
    random_shapes.push_back(s);
  }
  auto add = [&out](const char* k, const Shape& s, const std::string& tag) {
    EmuCase c;
    c.kernel = k;
    c.p = test::shape(s.b, s.hq, s.hkv, s.sq, s.sk, s.d);
    c.p.causal = s.causal;
    c.p.window_left = s.wl, c.p.window_right = s.wr;
    c.p.kv_lens = s.kv_lens;
    c.p.layout = s.layout;
    c.p.head_dim_v = s.dv;
    c.name = std::string(k) + "_" + tag;
    out.push_back(c);
  };
  for (const char* k : {"naive", "flash"}) {
    int r = 0;
    for (const Shape& s : random_shapes) add(k, s, "random" + std::to_string(r++));
    for (const Shape& s : shapes) {
      if (std::string(k) == "flash" && std::max(s.d, s.dv) > 512) continue;  // above its largest bucket (tested below)
      add(k, s, s.tag);
    }
  }
  // 16-bit storage: every third case again as bf16, the next as f16 (the kernels are
  // instantiated per dtype and take the element-wise tile loads).
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    if (i % 3 == 0) continue;
    EmuCase c = out[i];
    c.p.dtype = i % 3 == 1 ? DType::BF16 : DType::F16;
    c.name += std::string("_") + to_string(c.p.dtype);
    out.push_back(c);
  }
  // cuda_flash_bf16 (tensor cores; bf16 inputs, head dims up to 128): every shape it takes, and
  // shapes whose blocks are whole (group x q_len rows fill 64-row blocks), so that tiles every row
  // sees whole take the tensor cores' P V (a block with rows past the problem masks every tile).
  const std::vector<Shape> whole_blocks = {
      {1, 4, 1, 64, 200, 64, N, -1, -1, {}, H, "whole_blocks_mqa"},
      {2, 8, 2, 48, 190, 128, BR, -1, -1, {}, S, "whole_blocks_gqa_causal"},
      {1, 2, 2, 128, 300, 96, N, 100, 40, {}, H, "whole_blocks_window"},
      {2, 4, 4, 64, 260, 64, BR, -1, -1, {200, 260}, H, "whole_blocks_kvlens"},
      {1, 4, 2, 96, 230, 80, N, -1, -1, {}, S, "whole_blocks_d80v48", 48},
  };
  for (const Shape& s : whole_blocks) add("flash_bf16", s, s.tag);
  int r = 0;
  for (const Shape& s : random_shapes) {
    ++r;
    if (std::max(s.d, s.dv) <= 128) add("flash_bf16", s, "random" + std::to_string(r - 1));
  }
  for (const Shape& s : shapes) {
    if (std::max(s.d, s.dv) <= 128) add("flash_bf16", s, s.tag);
  }
  for (size_t i = n; i < out.size(); ++i) {
    if (out[i].kernel == std::string("flash_bf16")) out[i].p.dtype = DType::BF16;
  }
  return out;
}

void PrintTo(const EmuCase& c, std::ostream* os) { *os << c.name; }

class EmulatedAgreement : public ::testing::TestWithParam<EmuCase> {};

TEST_P(EmulatedAgreement, MatchesFloat64Reference) {
  const EmuCase& c = GetParam();
  const Kernel& k = emulated(c.kernel);
  ASSERT_TRUE(supports_problem(k, c.p)) << supports_problem(k, c.p).reason;
  Tensors t = random_tensors(c.p, 17);
  const Agreement a = prepare_agreement(c.p, t.inputs, all_rows(c.p));
  const KernelCheck r = check_kernel(k, c.p, t.inputs, a, 1);
  EXPECT_EQ(r.verdict, Verdict::Pass) << c.p.describe() << ": " << r.reason;
  EXPECT_TRUE(r.errors.lse_checked);
}

INSTANTIATE_TEST_SUITE_P(Cases, EmulatedAgreement, ::testing::ValuesIn(emu_cases()),
                         [](const ::testing::TestParamInfo<EmuCase>& info) { return info.param.name; });

class EmulatedNan : public ::testing::TestWithParam<std::string> {};

// A NaN in a key that some rows of the same tile see and others do not: exactly the rows that
// see it become NaN, the others stay correct (cuda_flash masks inside the tile by replacing,
// and a row's P V takes only its own visible keys, so 0 * NaN never happens).
TEST_P(EmulatedNan, NanKeyPoisonsExactlyTheRowsThatSeeIt) {
  Problem p = test::shape(1, 2, 1, 24, 24, 32);
  p.window_left = 3, p.window_right = 0;  // row i sees keys i-3 .. i
  Tensors t = random_tensors(p, 9);
  const int64_t bad = 10;  // seen by rows 10..13 only
  for (int64_t d = 0; d < p.head_dim; ++d) {
    const_cast<float*>(t.inputs.k.row(0, 0, bad))[d] = std::nanf("");
    const_cast<float*>(t.inputs.v.row(0, 0, bad))[d] = std::nanf("");
  }
  const Kernel& k = emulated(GetParam());
  Session s(k, p, 1);
  s.run(t.inputs, t.outputs);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  for (size_t r = 0; r < a.ref.rows.size(); ++r) {
    const RowId& id = a.ref.rows[r];
    const bool sees = p.visible(0, id.i).lo <= bad && bad < p.visible(0, id.i).hi;
    const float* o = t.outputs.o.row(0, id.h, id.i);
    for (int64_t d = 0; d < p.head_dim; ++d) {
      if (sees) {
        EXPECT_TRUE(std::isnan(o[d])) << "row " << id.i;
      } else {
        EXPECT_NEAR(o[d], a.ref.o[r * p.head_dim + d], 1e-5) << "row " << id.i << " d " << d;
      }
    }
  }
}

// Views whose rows are not 16-byte aligned take cuda_flash's scalar load path.
TEST_P(EmulatedNan, UnalignedViewsAgreeToo) {
  Problem p = test::shape(2, 4, 2, 37, 45, 64);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 12);
  std::vector<float> q(static_cast<size_t>(p.q_elems()) + 1), k(static_cast<size_t>(p.kv_elems()) + 1);
  std::copy(t.q.get(), t.q.get() + p.q_elems(), q.begin() + 1);
  std::copy(t.k.get(), t.k.get() + p.kv_elems(), k.begin() + 1);
  Inputs in = t.inputs;
  in.q.data = q.data() + 1;  // 4 bytes past a 16-byte boundary at best
  in.k.data = k.data() + 1;
  const Agreement a = prepare_agreement(p, in, all_rows(p));
  const KernelCheck c = check_kernel(emulated(GetParam()), p, in, a, 1);
  EXPECT_EQ(c.verdict, Verdict::Pass) << c.reason;
}

INSTANTIATE_TEST_SUITE_P(Kernels, EmulatedNan, ::testing::Values("naive", "flash"));

// cuda_flash_bf16: a NaN key and value row reach exactly the rows that see it - through the tensor
// cores' P V where every row of a tile sees the key (no window: all rows NaN), through the masked
// tiles' CUDA-core P V where only some do (a window: rows 100..103 only).
TEST(EmulatedFlashBf16, NanKeyPoisonsExactlyTheRowsThatSeeIt) {
  for (int64_t window : {int64_t{-1}, int64_t{3}}) {
    Problem p = test::shape(1, 4, 1, 128, 128, 64);  // 512 rows: whole 64-row blocks
    p.dtype = DType::BF16;
    p.window_left = window, p.window_right = window < 0 ? -1 : 0;
    Tensors clean = random_tensors(p, 9), t = random_tensors(p, 9);
    const int64_t bad = 100;
    for (int64_t d = 0; d < p.head_dim; ++d) {
      const_cast<uint16_t*>(t.inputs.k16.row(0, 0, bad))[d] = 0x7fc0;  // bf16 NaN
      const_cast<uint16_t*>(t.inputs.v16.row(0, 0, bad))[d] = 0x7fc0;
    }
    Session s(emulated("flash_bf16"), p, 1);
    s.run(t.inputs, t.outputs);
    s.run(clean.inputs, clean.outputs);
    const Agreement a = prepare_agreement(p, clean.inputs, all_rows(p));  // (the rows to walk)
    int nan_rows = 0;
    for (size_t r = 0; r < a.ref.rows.size(); ++r) {
      const RowId& id = a.ref.rows[r];
      const bool sees = p.visible(0, id.i).lo <= bad && bad < p.visible(0, id.i).hi;
      nan_rows += sees;
      const float* o = t.outputs.o.row(0, id.h, id.i);
      for (int64_t d = 0; d < p.head_dim; ++d) {
        if (sees) {
          EXPECT_TRUE(std::isnan(o[d])) << "window " << window << " row " << id.i;
        } else {  // untouched: bitwise the output without the NaN row
          EXPECT_EQ(o[d], clean.outputs.o.row(0, id.h, id.i)[d]) << "window " << window << " row " << id.i;
        }
      }
    }
    EXPECT_EQ(nan_rows, window < 0 ? 4 * 128 : 4 * 4);
  }
}

// cuda_decode under the emulation (sized for an H100's 132 SMs, so the keys split into 128-key
// chunks here and the merge has several chunks to merge): every cache type - f32, bf16, f16 and
// every quantized layout - contiguous and paged, against the float64 reference (which reads the
// cache's values): GQA and MQA (32 rows: two row tiles), q_len 1..16, causal, a window, per-batch
// kv lengths with an empty one, fully masked rows, d_v != d, d 256, BSHD, and rows whose byte
// pitch leaves 4-byte or no cp.async pieces (d 17, q8_0 at d 32: 34-byte rows).
struct DecodeCase {
  Problem p;
  std::string name;
};

std::vector<DecodeCase> decode_cases() {
  const auto BR = CausalAlign::BottomRight;
  struct Shape {
    int64_t b, hq, hkv, sq, sk, d, dv;
    CausalAlign causal;
    int64_t wl;
    std::vector<int64_t> kv_lens;
    Layout layout;
    const char* tag;
  };
  const std::vector<Shape> shapes = {
      {2, 8, 2, 1, 300, 64, 0, BR, -1, {}, Layout::BHSD, "gqa4"},
      {1, 4, 4, 3, 1000, 128, 64, CausalAlign::None, -1, {}, Layout::BHSD, "mha_dv64"},
      {2, 6, 1, 2, 257, 32, 0, CausalAlign::None, 50, {0, 200}, Layout::BSHD, "mqa_window_kvlens"},
      {1, 32, 1, 1, 700, 128, 0, BR, -1, {}, Layout::BHSD, "mqa32_two_row_tiles"},
      {1, 8, 2, 16, 520, 64, 0, BR, -1, {}, Layout::BSHD, "q16_gqa4"},
      {1, 2, 1, 4, 3, 32, 0, BR, -1, {}, Layout::BHSD, "fully_masked_rows"},
      {1, 4, 2, 2, 400, 256, 0, BR, -1, {}, Layout::BSHD, "d256"},
      {1, 2, 2, 1, 90, 17, 0, CausalAlign::None, -1, {}, Layout::BHSD, "d17"},
  };
  const KvDType types[] = {KvDType::Same, KvDType::Q8_0,    KvDType::Q4_0,   KvDType::U8,
                           KvDType::U4,   KvDType::Fp8E4M3, KvDType::Fp8E5M2};
  std::vector<DecodeCase> out;
  for (const Shape& s : shapes) {
    for (const KvDType t : types) {
      // Sanitizer builds (small grids): the memory paths only - f32 (16-byte pieces), bf16, q8_0 (34-byte
      // rows at d 32: plain loads) and u4 (nibbles), contiguous and paged; the plain suite runs every layout.
      if (test::small_mode() && t != KvDType::Same && t != KvDType::Q8_0 && t != KvDType::U4) continue;
      for (const DType dt : {DType::F32, DType::BF16, DType::F16}) {
        if (t != KvDType::Same && dt != DType::F32) continue;  // a quantized cache takes float32 Q
        if (test::small_mode() && dt == DType::F16) continue;
        for (const int64_t block : {int64_t{0}, int64_t{16}}) {
          Problem p = test::shape(s.b, s.hq, s.hkv, s.sq, s.sk, s.d);
          p.head_dim_v = s.dv, p.causal = s.causal, p.window_left = s.wl, p.window_right = s.wl < 0 ? -1 : 0;
          p.kv_lens = s.kv_lens, p.layout = s.layout, p.kv_dtype = t, p.dtype = dt, p.kv_block = block;
          try {
            p.validate();
          } catch (const InvalidInput&) {
            continue;  // (q8_0 / q4_0 at a head_dim that is not whole blocks)
          }
          std::string name = std::string(s.tag) + "_" + (t == KvDType::Same ? to_string(dt) : to_string(t));
          if (block) name += "_paged";
          out.push_back({p, name});
        }
      }
    }
  }
  return out;
}

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

class EmulatedDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(EmulatedDecode, MatchesFloat64Reference) {
  const DecodeCase& c = GetParam();
  const Kernel& k = emulated("decode");
  ASSERT_TRUE(supports_problem(k, c.p)) << supports_problem(k, c.p).reason;
  const Tensors t = random_tensors(c.p, 23);
  const KernelCheck r = test::check_all_rows(k, c.p, t, 1);
  EXPECT_EQ(r.verdict, Verdict::Pass) << c.p.describe() << ": " << r.reason << " (O err " << r.errors.o_rel << ", tol "
                                      << r.tol.o_rel << ")";
  EXPECT_TRUE(r.errors.lse_checked);
}

INSTANTIATE_TEST_SUITE_P(Caches, EmulatedDecode, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) { return info.param.name; });

std::vector<float> run_outputs(const Kernel& k, const Problem& p, const Inputs& in, std::vector<float>* lse) {
  Tensors out = allocate_outputs(p);
  Session s(k, p, 1);
  s.run(in, out.outputs);
  if (lse) lse->assign(out.lse.get(), out.lse.get() + p.lse_elems());
  return {out.o.get(), out.o.get() + p.o_elems()};
}

// A paged cache gives bitwise the contiguous cache's O and LSE (only where rows are read from
// differs: the table's rule), for blocks of 16..256 tokens and a mixed-length batch.
TEST(EmulatedDecodeCache, PagedIsBitwiseTheContiguousCache) {
  for (const KvDType t : {KvDType::Same, KvDType::Q4_0, KvDType::U8}) {
    Problem base = test::shape(3, 8, 2, 2, 600, 64);
    base.kv_lens = {600, 1, 333};
    base.causal = CausalAlign::BottomRight;
    base.kv_dtype = t;
    base.dtype = t == KvDType::Same ? DType::BF16 : DType::F32;
    const Tensors dense = random_tensors(base, 5);
    std::vector<float> lse_dense;
    const std::vector<float> o_dense = run_outputs(emulated("decode"), base, dense.inputs, &lse_dense);
    for (const int64_t block : {16, 64, 256}) {
      Problem p = base;
      p.kv_block = block;
      const Tensors paged = page_kv(p, dense.inputs);
      std::vector<float> lse;
      const std::vector<float> o = run_outputs(emulated("decode"), p, paged.inputs, &lse);
      EXPECT_EQ(std::memcmp(o.data(), o_dense.data(), o.size() * sizeof(float)), 0) << to_string(t) << " " << block;
      EXPECT_EQ(std::memcmp(lse.data(), lse_dense.data(), lse.size() * sizeof(float)), 0)
          << to_string(t) << " " << block;
    }
  }
}

// A NaN key and value row reaches exactly the rows that see it (O NaN), through the chunk it lies in
// and the merge; the other rows - those a window keeps from it, and the rows of the other kv head -
// are bitwise the run without it (a chunk a row does not see is never weighted by 0).
TEST(EmulatedDecodeCache, NanKeyPoisonsExactlyTheRowsThatSeeIt) {
  Problem p = test::shape(1, 4, 2, 4, 700, 64);
  p.window_left = 200, p.window_right = 0;  // row i (of 4) sees keys 496 + i .. 696 + i
  const Tensors clean = random_tensors(p, 8);
  Tensors t = random_tensors(p, 8);
  const int64_t bad = 497;  // seen by rows 0 and 1 of kv head 0 only
  for (int64_t d = 0; d < p.head_dim; ++d) {
    const_cast<float*>(t.inputs.k.row(0, 0, bad))[d] = std::nanf("");
    const_cast<float*>(t.inputs.v.row(0, 0, bad))[d] = std::nanf("");
  }
  const std::vector<float> o = run_outputs(emulated("decode"), p, t.inputs, nullptr);
  const std::vector<float> o_clean = run_outputs(emulated("decode"), p, clean.inputs, nullptr);
  int nan_rows = 0;
  for (int64_t h = 0; h < p.q_heads; ++h) {
    for (int64_t i = 0; i < p.q_len; ++i) {
      const Interval iv = p.visible(0, i);
      const bool sees = p.kv_head_of(h) == 0 && iv.lo <= bad && bad < iv.hi;
      nan_rows += sees;
      const int64_t at = (h * p.q_len + i) * p.head_dim;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        if (sees) {
          EXPECT_TRUE(std::isnan(o[at + d])) << "h " << h << " i " << i;
        } else {
          EXPECT_EQ(o[at + d], o_clean[at + d]) << "h " << h << " i " << i << " d " << d;
        }
      }
    }
  }
  EXPECT_EQ(nan_rows, 2 * 2);
}

TEST(EmulatedDecodeCache, RefusesWhatItDoesNotRunNamingTheAlternative) {
  // The declared limits (kernel_list.hpp's capabilities) refuse first, and the device ops'
  // unsupported() guards the same limits on its own (the kernel's supports()).
  Problem p = test::shape(1, 4, 2, 17, 64, 64);
  EXPECT_NE(supports_problem(emulated("decode"), p).reason.find("q_len 17 > 16: emu_cuda_decode splits the keys"),
            std::string::npos)
      << supports_problem(emulated("decode"), p).reason;
  EXPECT_NE(emulated("decode").supports(p).reason.find("q_len above 16"), std::string::npos);
  p.q_len = 1, p.head_dim = 320;
  EXPECT_NE(supports_problem(emulated("decode"), p).reason.find("head dim 320 > 256"), std::string::npos);
  EXPECT_NE(emulated("decode").supports(p).reason.find("head_dim or head_dim_v above 256"), std::string::npos);
  p.head_dim = 64, p.sinks = 4, p.window_left = 16, p.window_right = 0;
  const std::string why = supports_problem(emulated("decode"), p).reason;  // the registry's kernels that run them
  EXPECT_NE(why.find("a sparse pattern ("), std::string::npos) << why;
  EXPECT_NE(why.find("cuda_flash_bf16"), std::string::npos) << why;
}

// ---- 3. the real device -----------------------------------------------------------------

class CudaDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Support s = cuda::device_status(); !s) GTEST_SKIP() << "needs a CUDA device: " << s.reason;
  }
};

TEST_F(CudaDevice, RunRecordsEventTimesOfEachPhase) {
  Problem p = test::shape(2, 8, 2, 256, 256, 64);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 4);
  for (const Kernel* k : {&cuda::naive(), &cuda::flash()}) {
    Session s(*k, p, 1);
    s.run(t.inputs, t.outputs);
    const auto timing = cuda::last_timing();
    ASSERT_TRUE(timing);
    EXPECT_GT(timing->kernel_ms, 0.0);
    EXPECT_GT(timing->h2d_ms, 0.0);
    EXPECT_GT(timing->d2h_ms, 0.0);
    EXPECT_EQ(timing->h2d_bytes, 4.0 * static_cast<double>(p.q_elems() + 2 * p.kv_elems()));
    EXPECT_EQ(timing->d2h_bytes, 4.0 * static_cast<double>(p.q_elems() + p.lse_elems()));
  }
}

TEST_F(CudaDevice, StridedOutputViewWritesOnlyItsRows) {
  Problem p = test::shape(2, 3, 1, 33, 50, 40);
  Tensors t = random_tensors(p, 8);
  // O rows padded to 47 floats; the padding holds a sentinel that must survive.
  const int64_t pitch = 47;
  std::vector<float> o(static_cast<size_t>(p.batch * p.q_heads * p.q_len * pitch), -7.f);
  Outputs out{
      MutView{o.data(), p.batch, p.q_heads, p.q_len, p.head_dim, p.q_heads * p.q_len * pitch, p.q_len * pitch, pitch},
      t.outputs.lse};
  for (const Kernel* k : {&cuda::naive(), &cuda::flash()}) {
    std::fill(o.begin(), o.end(), -7.f);
    Session s(*k, p, 1);
    s.run(t.inputs, out);
    const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
    const Errors e = measure(a.ref, as_const(out.o), out.lse, p);
    EXPECT_TRUE(a.tol.passes(e)) << k->name() << ": " << a.tol.why_failed(e);
    for (size_t n = 0; n < o.size(); ++n) {
      if (static_cast<int64_t>(n) % pitch >= p.head_dim) {
        ASSERT_EQ(o[n], -7.f) << k->name() << " at " << n;
      }
    }
  }
}

// Back-to-back launches between two events: the mean per launch, no host gap; the outputs are
// those of the kernel (it rewrites the same O each launch).
TEST_F(CudaDevice, TimeLaunchesTimesBackToBackLaunches) {
  Problem p = test::shape(2, 8, 2, 512, 512, 64);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 4);
  const Agreement a = prepare_agreement(p, t.inputs, sample_rows(p, 64, 1));
  for (const Kernel* k : {&cuda::naive(), &cuda::flash()}) {
    std::fill_n(t.outputs.o.data, p.q_elems(), std::nanf(""));
    Session s(*k, p, 1);
    const cuda::Timing tm = cuda::time_launches(s, t.inputs, t.outputs, 7);
    EXPECT_EQ(tm.launches, 7);
    EXPECT_GT(tm.kernel_ms, 0.0);
    EXPECT_GT(tm.first_launch_ms, 0.0);
    EXPECT_LT(tm.kernel_ms, 10 * tm.first_launch_ms) << "the mean of 7 launches, not their sum";
    const Errors e = measure(a.ref, as_const(t.outputs.o), t.outputs.lse, p);
    EXPECT_TRUE(a.tol.passes(e)) << k->name() << ": " << a.tol.why_failed(e);
  }
}

// A one-row O whose seq stride is 0, heads padded: the copy back must take the row's width as
// its pitch (cuda_impl::o_row_blocks), and leave the padding alone.
TEST_F(CudaDevice, OneRowStridedOutputCopiesBack) {
  Problem p = test::shape(2, 4, 1, 1, 300, 64);
  p.causal = CausalAlign::BottomRight;
  Tensors t = random_tensors(p, 6);
  const int64_t head_pitch = p.head_dim + 9;
  std::vector<float> o(static_cast<size_t>(p.batch * p.q_heads * head_pitch), -7.f);
  const Outputs out{MutView{o.data(), p.batch, p.q_heads, 1, p.head_dim, p.q_heads * head_pitch, head_pitch, 0},
                    t.outputs.lse};
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  for (const Kernel* k : {&cuda::naive(), &cuda::flash()}) {
    std::fill(o.begin(), o.end(), -7.f);
    Session s(*k, p, 1);
    s.run(t.inputs, out);
    const Errors e = measure(a.ref, as_const(out.o), out.lse, p);
    EXPECT_TRUE(a.tol.passes(e)) << k->name() << ": " << a.tol.why_failed(e);
    for (size_t n = 0; n < o.size(); ++n) {
      if (static_cast<int64_t>(n) % head_pitch >= p.head_dim) {
        ASSERT_EQ(o[n], -7.f) << k->name() << " at " << n;
      }
    }
  }
}

TEST_F(CudaDevice, DeviceInfoIsPlausible) {
  const auto info = cuda::device_info();
  ASSERT_TRUE(info);
  EXPECT_GE(info->cc_major, 8);
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GT(info->fp32_peak_tflops, 1.0);
  EXPECT_GE(info->smem_per_block_optin, 48 * 1024);
  std::printf("%s\n", info->describe().c_str());
}

// The tensor cores on the GPU held to the checks the emulation passes (the same kernels,
// src/cuda/tensor_core_check.cu): where the emulation's model of mma / ldmatrix is wrong, here.
TEST_F(CudaDevice, TensorCoresFollowThePtxTables) {
#if defined(ATTN_HAS_CUDA)
  expect_mma_follows_the_tables(cuda_dev::tensor_core_mma);
  expect_ldmatrix_follows_the_tables(cuda_dev::tensor_core_ldmatrix);
  expect_ldmatrix_feeds_mma(cuda_dev::tensor_core_ldmatrix_mma);
#endif
}

}  // namespace
}  // namespace attnlab
