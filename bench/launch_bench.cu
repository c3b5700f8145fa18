// What a kernel boundary costs in the decode step's graph, next to a grid-wide barrier inside one
// persistent kernel: the question behind "one graph of ~640 PDL launches" versus a persistent
// megakernel (calm, Hazy's megakernel) for batch-1 decode. Prints figures; asserts nothing.
//
//   graph chain   1000 launches of a kernel that waits for its predecessor and writes one float per
//                 block, captured in one graph, with and without programmatic dependent launch
//                 (PDL, kernels/src/pdl.cuh), for 1 block and 1, 2, 3 blocks per SM; time per
//                 kernel over 5 replays.
//   persistent    one cooperative launch of a kernel doing the same work between 1000 grid
//                 barriers (an atomic arrival counter and a generation word, spun on by one thread
//                 per block); time per barrier over 5 launches, 1, 2, 3 blocks per SM.
//   Also whether a cooperative launch can be captured in a graph and replayed.
//
// H200 (2026-11-21): a graph boundary costs 0.47 us (1 block) to 0.80 us (396 blocks) with PDL,
// 0.72 to 1.05 us without; a grid barrier 1.97 to 2.28 us. So the step's time is in the kernels'
// own latency chains, not in launching them.
//
// Usage: qforge-bench-launch
#include <cuda_runtime.h>

#include <cstdio>

#include "pdl.cuh"
#include "qf/kern/cuda_check.h"

namespace {

__global__ void step_kernel(float* buf, int i) {
  qf::kern::pdl::wait();
  if (threadIdx.x == 0) buf[blockIdx.x] += 1.0f + i;
}

// All blocks arrive; the last resets the counter and bumps the generation the others spin on.
__device__ void grid_sync(unsigned* count, volatile unsigned* gen, unsigned n_blocks) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned g = *gen;
    __threadfence();
    if (atomicAdd(count, 1) == n_blocks - 1) {
      *count = 0;
      __threadfence();
      atomicAdd(const_cast<unsigned*>(gen), 1);
    } else {
      while (*gen == g) {
      }
    }
    __threadfence();
  }
  __syncthreads();
}

__global__ void persistent_kernel(float* buf, unsigned* sync, int n) {
  for (int i = 0; i < n; ++i) {
    if (threadIdx.x == 0) buf[blockIdx.x] += 1.0f + i;
    grid_sync(sync, sync + 32, gridDim.x);
  }
}

}  // namespace

int main() {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "qforge-bench-launch: no CUDA device\n");
    return 4;
  }
  int n_sm = 0;
  QF_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  float* buf;
  QF_CUDA_CHECK(cudaMalloc(&buf, 1 << 20));
  QF_CUDA_CHECK(cudaMemset(buf, 0, 1 << 20));
  unsigned* sync;
  QF_CUDA_CHECK(cudaMalloc(&sync, 256));
  QF_CUDA_CHECK(cudaMemset(sync, 0, 256));
  cudaStream_t s;
  QF_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  QF_CUDA_CHECK(cudaEventCreate(&a));
  QF_CUDA_CHECK(cudaEventCreate(&b));
  const int n = 1000, reps = 5;
  for (int blocks : {1, n_sm, 2 * n_sm, 3 * n_sm}) {
    for (int pdl : {0, 1}) {
      cudaGraph_t g;
      cudaGraphExec_t ge;
      QF_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < n; ++i) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = pdl;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = blocks;
        cfg.blockDim = 256;
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        QF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, step_kernel, buf, i));
      }
      QF_CUDA_CHECK(cudaStreamEndCapture(s, &g));
      QF_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      QF_CUDA_CHECK(cudaGraphLaunch(ge, s));  // warm
      QF_CUDA_CHECK(cudaStreamSynchronize(s));
      QF_CUDA_CHECK(cudaEventRecord(a, s));
      for (int r = 0; r < reps; ++r) QF_CUDA_CHECK(cudaGraphLaunch(ge, s));
      QF_CUDA_CHECK(cudaEventRecord(b, s));
      QF_CUDA_CHECK(cudaEventSynchronize(b));
      float ms = 0;
      QF_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      std::printf("graph chain, %4d blocks, pdl %d: %.3f us per kernel\n", blocks, pdl,
                  ms * 1000 / (reps * n));
      QF_CUDA_CHECK(cudaGraphExecDestroy(ge));
      QF_CUDA_CHECK(cudaGraphDestroy(g));
    }
  }
  for (int per_sm : {1, 2, 3}) {
    int blocks = per_sm * n_sm, iters = n;
    void* args[] = {&buf, &sync, &iters};
    QF_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel), blocks,
                                              256, args, 0, s));  // warm
    QF_CUDA_CHECK(cudaStreamSynchronize(s));
    QF_CUDA_CHECK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; ++r) {
      QF_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel), blocks,
                                                256, args, 0, s));
    }
    QF_CUDA_CHECK(cudaEventRecord(b, s));
    QF_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    QF_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    std::printf("persistent, %4d blocks: %.3f us per grid barrier\n", blocks,
                ms * 1000 / (reps * n));
  }
  {
    int blocks = 2 * n_sm, iters = 10;
    void* args[] = {&buf, &sync, &iters};
    cudaGraph_t g;
    cudaGraphExec_t ge;
    QF_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<void*>(persistent_kernel),
                                                      blocks, 256, args, 0, s);
    const cudaError_t e2 = cudaStreamEndCapture(s, &g);
    std::printf("cooperative launch in capture: %s / %s\n", cudaGetErrorString(e),
                cudaGetErrorString(e2));
    if (e == cudaSuccess && e2 == cudaSuccess) {
      QF_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
      QF_CUDA_CHECK(cudaGraphLaunch(ge, s));
      QF_CUDA_CHECK(cudaStreamSynchronize(s));
      std::printf("replayed ok\n");
    }
  }
  return 0;
}
