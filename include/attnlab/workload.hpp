// Inputs where attention is sparse for real (issue 66's needle workloads): random_tensors' uniform
// noise, with needles planted - keys aligned with a query row, scaled so that the row's needles hold a
// chosen share of its softmax mass under dense attention. The share sets the attention's entropy: 0.97
// puts nearly all of a row's mass on its needles, 0.5 half, whatever the context length.
//
// For each query row (b, h, i), `per_row` keys of its visible interval are drawn (seeded, distinct
// within a sequence and kv head, so rows of one group never share a needle) and each is set to c q,
// with c such that its scaled score s* = scale c |q|^2 solves
//   per_row e^s* / (per_row e^s* + n E[e^s]) = mass,
// n the row's visible keys and E[e^s] = e^(sigma^2 / 2) the noise's (uniform [-1, 1) keys: a scaled
// score's variance sigma^2 = scale^2 |q|^2 / 3). V stays noise. The needles are written into the
// float32 values before the cache stores them (a quantized or 16-bit cache rounds them as any row),
// so the mass is met in expectation, not exactly; selection_accuracy measures what it is.
#pragma once

#include <cstdint>

#include "attnlab/problem.hpp"
#include "attnlab/tensor.hpp"

namespace attnlab {

struct Needles {
  int64_t per_row = 0;  // 0: plain random_tensors
  double mass = 0.97;   // the needles' share of a row's softmax mass, in (0, 1)
  bool any() const { return per_row > 0; }
};

// Throws InvalidInput naming the field (needles.per_row >= 0, 0 < needles.mass < 1).
void validate_needles(const Needles& n);

// random_tensors(p, seed) with the needles planted (for a topk problem, the summaries of the planted
// cache attached). More needles than a row's group can place in its visible keys are an InvalidInput.
Tensors workload_tensors(const Problem& p, uint64_t seed, const Needles& needles);

}  // namespace attnlab
