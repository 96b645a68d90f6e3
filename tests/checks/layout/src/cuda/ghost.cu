const cuda_impl::KernelOps ghost_ops = {};
