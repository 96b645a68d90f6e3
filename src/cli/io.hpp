// Loading Q, K, V (and expected outputs) from .npy files into a Problem.
#pragma once

#include <string>

#include "attnlab/npy.hpp"
#include "attnlab/tensor.hpp"
#include "common.hpp"

namespace attnlab::cli {

struct LoadedInputs {
  Problem problem;
  NpyArray q, k, v;
  Inputs inputs;
};

// Infers the problem from the shapes (bhsd: (batch, heads, seq, dim); bshd: (batch, seq,
// heads, dim)) and the mask flags; throws InvalidInput naming the file when the shapes
// do not fit together.
LoadedInputs load_inputs(const std::string& q, const std::string& k, const std::string& v,
                         const MaskFlags& flags);

// Counts NaN/Inf values and prints a warning naming the tensor and the first index.
void warn_nonfinite(const std::string& name, const FloatBuffer& data);

}  // namespace attnlab::cli
