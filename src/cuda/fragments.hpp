// The tensor cores' fragment layouts (the PTX ISA's tables "Matrix Fragments for mma.m16n8k16
// with floating point type" and "ldmatrix"): which element of which matrix each lane of a warp
// holds in each register. Host and device code (ATTN_HD): tensor_core.cuh's emulation assembles a
// warp's matrices with them, kernels index their fragments with them, tests check them against
// the tables (tests/kernels/test_cuda.cpp, CudaEmulation.Mma*). groupID = lane / 4, threadID_in_group =
// lane % 4 in the tables' words; the element index i counts the lane's halves in register order
// (register i / 2, the lower index in the low 16 bits).
#pragma once

#include "attnlab/blocks/interval.hpp"  // ATTN_HD

namespace attnlab::tensor_core {

struct Coord {
  int row, col;
};

// A (16 x 16, row-major fragments): element i = 0..7 of a lane; register i / 2, half i % 2.
ATTN_HD constexpr Coord mma_a(int lane, int i) {
  return {lane / 4 + ((i / 2) % 2) * 8, (lane % 4) * 2 + (i % 2) + (i / 4) * 8};
}
// B (16 x 8, "col": k down, n across): element i = 0..3; register i / 2, half i % 2.
ATTN_HD constexpr Coord mma_b(int lane, int i) { return {(lane % 4) * 2 + (i % 2) + (i / 2) * 8, lane / 4}; }
// C and D (16 x 8 float32): element i = 0..3.
ATTN_HD constexpr Coord mma_c(int lane, int i) { return {lane / 4 + (i / 2) * 8, (lane % 4) * 2 + (i % 2)}; }
// ldmatrix: where in an 8 x 8 matrix as stored (row = the row whose address lane row gave) the
// two b16 elements (half h = 0, 1) lane l receives come from; .trans delivers the transposed
// matrix's, i.e. column lane / 4 of the stored rows.
ATTN_HD constexpr Coord ldmatrix(int lane, int h, bool trans) {
  return trans ? Coord{(lane % 4) * 2 + h, lane / 4} : Coord{lane / 4, (lane % 4) * 2 + h};
}

}  // namespace attnlab::tensor_core
