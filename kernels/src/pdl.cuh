// Programmatic Dependent Launch (PDL) for the decode-step kernels (sm_90 and later; sm_121
// included). A decode step is ~670 short launches, so the gap between one kernel's end and the
// next one's start is a large part of it. pdl::launch() lets a kernel's blocks start as soon as
// every block of the previous kernel on the stream has exited, before that kernel's memory is
// flushed; the kernel then calls pdl::wait() (griddepcontrol.wait), which returns once the
// previous grid has completed and its writes are visible.
//
// Contract for every kernel launched through pdl::launch():
//   * call pdl::wait() before reading anything an earlier kernel wrote and before writing
//     anything an earlier kernel reads or writes, and before any return (a block that exits
//     without waiting would let the grid complete ahead of its predecessor, and the next kernel's
//     wait would no longer cover the predecessor). Loads of data no kernel writes during the
//     decode step (weights) may be issued before it, and so may loads through L2 (ld.global.cg)
//     of data written by a kernel launched two or more places earlier on the stream (and not
//     since): that kernel has completed, its writes flushed, before this grid's blocks are
//     scheduled (next point: the kernel between has passed its wait).
//   * wait() also triggers the next kernel (griddepcontrol.launch_dependents): its blocks may be
//     scheduled as soon as every block of this grid has passed its own wait, i.e. once the grid
//     before it has completed; they stop at their wait() until this grid completes. So at most
//     one grid runs ahead of its wait and the chain of waits orders all of them. (H200, 122B
//     synthetic: 4.88 -> 4.65 ms per step against waiting for exits only.)
// In stream capture the attribute becomes a programmatic edge of the graph. On a launch without
// the attribute (or on an arch without it) pdl::wait() returns at once.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace qf::kern::pdl {

// Waits until the previous grid on the stream has completed and its writes are visible, then
// lets the next kernel's blocks be scheduled (they stop at their own wait(), which needs this
// grid to complete: the chain of waits still orders every kernel).
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization. Returns
// the launch's error (as cudaGetLastError() after <<<>>>).
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace qf::kern::pdl
