// The tensor-core self-test kernels on the GPU (tensor_core_check.hpp): device buffers, one launch,
// the result copied back.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "cuda/tensor_core_check.hpp"
#include "cuda/tensor_core_selftest.cuh"

namespace attnlab::cuda_dev {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
  }
}

template <class T>
class Buffer {
 public:
  Buffer(const T* host, size_t n) : n_(n) {
    check(cudaMalloc(&p_, n * sizeof(T)), "cudaMalloc");
    if (host) check(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  ~Buffer() { cudaFree(p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() const { return p_; }
  void copy_to(T* host) const {
    check(cudaMemcpy(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy back");
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

void finish(const char* kernel) {
  check(cudaGetLastError(), kernel);
  check(cudaDeviceSynchronize(), kernel);
}

}  // namespace

void tensor_core_mma(const uint16_t* A, const uint16_t* B, const float* C, float* D) {
  const Buffer<uint16_t> a(A, 256), b(B, 128);
  const Buffer<float> c(C, 128), d(nullptr, 128);
  tc_selftest::mma(a.get(), b.get(), c.get(), d.get(), -1);
  finish("mma_one");
  d.copy_to(D);
}

void tensor_core_ldmatrix(const uint16_t* M, uint32_t* out, bool trans) {
  const Buffer<uint16_t> m(M, 256);
  const Buffer<uint32_t> o(nullptr, 128);
  tc_selftest::ldmatrix(m.get(), o.get(), trans);
  finish("ldmatrix_one");
  o.copy_to(out);
}

void tensor_core_ldmatrix_mma(const uint16_t* A, const uint16_t* B, float* D) {
  const Buffer<uint16_t> a(A, 256), b(B, 256);
  const Buffer<float> d(nullptr, 256);
  tc_selftest::ldmatrix_then_mma(a.get(), b.get(), d.get());
  finish("ldmatrix_mma");
  d.copy_to(D);
}

}  // namespace attnlab::cuda_dev
