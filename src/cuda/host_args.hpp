// Problem + host tensors -> the DeviceArgs a CUDA kernel takes (still pointing at host memory),
// and the extents of the host views. Shared by the device path (kernels.cpp) and the host
// emulation in the tests.
#pragma once

#include "attnlab/kernel.hpp"
#include "cuda/args.hpp"

namespace attnlab::cuda_impl {

// The problem's shape, mask and scale; no pointers, no strides.
DeviceArgs problem_args(const Problem& p);
// Also the host pointers and strides. Throws InvalidInput for views the CUDA path cannot copy (negative strides,
// overlapping rows).
DeviceArgs device_args(const Problem& p, const Inputs& in, const Outputs& out);

// For a sparse problem, the kernel's block map (one query tile per thread block: br =
// ops.block_rows / G) as make_plan's plan; nullptr for an interval mask.
std::shared_ptr<const Plan> block_plan(const Problem& p, const KernelOps& ops);
// Points a.map at the plan's block map (a sparse problem; `plan` is ctx.plan, or nullptr: then
// the map is built here and `keep` holds it for the run).
void attach_plan(DeviceArgs& a, const Problem& p, const KernelOps& ops, const Plan* plan,
                 std::shared_ptr<const Plan>& keep);

// Sets a's score modifications from p: softcap, and the per-head ALiBi slopes and sink logits resolved
// against q_heads into `keep` (which must outlive the run; a's pointers point into it).
void attach_head_terms(DeviceArgs& a, const Problem& p, std::vector<float>& keep);

// Elements of Q, K, V from each view's first element to its last (what one contiguous copy
// moves), in the inputs' storage dtype (K and V of a quantized cache: bytes).
struct InputExtents {
  int64_t q = 0, k = 0, v = 0;
};
InputExtents input_extents(const Inputs& in);

// Elements from a view's first element to its last (what one contiguous copy moves).
template <class T>
int64_t span_elems(const View4<T>& v) {
  return (v.batch - 1) * v.stride_b + (v.heads - 1) * v.stride_h + (v.seq - 1) * v.stride_s + v.dim;
}

}  // namespace attnlab::cuda_impl
