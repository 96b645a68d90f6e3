// no ops: not a kernel
