// Paged KV caches (Problem::kv_block, Inputs::pages, tensor.hpp): the block table's rule checked
// by hand in both layouts, page_kv and unpage_kv as inverses, flash and decode on a paged cache
// bit for bit the contiguous cache's result (every target this CPU runs, blocks of 16..256
// tokens, float, 16-bit and quantized caches, mixed lengths, GQA and MQA, masks, a sparse
// pattern, chunked prefill), the errors bad tables get, and planted table bugs failing agreement.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "attnlab/kernel.hpp"
#include "attnlab/kv_quant.hpp"
#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

Problem shape(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t sk, int64_t d, int64_t block) {
  Problem p;
  p.batch = b, p.q_heads = hq, p.kv_heads = hkv, p.q_len = sq, p.kv_len = sk, p.head_dim = d;
  p.kv_block = block;
  return p;
}

Problem contiguous(Problem p) {
  p.kv_block = 0;
  return p;
}

using test::runnable;

struct Result {
  std::vector<float> o, lse;
};
Result run(const Kernel& k, const Problem& p, const Inputs& in, int threads = 2) {
  Tensors out = allocate_outputs(p);
  Session s(k, p, threads);
  s.run(in, out.outputs);
  return {std::vector<float>(out.o.get(), out.o.get() + p.o_elems()),
          std::vector<float>(out.lse.get(), out.lse.get() + p.lse_elems())};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Where row j of sequence b, kv head h lives, written out for each layout: pool block
// table[b][j / B], and inside it (h, j % B) for bhsd, (j % B, h) for bshd.
TEST(Paged, TheTableSaysWhereEachRowLives) {
  for (Layout layout : {Layout::BHSD, Layout::BSHD}) {
    Problem p = shape(2, 4, 2, 1, 40, 4, 16);
    p.kv_lens = {40, 17};
    p.layout = layout;
    p.validate();
    EXPECT_EQ(p.kv_pool_blocks(), 3 + 2);  // a mixed batch stores what it uses
    EXPECT_EQ(p.kv_table_len(), 3);
    const Tensors t = random_tensors(p, 5);
    const KvPages& pg = t.inputs.pages;
    ASSERT_NE(pg.table, nullptr);
    EXPECT_EQ(pg.pool_blocks, 5);
    EXPECT_EQ(pg.table[1 * 3 + 2], -1) << "sequence 1 has no third block";
    EXPECT_NO_THROW(validate_block_table(p, pg));
    EXPECT_FALSE(pg.table[0] == 0 && pg.table[1] == 1 && pg.table[2] == 2) << "blocks scattered, not in pool order";
    const Tensors d = random_tensors(contiguous(p), 5);  // the same values, contiguous
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t j = 0; j < p.kv_len_of(b); ++j) {
          const int64_t blk = pg.table[b * 3 + j / 16], r = j % 16;
          const int64_t at = layout == Layout::BHSD ? blk * (2 * 16 * 4) + h * (16 * 4) + r * 4
                                                    : blk * (16 * 2 * 4) + r * (2 * 4) + h * 4;
          ASSERT_EQ(std::memcmp(t.inputs.k.data + at, d.inputs.k.row(b, h, j), 4 * sizeof(float)), 0)
              << to_string(layout) << " b" << b << " h" << h << " j" << j;
          ASSERT_EQ(kv_row(t.inputs.v, pg, b, h, j), t.inputs.v.data + at);
        }
  }
}

TEST(Paged, PageAndUnpageAreInverses) {
  for (DType dt : {DType::F32, DType::BF16}) {
    for (KvDType kt : {KvDType::Same, KvDType::Q8_0, KvDType::U4}) {
      if (kt != KvDType::Same && dt != DType::F32) continue;
      Problem p = shape(3, 4, 2, 2, 100, 64, 32);
      p.dtype = dt, p.kv_dtype = kt, p.kv_lens = {100, 0, 33};
      const Tensors dense = random_tensors(contiguous(p), 8);
      const Tensors paged = page_kv(p, dense.inputs);
      EXPECT_NO_THROW(validate_block_table(p, paged.inputs.pages));
      const UnpagedKv back = unpage_kv(p, paged.inputs);
      EXPECT_EQ(back.problem.kv_block, 0);
      const int64_t rb = p.kv_row_bytes(p.head_dim);
      const auto bytes = [&](const Inputs& in, int64_t b, int64_t h, int64_t j) -> const void* {
        if (kt != KvDType::Same) return in.kq.row(b, h, j);
        if (dt == DType::F32) return in.k.row(b, h, j);
        return in.k16.row(b, h, j);
      };
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t j = 0; j < p.kv_len_of(b); ++j)
            ASSERT_EQ(std::memcmp(bytes(back.inputs, b, h, j), bytes(dense.inputs, b, h, j), static_cast<size_t>(rb)),
                      0)
                << to_string(dt) << "/" << to_string(kt) << " b" << b << " j" << j;
    }
  }
}

// The tile engine walks a tile's blocks as runs of rows (microkernel.hpp's Rows): the same keys in
// the same order, so the paged cache's O and LSE are the contiguous cache's bit for bit. Block
// sizes below, at and above the 64-key tile; tiles that start mid-block (a window, kv_lens).
// (decode_i8 too, on the integer caches: its tasks round the same Q rows and walk the same keys.)
TEST(Paged, FlashAndDecodeGiveTheContiguousResultBitForBit) {
  std::vector<Problem> shapes;
  shapes.push_back(shape(2, 8, 2, 1, 1000, 128, 0));  // decode, GQA, mixed lengths
  shapes.back().kv_lens = {1000, 333};
  shapes.back().causal = CausalAlign::BottomRight;
  shapes.push_back(shape(1, 6, 1, 3, 700, 64, 0));  // MQA, 3 new tokens, a window starting mid-block
  shapes.back().causal = CausalAlign::BottomRight;
  shapes.back().window_left = 201, shapes.back().window_right = 0;
  shapes.push_back(shape(2, 4, 2, 70, 300, 96, 0));  // chunked prefill, d_v != d, bshd
  shapes.back().head_dim_v = 64, shapes.back().layout = Layout::BSHD;
  shapes.back().causal = CausalAlign::BottomRight, shapes.back().kv_lens = {300, 171};
  shapes.push_back(shape(2, 4, 2, 2, 700, 64, 0));  // StreamingLLM: sinks (a gathered tile) + window,
  shapes.back().sinks = 4, shapes.back().window_left = 100, shapes.back().window_right = 0;
  shapes.back().kv_lens = {700, 0};  // and an empty sequence (no block at all: nothing to gather)
  shapes.back().causal = CausalAlign::BottomRight;
  struct Storage {
    DType dtype;
    KvDType kv;
  };
  const Storage storages[] = {{DType::F32, KvDType::Same},
                              {DType::BF16, KvDType::Same},
                              {DType::F32, KvDType::Q8_0},
                              {DType::F32, KvDType::U4}};
  for (Problem base : shapes) {
    for (const Storage& st : storages) {
      base.dtype = st.dtype, base.kv_dtype = st.kv;
      base.validate();
      const Tensors dense = random_tensors(base, 21);
      for (int64_t block : {16, 32, 64, 256}) {
        Problem p = base;
        p.kv_block = block;
        p.validate();
        const Tensors paged = random_tensors(p, 21);
        for (const char* name : {"flash", "decode", "decode_i8"}) {
          if (std::string_view(name).starts_with("decode") && p.q_len > 16) continue;
          for (const Kernel* k : runnable(name)) {
            if (!supports_problem(*k, p)) continue;  // decode_i8: integer caches, direct tasks
            const Result a = run(*k, base, dense.inputs), b = run(*k, p, paged.inputs);
            EXPECT_TRUE(same_bits(a.o, b.o) && same_bits(a.lse, b.lse))
                << name << "[" << k->isa() << "] " << p.describe();
          }
        }
      }
    }
  }
}

// Agreement with the float64 reference, which reads an unpaged copy (unpage_kv), for naive too.
TEST(Paged, KernelsThatReadAPagedCacheAgree) {
  Problem p = shape(3, 8, 2, 1, 513, 64, 16);
  p.kv_lens = {513, 1, 64};
  p.causal = CausalAlign::BottomRight;
  p.kv_dtype = KvDType::Q4_0;
  const Tensors t = random_tensors(p, 4);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  for (const char* name : {"naive", "flash", "decode", "decode_i8"}) {
    for (const Kernel* k : runnable(name)) {
      const KernelCheck c = check_kernel(*k, p, t.inputs, a, 2);
      EXPECT_EQ(c.verdict, Verdict::Pass) << name << "[" << k->isa() << "]: " << c.reason;
    }
  }
}

TEST(Paged, OtherKernelsRefuseNamingTheOnesThatRead) {
  const Problem p = shape(1, 4, 4, 64, 64, 64, 64);
  for (const Kernel* k : variants()) {
    if (k->capabilities().paged) continue;
    const Support s = supports_problem(*k, p);
    ASSERT_FALSE(s) << k->name();
    EXPECT_NE(s.reason.find("kv_block 64 (naive, flash, decode, decode_i8, cuda_decode read a paged cache)"),
              std::string::npos)
        << s.reason;
  }
  Problem dilated = shape(1, 4, 4, 64, 64, 64, 64);
  dilated.window_left = 16, dilated.window_right = 0, dilated.dilation = 2;
  const Support s = supports_problem(kernel_or_throw("flash"), dilated);
  EXPECT_FALSE(s);
  EXPECT_NE(s.reason.find("dilation 2 with kv_block 64"), std::string::npos) << s.reason;
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "";
}

TEST(Paged, BadBlocksAndTablesNameTheField) {
  for (int64_t bad : {-16, 8, 24, 512}) {
    const std::string e = error_of([&] { shape(1, 1, 1, 1, 64, 64, bad).validate(); });
    EXPECT_NE(e.find("kv_block: " + std::to_string(bad) + " is not allowed; allowed: 0"), std::string::npos) << e;
  }
  Problem p = shape(2, 2, 2, 1, 64, 8, 16);
  p.kv_lens = {64, 20};  // 4 + 2 blocks
  const Tensors t = random_tensors(p, 1);
  const KvPages good = t.inputs.pages;
  const auto with = [&](int64_t entry, int32_t id) {
    std::vector<int32_t> table(t.table);
    table[static_cast<size_t>(entry)] = id;
    return table;
  };
  std::vector<int32_t> table = with(1, 6);  // past the pool
  KvPages pg = good;
  pg.table = table.data();
  EXPECT_NE(error_of([&] { validate_block_table(p, pg); })
                .find("block_table[0][1]: block id 6 is outside the pool; "
                      "allowed: 0..5"),
            std::string::npos);
  table = with(4 + 1, -1);  // sequence 1's second block missing
  pg.table = table.data();
  EXPECT_NE(error_of([&] { validate_block_table(p, pg); }).find("block_table[1][1]: block id -1 is outside the pool"),
            std::string::npos);
  table = with(4, t.table[2]);  // sequence 1 reuses sequence 0's third block
  pg.table = table.data();
  EXPECT_NE(error_of([&] { validate_block_table(p, pg); }).find("is also block_table[0][2]"), std::string::npos);
  pg = good;
  pg.table_len = 3;  // too short for 64 keys
  EXPECT_NE(error_of([&] { validate_block_table(p, pg); }).find("block_table[0]: 3 entries for 64 keys"),
            std::string::npos);
  pg = good;
  pg.block = 32;
  EXPECT_NE(error_of([&] { validate_block_table(p, pg); }).find("blocks of 32 tokens; allowed: kv_block (16)"),
            std::string::npos);
}

// A kernel reading through a corrupted table: each corruption must fail agreement.
class PlantedTableBug final : public test::Wrapped {
 public:
  enum Bug { BlockOffByOne, StalePageId };
  PlantedTableBug(const Kernel& inner, Bug bug) : Wrapped(inner), bug_(bug) {}
  void run(const Problem& p, const Inputs& in, const Outputs& out, RunContext& ctx) const override {
    const KvPages& pg = in.pages;
    std::vector<int32_t> table(pg.table, pg.table + p.batch * pg.table_len);
    if (bug_ == BlockOffByOne) {  // block x read for block x + 1 of sequence 0
      for (int64_t x = pg.table_len - 1; x > 0; --x) table[x] = table[x - 1];
    } else {  // sequence 0's block 2 still names the block it had before (now sequence 1's)
      table[2] = table[pg.table_len + 1];
    }
    Inputs bad = in;
    bad.pages.table = table.data();
    inner_.run(p, bad, out, ctx);
  }

 private:
  Bug bug_;
};

TEST(Paged, PlantedTableBugsFail) {
  Problem p = shape(2, 8, 2, 1, 300, 64, 32);
  p.kv_lens = {300, 120};
  const Tensors t = random_tensors(p, 9);
  const Agreement a = prepare_agreement(p, t.inputs, all_rows(p));
  for (const char* name : {"flash", "decode"}) {
    for (const Kernel* k : runnable(name)) {
      for (auto bug : {PlantedTableBug::BlockOffByOne, PlantedTableBug::StalePageId}) {
        const PlantedTableBug planted(*k, bug);
        EXPECT_EQ(check_kernel(planted, p, t.inputs, a, 2).verdict, Verdict::Fail)
            << name << "[" << k->isa() << "] bug " << bug << " passed";
      }
      EXPECT_EQ(check_kernel(*k, p, t.inputs, a, 2).verdict, Verdict::Pass) << "the same cache, read right";
    }
  }
}

// MLA's latent cache (Problem::kv_shared): V is the first head_dim_v columns of K's rows, one
// tensor. The V views alias K's storage; the kernels agree with the reference on every cache
// type (a quantized row's prefix is a row of the prefix: blocks along d, a u8/u4 row's scale
// first), paged too; and they give the bits of the unshared problem whose V holds those columns.
TEST(KvShared, VIsTheFirstColumnsOfKsRows) {
  Problem p = shape(1, 16, 1, 1, 300, 576, 0);
  p.head_dim_v = 512, p.kv_shared = true, p.causal = CausalAlign::BottomRight;
  Problem unshared = p;
  unshared.kv_shared = false;
  EXPECT_EQ(p.kv_bytes_per_token(), 576 * 4);
  EXPECT_EQ(unshared.kv_bytes_per_token(), (576 + 512) * 4);
  EXPECT_LT(tensor_bytes(p), tensor_bytes(unshared));
  std::vector<std::pair<DType, KvDType>> storages = {{DType::F32, KvDType::Same}, {DType::BF16, KvDType::Same}};
  for (KvDType t : quantized_kv_dtypes()) storages.emplace_back(DType::F32, t);
  for (const auto& [dt, kt] : storages) {
    for (int64_t block : {0, 16}) {
      Problem s = p;
      s.dtype = dt, s.kv_dtype = kt, s.kv_block = block;
      s.validate();
      const Tensors t = random_tensors(s, 3);
      const auto* k = kt != KvDType::Same ? static_cast<const void*>(t.inputs.kq.data)
                      : dt == DType::F32  ? static_cast<const void*>(t.inputs.k.data)
                                          : static_cast<const void*>(t.inputs.k16.data);
      const auto* v = kt != KvDType::Same ? static_cast<const void*>(t.inputs.vq.data)
                      : dt == DType::F32  ? static_cast<const void*>(t.inputs.v.data)
                                          : static_cast<const void*>(t.inputs.v16.data);
      EXPECT_EQ(k, v) << "V is K's storage";
      const Agreement a = prepare_agreement(s, t.inputs, all_rows(s));
      for (const char* name : {"naive", "flash", "decode"}) {
        for (const Kernel* kernel : runnable(name)) {
          const KernelCheck c = check_kernel(*kernel, s, t.inputs, a, 2);
          EXPECT_EQ(c.verdict, Verdict::Pass)
              << name << "[" << kernel->isa() << "] " << s.describe() << ": " << c.reason;
        }
      }
      if (block != 0) continue;
      // The unshared problem over the same stored rows, V a separate copy of their first columns.
      Problem u = s;
      u.kv_shared = false;
      Problem paged = s;  // K paged and back: dense K, and V written from K's rows' first columns
      paged.kv_block = 16;
      const Tensors pool = page_kv(paged, t.inputs);  // (the copy's Q is this one's)
      const UnpagedKv copy = unpage_kv(paged, pool.inputs);
      for (const Kernel* kernel : runnable("decode")) {
        const Result a1 = run(*kernel, s, t.inputs), a2 = run(*kernel, u, copy.inputs);
        EXPECT_TRUE(same_bits(a1.o, a2.o) && same_bits(a1.lse, a2.lse)) << kernel->isa() << " " << s.describe();
      }
    }
  }
  Problem bad = p;
  bad.head_dim = 128, bad.head_dim_v = 256;
  EXPECT_NE(error_of([&] { bad.validate(); }).find("kv_shared: head_dim_v 256 > head_dim 128"), std::string::npos);
}

}  // namespace
}  // namespace attnlab
