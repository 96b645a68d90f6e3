#include "cuda/naive.cu"
#include "cuda/ghost.cu"
