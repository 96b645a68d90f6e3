#define ATTN_CUDA_KERNELS(X) X(naive, "d", "", (Capabilities{}), 1)
