// The tensor-core self-test kernels (tensor_core_selftest.cuh) run on the GPU, on host arrays
// (copied in and back): what tests/kernels/test_cuda.cpp's CudaDevice.TensorCores* check against the PTX
// ISA's tables, the same checks the emulation passes. Builds with ATTN_HAS_CUDA only; each
// throws std::runtime_error naming the CUDA call that failed.
#pragma once

#include <cstdint>

namespace attnlab::cuda_dev {

// A (16 x 16) and B (16 x 8) bf16 bits, C (16 x 8): D[lane * 4 + i] of one mma.m16n8k16.
void tensor_core_mma(const uint16_t* A, const uint16_t* B, const float* C, float* D);
// Four 8 x 8 b16 matrices: out[lane * 4 + j], the register ldmatrix.x4 (.trans) gives lane.
void tensor_core_ldmatrix(const uint16_t* M, uint32_t* out, bool trans);
// A (16 x 16), B (16 x 16, k down) by ldmatrix, D (16 x 16) = A B by two mma.
void tensor_core_ldmatrix_mma(const uint16_t* A, const uint16_t* B, float* D);

}  // namespace attnlab::cuda_dev
