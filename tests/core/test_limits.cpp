// Checked size arithmetic and the memory budget every run is held to (limits.hpp, can_run).
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "attnlab/kernel.hpp"
#include "attnlab/limits.hpp"
#include "attnlab/verify.hpp"
#include "test_util.hpp"

namespace attnlab {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Limits, CheckedProductRefusesOverflowNegativesAndTheLimit) {
  EXPECT_EQ(checked_product({3, 5, 7}), 105);
  EXPECT_EQ(checked_product({}), 1);
  EXPECT_EQ(checked_product({kMax, 1}), kMax);
  EXPECT_EQ(checked_product({int64_t{1} << 32, int64_t{1} << 32}), std::nullopt);  // wraps to 0
  EXPECT_EQ(checked_product({kMax, 2}), std::nullopt);
  EXPECT_EQ(checked_product({0, kMax, kMax}), 0);             // a zero factor makes 0, whatever follows
  EXPECT_EQ(checked_product({kMax, kMax, 0}), std::nullopt);  // ... but not once it has wrapped
  EXPECT_EQ(checked_product({-1, 4}), std::nullopt);
  EXPECT_EQ(checked_product({8, 8}, 64), 64);
  EXPECT_EQ(checked_product({8, 9}, 64), std::nullopt);
  EXPECT_EQ(pow2_text(int64_t{1} << 36), "2^36 (68719476736)");
  EXPECT_EQ(pow2_text(100000), "100000");
}

// The one thread-count rule (every entry point calls it): 1..kMaxThreads as given, 0 for all
// cores, anything else refused naming the field and the allowed values.
TEST(Limits, ThreadCountIsOneRule) {
  EXPECT_GE(all_cores(), 1);
  EXPECT_LE(all_cores(), kMaxThreads);
  EXPECT_EQ(thread_count(1), 1);
  EXPECT_EQ(thread_count(3), 3);
  EXPECT_EQ(thread_count(kMaxThreads), kMaxThreads);
  EXPECT_EQ(thread_count(0), all_cores());
  for (int64_t bad : {int64_t{-1}, int64_t{kMaxThreads} + 1, int64_t{1} << 40}) {
    try {
      thread_count(bad, "--threads");
      ADD_FAILURE() << bad << " accepted";
    } catch (const InvalidInput& e) {
      EXPECT_EQ(std::string(e.what()),
                "--threads: " + std::to_string(bad) + " is not allowed; allowed: 1 to 1024, or 0 for all cores");
    }
  }
}

// Sets ATTN_MEMORY_BUDGET for one test, restores the previous value after.
class Budget : public ::testing::Test {
 protected:
  std::string saved;
  bool had = false;
  void SetUp() override {
    if (const char* v = std::getenv("ATTN_MEMORY_BUDGET")) had = true, saved = v;
  }
  void TearDown() override {
    if (had) {
      setenv("ATTN_MEMORY_BUDGET", saved.c_str(), 1);
    } else {
      unsetenv("ATTN_MEMORY_BUDGET");
    }
  }
  static void set(const char* v) { setenv("ATTN_MEMORY_BUDGET", v, 1); }
};

TEST_F(Budget, EnvironmentOverrideIsParsedStrictly) {
  set("1536");
  EXPECT_EQ(memory_budget_bytes(), 1536);
  set("3K");
  EXPECT_EQ(memory_budget_bytes(), 3 * 1024);
  set("2G");
  EXPECT_EQ(memory_budget_bytes(), int64_t{2} << 30);
  for (const char* bad : {"-5", "0", "1.5G", "12X", "G", "99999999999T", "12 M"}) {
    set(bad);
    try {
      memory_budget_bytes();
      ADD_FAILURE() << "accepted " << bad;
    } catch (const InvalidInput& e) {
      EXPECT_NE(std::string(e.what()).find("ATTN_MEMORY_BUDGET: '" + std::string(bad) + "' is not a memory size"),
                std::string::npos)
          << e.what();
    }
  }
  unsetenv("ATTN_MEMORY_BUDGET");
  EXPECT_GT(memory_budget_bytes(), int64_t{1} << 24);  // half the physical memory
}

// naive's O(n^2) scores exceed a small budget: every path says so before allocating
// (can_run, Session, check_kernel), naming the bytes and the budget; flash still fits.
TEST_F(Budget, KernelsOverTheBudgetSayWhyBeforeAllocating) {
  const Problem p = test::shape(1, 1, 1, 1024, 1024, 16);  // naive: 4 MiB of scores
  set("2M");
  const Kernel& naive = kernel_or_throw("naive");
  const Support s = can_run(naive, p, 1);
  ASSERT_FALSE(s);
  EXPECT_NE(s.reason.find("memory: needs 4.3 MiB (4460544 bytes: workspace 4.0 MiB + Q, K, V, O, LSE 260.0 KiB)"),
            std::string::npos)
      << s.reason;
  EXPECT_NE(s.reason.find("above the memory budget of 2.0 MiB (2097152 bytes, set by ATTN_MEMORY_BUDGET)"),
            std::string::npos)
      << s.reason;
  try {
    Session session(naive, p, 1);
    ADD_FAILURE() << "Session allocated past the budget";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("naive cannot run batch=1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("memory: needs"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(can_run(kernel_or_throw("flash"), p, 1)) << can_run(kernel_or_throw("flash"), p, 1).reason;

  Tensors t = random_tensors(p, 1);
  const Agreement ag = prepare_agreement(p, t.inputs, sample_rows(p, 8, 1));
  const KernelCheck c = check_kernel(naive, p, t.inputs, ag, 1);
  EXPECT_EQ(c.verdict, Verdict::Skip);
  EXPECT_EQ(c.reason, s.reason);

  set("64K");  // below the tensors themselves
  EXPECT_THROW(random_tensors(p, 1), InvalidInput);
  unsetenv("ATTN_MEMORY_BUDGET");
  EXPECT_TRUE(can_run(naive, p, 1));
}

}  // namespace
}  // namespace attnlab
