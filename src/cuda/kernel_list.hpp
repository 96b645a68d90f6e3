// The CUDA kernels, in ladder order: one row each - the one list that the registry's entries
// (src/cuda/kernels.cpp: cuda::kernels()), the device and emulator ops' declarations (args.hpp) and
// the emulator's test kernels (tests/kernels/cuda_emu_kernels.cpp) expand. A new CUDA kernel is its file
// src/cuda/<id>.cu defining cuda_dev::<id>_ops (args.hpp's KernelOps; CMakeLists globs src/cuda/*.cu),
// its #include in tests/kernels/cuda_emu_kernels.cpp (the emulator compiles the same source as C++), and a
// row here; docs/cuda.md's table.
//
// X(id, description, precision ("": the default), capabilities (kernel.hpp; the device ops'
//   unsupported() guards the limits too), the SM count the emulator sizes its launches for)
// The kernel is named "cuda_<id>" (the emulator's "emu_cuda_<id>"). nvcc reads only the ids.
#pragma once

#define ATTN_CUDA_KERNELS(X)                                                                                       \
  X(naive, "CUDA textbook: one warp per query row, scores in global memory", "",                                   \
    (Capabilities{.head_dim_v = true, .score_mods = true}), 1)                                                     \
  X(flash,                                                                                                         \
    "CUDA FlashAttention-2 style fp32: K/V tiles in shared memory, online softmax in registers, GQA-grouped, "     \
    "causal/window tile skipping, sparse patterns by block map",                                                   \
    "", (Capabilities{.patterns = true, .head_dim_v = true, .score_mods = true}), 1)                               \
  X(flash_bf16,                                                                                                    \
    "CUDA FlashAttention-2 on tensor cores: bf16 mma.sync m16n8k16 (float32 accumulators), ldmatrix fragments, 4 " \
    "warps x 16 rows, 64-key K/V tiles double-buffered by cp.async, online softmax in registers, P in bf16; "      \
    "GQA-grouped, interval and sparse masks",                                                                      \
    "bf16 in only; bf16 products, f32 accumulate, P to bf16",                                                      \
    (Capabilities{.patterns = true,                                                                                \
                  .head_dim_v = true,                                                                              \
                  .score_mods = true,                                                                              \
                  .arithmetic = Arithmetic::Bf16Products,                                                          \
                  .max_head_dim = 128}),                                                                           \
    1)                                                                                                             \
  X(decode,                                                                                                        \
    "CUDA split-KV decode (FlashDecoding) for q_len <= 16: key chunks x (batch, kv head) blocks, all rows of a "   \
    "GQA group per block, raw cache rows double-buffered by cp.async, exact LSE merge; f32/bf16/f16, "             \
    "q8_0/q4_0/u8/u4/fp8, paged caches",                                                                           \
    "f32/bf16/f16 widened exactly, a quantized cache read by its rule; f32 compute",                               \
    (Capabilities{.head_dim_v = true,                                                                              \
                  .kv_quant = true,                                                                                \
                  .paged = true,                                                                                   \
                  .score_mods = true,                                                                              \
                  .max_q_len = 16,                                                                                 \
                  .max_head_dim = 256,                                                                             \
                  .limit_note = "splits the keys of a few new query rows; cuda_flash runs prefill"}),              \
    132)
