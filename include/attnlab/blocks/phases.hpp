// A dilated window seen per phase (Sparse Transformer's strided pattern, --dilation D with or
// without --window L,R and causal, no other sparse term). Row i of batch b sits at key-axis
// position pos = i + off_b; it sees key j when j is inside its interval (causal, window) AND
// pos - j is a multiple of D. So the rows whose positions are congruent to r mod D see only
// keys congruent to r, and in the phase's own coordinates (row i' = the i'-th such row, key
// j' = the j'-th such key) they see an ordinary window of floor(L / D), floor(R / D) about a
// diagonal that moves one key per row: D dense interval problems on strided rows and keys,
// with no masking arithmetic and no empty 63-of-64 keys per tile (the block map's cost: ~1/D
// of its work useful). The rule is the pattern's (pattern.hpp); this is only its shape.
#pragma once

#include <cstdint>
#include <vector>

#include "attnlab/problem.hpp"

namespace attnlab {

struct DilationPhase {
  int64_t b = 0;        // batch entry
  int64_t first_q = 0;  // row i' of `sub` is row first_q + D * i' of batch b
  int64_t first_k = 0;  // key j' of `sub` is key first_k + D * j'
  Problem sub;          // batch 1, no sparse terms; q_len / kv_len count the phase's rows / keys
};

// Every phase with at least one row, batch by batch (any q_len, kv_len, kv_lens, alignment);
// empty when p is not a pure dilated pattern (dilation 1, or another sparse term, a mask
// file). The phases' rows cover each row of p exactly once.
std::vector<DilationPhase> dilation_phases(const Problem& p);

}  // namespace attnlab
