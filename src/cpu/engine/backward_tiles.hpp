// The tile engine of flash's backward pass (src/cpu/engine/backward_tiles.cpp), one copy per SIMD target.
#pragma once

#include <cstddef>

#include "attnlab/kernel.hpp"

namespace attnlab::ATTN_TARGET_NS::cpu {

// Workspace of flash_backward for `threads` threads.
size_t flash_backward_bytes(const Problem& p, int threads);
// dQ, dK, dV of every element (backward.hpp) from Q, K, V, dO, O and LSE; interval masks
// (causal, windows, kv_lens) and sparse patterns (the rule from ctx.plan, a PatternPlan, else
// built inside the call).
void flash_backward(const Problem& p, const Inputs& in, const BackwardInputs& bw, const Gradients& g, RunContext& ctx);

}  // namespace attnlab::ATTN_TARGET_NS::cpu
