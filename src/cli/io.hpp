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
  Tensors stored;  // Q, K, V in problem.dtype when they are not the files' own data
  Inputs inputs;
};

// Infers the problem from the shapes (bhsd: (batch, heads, seq, dim); bshd: (batch, seq,
// heads, dim)) and the mask flags; throws InvalidInput naming the file when the shapes
// do not fit together (size_from_arrays, attnlab/problem.hpp: the Python module's rule too). The dtype: --dtype, else
// f16 when the files are '<f2', else f32. Float data is rounded to a 16-bit dtype (nearest even; a warning counts the
// values that overflowed to inf), '<f2' data is used as is for f16 and widened exactly for f32, '<u2' data is raw bf16
// bits and needs --dtype bf16.
LoadedInputs load_inputs(const std::string& q, const std::string& k, const std::string& v, const MaskFlags& flags);

// Counts NaN/Inf values of the stored inputs and prints a warning per tensor naming the
// first index (and how many of them rounding to a 16-bit dtype made).
void warn_nonfinite(const LoadedInputs& li);

}  // namespace attnlab::cli
