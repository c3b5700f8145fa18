// gemm_route (gemm.h): a router's choices sorted by matrix, stably, by one warp: a pass over the
// ids counts each matrix's choices (the lanes of a 32-id window that share an id found by
// __match_any_sync, their lowest lane adding the count), a scan of the counts gives the
// offsets, and a second pass places each choice at its matrix's next entry plus its rank among
// the window's lanes with that id. A prefill pass routes a few thousand choices; one warp does
// it in a few microseconds and needs no atomics, so the order is the ids' order.
#include "qf/kern/gemm.h"

namespace qf::kern {
namespace {

constexpr unsigned kAll = 0xFFFFFFFFu;

// Lane `lane`'s choice in the window at `base`: its index, matrix (valid: in range) and the
// lanes of the window whose choices have the same matrix.
struct Choice {
  int i, id;
  bool valid;
  unsigned peers;
};
__device__ __forceinline__ Choice choice_at(const int* ids, int n, int n_mats, int base, int lane) {
  Choice c;
  c.i = base + lane;
  c.id = c.i < n ? ids[c.i] : -1;
  c.valid = c.id >= 0 && c.id < n_mats;
  c.peers = __match_any_sync(kAll, c.valid ? c.id : -1);
  return c;
}

__global__ void __launch_bounds__(32)
    gemm_route_kernel(const int* __restrict__ ids, int n, int per_x, int n_mats,
                      int* __restrict__ offsets, int* __restrict__ x_rows,
                      int* __restrict__ y_rows) {
  __shared__ int next[kRouteMaxMats];
  const int lane = static_cast<int>(threadIdx.x);
  const unsigned below = (1u << lane) - 1u;
  for (int m = lane; m < n_mats; m += 32) next[m] = 0;
  __syncwarp();
  for (int base = 0; base < n; base += 32) {  // counts
    const Choice c = choice_at(ids, n, n_mats, base, lane);
    if (c.valid && (c.peers & below) == 0) next[c.id] += __popc(c.peers);
    __syncwarp();
  }
  // Exclusive scan: lane l sums its run of matrices, the lanes' sums are scanned by shuffles.
  const int per_lane = (n_mats + 31) / 32, lo = min(lane * per_lane, n_mats),
            hi = min(lo + per_lane, n_mats);
  int sum = 0;
  for (int m = lo; m < hi; ++m) sum += next[m];
  int run = sum;
  for (int d = 1; d < 32; d <<= 1) {
    const int v = __shfl_up_sync(kAll, run, d);
    if (lane >= d) run += v;
  }
  run -= sum;
  for (int m = lo; m < hi; ++m) {
    const int c = next[m];
    next[m] = offsets[m] = run;
    run += c;
  }
  if (lane == 31) offsets[n_mats] = run;
  __syncwarp();
  for (int base = 0; base < n; base += 32) {  // placement
    const Choice c = choice_at(ids, n, n_mats, base, lane);
    if (c.valid) {
      const int e = next[c.id] + __popc(c.peers & below);
      x_rows[e] = c.i / per_x;
      y_rows[e] = c.i;
    }
    __syncwarp();
    if (c.valid && (c.peers & below) == 0) next[c.id] += __popc(c.peers);
    __syncwarp();
  }
}

}  // namespace

cudaError_t gemm_route(const int* ids, int n, int per_x, int n_mats, int* offsets, int* x_rows,
                       int* y_rows, cudaStream_t stream) {
  if (n < 0 || per_x < 1 || n_mats < 1 || n_mats > kRouteMaxMats) return cudaErrorInvalidValue;
  gemm_route_kernel<<<1, 32, 0, stream>>>(ids, n, per_x, n_mats, offsets, x_rows, y_rows);
  return cudaGetLastError();
}

}  // namespace qf::kern
