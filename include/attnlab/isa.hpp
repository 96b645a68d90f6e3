// Instruction-set targets: which ones this build has, which ones this CPU runs, which one a
// SIMD kernel uses.
//
// The SIMD kernels (simd, threaded, flash, decode) are compiled once per target from the
// same source (src/cpu/dispatch/target.hpp): on x86-64 `scalar` (one float per instruction),
// `avx2` (x86-64-v3: AVX2, FMA, F16C, BMI) and `avx512` (x86-64-v4: AVX-512 F/BW/DQ/VL/CD);
// on aarch64 `scalar` and `neon`. An ATTN_NATIVE=ON build has one target, named after what
// -march=native enables. The rest of the lab (reference, naive, blocked, I/O) is built for
// the baseline of the architecture and runs on any CPU of it.
//
// Which target a SIMD kernel uses, first match:
//   1. --isa NAME on run / verify / peak / sweep (set_default_isa),
//   2. the environment variable ATTN_ISA,
//   3. the widest target this CPU runs.
// Naming a target the build lacks, or one the CPU cannot run, is an InvalidInput naming
// what the build has and what the CPU runs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attnlab {

// Targets compiled into this binary, narrowest first.
const std::vector<std::string>& built_isas();
// Whether this CPU (and the OS: AVX state enabled in XCR0) runs `isa`'s instructions.
// Any name is accepted; unknown names are not run.
bool cpu_runs_isa(std::string_view isa);
// built_isas() that this CPU runs, narrowest first (never empty: scalar runs everywhere).
std::vector<std::string> runnable_isas();
// The widest of runnable_isas().
const std::string& best_isa();
// The target the SIMD kernels use when none is named for a call (see above).
std::string default_isa();
// Checks `isa` (throws InvalidInput: not built / not run by this CPU), then makes it the
// default for this process, over ATTN_ISA. "" resets to ATTN_ISA / best.
void set_default_isa(std::string_view isa);
// Names joined for messages: "scalar, avx2".
std::string isa_names(const std::vector<std::string>& names);
// Why this CPU cannot run `isa`: "this CPU cannot run avx512; it runs scalar, avx2 (CPU
// features: ...)" - the one wording of require_isa and of unavailable variants.
std::string cannot_run_reason(std::string_view isa);
// Throws InvalidInput when `isa` is not built or not run here; `field` names the flag.
void require_isa(std::string_view isa, std::string_view field = "isa");
// Float lanes per vector of a built target (0 when not built).
int isa_lanes(std::string_view isa);
// Compile flags of a built target ("" when not built), as CMake gave them.
std::string isa_flags(std::string_view isa);
// The CPU's SIMD features as the detection saw them, e.g. "sse2 avx fma f16c avx2 bmi2".
std::string cpu_isa_features();

// Cache sizes of the running machine (bytes, per core for L1d/L2; 0 = unknown), with where
// they came from ("sysconf", "sysfs" or "default"). Kernels size their tiles with cache().
struct CacheSizes {
  int64_t l1d = 0, l2 = 0, l3 = 0;
  std::string source;
};
const CacheSizes& cache();
// The L2 size the kernels plan with: cache().l2, or 1 MiB when unknown; ATTN_L2_BYTES
// overrides it (for experiments on tile sizes).
int64_t planning_l2_bytes();

}  // namespace attnlab
