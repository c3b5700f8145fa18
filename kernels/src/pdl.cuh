// Programmatic Dependent Launch (PDL) for the decode-step kernels (sm_90 and later; sm_121
// included). A decode step is ~590 short launches, so the gap between one kernel's end and the
// next one's start is a large part of it. pdl::launch() lets a kernel's blocks start as soon as
// every block of the previous kernel on the stream has passed its pdl::wait() or exited, before
// that kernel has completed; the kernel then calls pdl::wait() (griddepcontrol.wait), which
// returns once the previous grid has completed and its writes are visible.
//
// Contract for every kernel launched through pdl::launch() or pdl::launch_cluster(). Its
// "predecessor" is the kernel it directly follows on the stream (in a captured graph: the node
// its programmatic edge comes from).
//   * call pdl::wait() before reading anything the predecessor writes, before writing anything
//     an earlier kernel reads or writes, and before any return (a block that exits without
//     waiting would let the grid complete ahead of its predecessor, and the next kernel's wait
//     would no longer cover the predecessor).
//   * wait() also triggers the next kernel (griddepcontrol.launch_dependents): its blocks may be
//     scheduled as soon as every block of this grid has passed its own wait, i.e. once the grid
//     before it has completed; they stop at their wait() until this grid completes. So at most
//     one grid runs ahead of its wait and the chain of waits orders all of them. (H200, 122B
//     synthetic: 4.88 -> 4.65 ms per step against waiting for exits only.)
//   * Early loads, issued before wait(), are allowed for
//       (a) data no kernel writes during the decode step (weights): any load;
//       (b) data last written by work ordered before the predecessor: by a kernel two or more
//           launches back on the stream, or by anything the predecessor itself had to wait for
//           (a graph edge or event join such as the shared-expert branch of cuda_engine.cpp
//           moe(), a memcpy or memset, a launch without the attribute): loads through L2 only
//           (ld.global.cg, __ldcg), never the L1 / read-only path.
//     Why (b) is complete when this kernel's blocks start: they are scheduled only after every
//     block of the predecessor has executed launch_dependents, which wait() issues after
//     griddepcontrol.wait returned, i.e. after the predecessor's own predecessor completed and
//     its writes were flushed to L2; that grid in turn completed only after all its blocks
//     waited on the one before (first rule), so every kernel further back completed too; and
//     work joined by a full (non-programmatic) dependency completed before the predecessor
//     started at all. L2 is the point of coherence; L1 is not coherent across SMs and this
//     grid may share an SM with older blocks that cached those lines, hence .cg. Not covered:
//     the predecessor's writes, and work on a concurrent branch that the predecessor does not
//     depend on (unordered anyway). A kernel that loads (b)-data early states which data in
//     its header contract, so that callers do not write it in the launch just before.
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

// A launch of `grid` x `block` with programmatic stream serialization and, unless nullptr, one
// more attribute `extra`; the launch's error, as cudaGetLastError() after <<<>>>.
template <class... Params, class... Args>
cudaError_t launch_with(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, const cudaLaunchAttribute* extra, Args&&... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (extra) attr[1] = *extra;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = extra ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization.
template <class... Params, class... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  return launch_with(kernel, grid, block, smem, stream, nullptr, std::forward<Args>(args)...);
}

// As launch(), the grid made of clusters of `cluster` blocks (sm_90 and later; at most 8 blocks
// per cluster, the portable size).
template <class... Params, class... Args>
cudaError_t launch_cluster(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block,
                           size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute dims;
  dims.id = cudaLaunchAttributeClusterDimension;
  dims.val.clusterDim.x = cluster.x;
  dims.val.clusterDim.y = cluster.y;
  dims.val.clusterDim.z = cluster.z;
  return launch_with(kernel, grid, block, smem, stream, &dims, std::forward<Args>(args)...);
}

}  // namespace qf::kern::pdl
