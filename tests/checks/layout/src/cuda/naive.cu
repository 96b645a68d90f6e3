const cuda_impl::KernelOps naive_ops = {};
