// QF_CUDA_CHECK: every CUDA runtime call goes through it. CUDA errors are sticky, so a failure
// prints the call, file:line and the error's name and text, then aborts (no pretend recovery).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define QF_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    const cudaError_t qf_err_ = (call);                                                        \
    if (qf_err_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "qforge: CUDA error %s (%s) at %s:%d in %s\n",                      \
                   cudaGetErrorName(qf_err_), cudaGetErrorString(qf_err_), __FILE__, __LINE__, \
                   #call);                                                                     \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
