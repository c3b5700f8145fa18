#include <cooperative_groups.h>

#include <cfloat>

#include "pdl.cuh"
#include "qf/kern/ops.h"
#include "qf/quant/formats.h"
#include "router_topk.cuh"

namespace qf::kern {
namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  v = lane < n_warps ? shared[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  return v;
}

// (v, idx) <- the largest v over the warp, the lowest idx among equal maxima; every lane gets it.
__device__ void warp_argmax(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) {
      v = ov;
      idx = oi;
    }
  }
}

__device__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__global__ void embed_kernel(FloatKind kind, const void* table, int h, const int* token,
                             float* out) {
  pdl::wait();
  const size_t row = static_cast<size_t>(*token) * h;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < h; i += gridDim.x * blockDim.x) {
    out[i] = kind == FloatKind::kF32
                 ? static_cast<const float*>(table)[row + i]
                 : quant::bf16_to_f32(static_cast<const uint16_t*>(table)[row + i]);
  }
}

__global__ void rms_norm_kernel(const float* x, const float* w, int n, float eps, float* out) {
  pdl::wait();
  __shared__ float red[32];
  const float* xr = x + static_cast<size_t>(blockIdx.x) * n;
  float* o = out + static_cast<size_t>(blockIdx.x) * n;
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * inv * (1.0f + w[i]);
}

__global__ void swiglu_kernel(const float* gate, const float* up, int n, int rows, size_t stride,
                              float* out) {
  pdl::wait();
  const int total = n * rows;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const size_t r = i / n, c = i % n;
    const float g = gate[r * stride + c];
    out[i] = g * sigmoid(g) * up[r * stride + c];
  }
}

// One warp, kPer logits per lane in registers (e <= 32 kPer): router_topk.cuh. Everything it
// reads is the router GEMV's output, so it waits first.
// kRows: block r takes row r (logits row_stride apart, ids and weights k apart); an instance
// of its own, so that the one-row kernel of the decode step stays as it was (here and below).
template <int kPer, bool kRows>
__global__ void router_kernel(const float* logits, int e, int k, int* ids, float* weights,
                              size_t row_stride) {
  pdl::wait();
  if constexpr (kRows) {
    const int r = blockIdx.x;
    logits += r * row_stride;
    ids += r * k;
    weights += r * k;
  }
  detail::router_topk_warp<kPer>([&](int i) { return logits[i]; }, e, k, ids, weights);
}

// ---- the residual add and the next norm, one row on a cluster --------------------------------
// A cluster of kNormCtas CTAs of kNormThreads threads stands for one block of 1024 threads:
// thread t = rank * kNormThreads + threadIdx.x owns elements t, t + 1024, ... (at most kNormPer)
// and cluster_sum adds the sums of squares in that block's order (each warp's xor tree, then an
// xor tree over the 32 warp sums). So the results are bit for bit those of the one-block kernels
// above (same formulas, fmaf where they contract), while the row's loads (the k expert outputs:
// 96 KiB for the 122B) spread over kNormCtas SMs instead of one SM's L2 bandwidth. Every load is
// issued before any arithmetic; those of data the kernel launched just before does not write
// are issued before pdl::wait() (through L2 where an earlier kernel of the step wrote them: see
// the header).
constexpr int kNormCtas = 8;  // the portable cluster size
constexpr int kNormThreads = 1024 / kNormCtas;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kNormPer = 4;  // elements per thread
constexpr int kNormMaxN = 1024 * kNormPer;

__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The sum of v over the cluster's 1024 threads in block_sum's order over one 1024-thread block;
// every thread gets it. red: this CTA's kNormWarps warp sums. Leaves this thread's arrival on
// the cluster barrier (its reads of the peers' red are done): call cluster_wait() before exit.
__device__ float cluster_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) red[warp] = v;
  cluster_arrive();
  cluster_wait();
  // lane l: the sum of warp l of the 1024 (rank l / kNormWarps, its warp l % kNormWarps)
  v = *cooperative_groups::this_cluster().map_shared_rank(red + lane % kNormWarps,
                                                          lane / kNormWarps);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  cluster_arrive();
  return v;
}

__device__ __forceinline__ int norm_thread() {
  return blockIdx.x * kNormThreads + threadIdx.x;
}

// The norm's second half, shared by the cluster kernels: ss (this thread's sum of squares of its
// new x) over the cluster, then out = x * rsqrt(mean(x^2) + eps) * (1 + w) for this thread's
// elements t, t + 1024, ... of n; ends with the cluster barrier (call it last).
__device__ __forceinline__ void cluster_norm_out(float ss, const float (&xv)[kNormPer],
                                                 const float (&wv)[kNormPer], int n, float eps,
                                                 int t, float* red, float* out) {
  ss = cluster_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {
    if (t + 1024 * r < n) out[t + 1024 * r] = xv[r] * inv * (1.0f + wv[r]);
  }
  cluster_wait();
}

// add_rms_norm_long_kernel for n <= kNormMaxN. Before the wait: w, and x (not written by the
// kernel just before); y's parts are its output.
// kParts: a power of two >= n_parts (the loads are unrolled over it, predicated by n_parts).
template <int kParts, bool kRows>
__global__ void __cluster_dims__(kNormCtas, 1, 1) __launch_bounds__(kNormThreads)
    add_rms_norm_kernel(float* x, const float* y, int n_parts, size_t part_stride, const float* w,
                        int n, float eps, float* out, size_t y_row_stride) {
  __shared__ float red[kNormWarps];
  if constexpr (kRows) {  // one cluster a row
    const size_t row = blockIdx.y;
    x += row * n;
    out += row * n;
    y += row * y_row_stride;
  }
  const int t = norm_thread();
  float xv[kNormPer], wv[kNormPer], yv[kNormPer][kParts];
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {
    const int i = t + 1024 * r;
    wv[r] = i < n ? __ldg(w + i) : 0.0f;
    xv[r] = i < n ? __ldcg(x + i) : 0.0f;
  }
  pdl::wait();
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {  // every load issued before any is used: one round trip
    const int i = t + 1024 * r;
#pragma unroll
    for (int p = 0; p < kParts; ++p) {
      yv[r][p] = i < n && p < n_parts ? y[p * part_stride + i] : 0.0f;
    }
  }
  float ss = 0;
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {
    if (t + 1024 * r < n) {
      float sum = yv[r][0];
#pragma unroll
      for (int p = 1; p < kParts; ++p) {
        if (p < n_parts) sum += yv[r][p];
      }
      xv[r] += sum;
      x[t + 1024 * r] = xv[r];
      ss = fmaf(xv[r], xv[r], ss);
    }
  }
  cluster_norm_out(ss, xv, wv, n, eps, t, red, out);
}

// moe_combine_norm's arrays moved to token `row` (moe_combine_norm's rows, ops.h).
__device__ __forceinline__ void combine_row(size_t row, int k, int h, size_t gate_row_stride,
                                            const float*& y, const float*& weights,
                                            const float*& shared, const float*& shared_gate,
                                            float*& x, float*& out) {
  y += row * k * h;
  weights += row * k;
  shared += row * h;
  if (shared_gate) shared_gate += row * gate_row_stride;
  x += row * h;
  out += row * h;
}

// moe_combine_norm_long_kernel for h <= kNormMaxN and k <= kK. Before the wait: w, x, the
// router weights and the shared gate logit (none written by the kernel just before); after it
// the expert outputs y (that kernel's) and the shared expert's (a kernel beside it).
template <int kK, bool kRows>
__global__ void __cluster_dims__(kNormCtas, 1, 1) __launch_bounds__(kNormThreads)
    moe_combine_norm_kernel(const float* y, const float* weights, int k, const float* shared,
                            const float* shared_gate, int h, float* x, const float* w, float eps,
                            float* out, size_t gate_row_stride) {
  __shared__ float red[kNormWarps];
  if constexpr (kRows) {  // one cluster a row
    combine_row(blockIdx.y, k, h, gate_row_stride, y, weights, shared, shared_gate, x, out);
  }
  const int t = norm_thread();
  float xv[kNormPer], wv[kNormPer], rw[kK];
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {
    const int i = t + 1024 * r;
    wv[r] = i < h ? __ldg(w + i) : 0.0f;
    xv[r] = i < h ? __ldcg(x + i) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kK; ++j) rw[j] = j < k ? __ldcg(weights + j) : 0.0f;
  const float g = shared_gate ? __ldcg(shared_gate) : 0.0f;
  pdl::wait();
  float yv[kNormPer][kK], sv[kNormPer];
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {
    const int i = t + 1024 * r;
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      yv[r][j] = i < h && j < k ? y[static_cast<size_t>(j) * h + i] : 0.0f;
    }
    sv[r] = i < h ? shared[i] : 0.0f;
  }
  const float sg = shared_gate ? sigmoid(g) : 1.0f;
  float ss = 0;
#pragma unroll
  for (int r = 0; r < kNormPer; ++r) {
    if (t + 1024 * r < h) {
      float acc = 0;
#pragma unroll
      for (int j = 0; j < kK; ++j) {
        if (j < k) acc = fmaf(rw[j], yv[r][j], acc);
      }
      xv[r] += fmaf(sg, sv[r], acc);
      x[t + 1024 * r] = xv[r];
      ss = fmaf(xv[r], xv[r], ss);
    }
  }
  cluster_norm_out(ss, xv, wv, h, eps, t, red, out);
}

// ---- rows longer than kNormMaxN: one block of 1024 threads ---------------------------------

// x += ((y_0 + y_1) + ...) over the parts, then out = x * rsqrt(mean(x^2) + eps) * (1 + w):
// the residual add and the next norm.
__global__ void add_rms_norm_long_kernel(float* x, const float* y, int n_parts, size_t part_stride,
                                         const float* w, int n, float eps, float* out,
                                         size_t y_row_stride) {
  pdl::wait();
  x += static_cast<size_t>(blockIdx.x) * n;
  out += static_cast<size_t>(blockIdx.x) * n;
  y += blockIdx.x * y_row_stride;
  __shared__ float red[32];
  float ss = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float sum = y[i];
    for (int p = 1; p < n_parts; ++p) sum += y[p * part_stride + i];
    const float v = x[i] + sum;
    x[i] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i] * inv * (1.0f + w[i]);
}

// The MoE output (k routed experts and the gated shared expert) added to the residual, then
// the next norm over the whole row.
__global__ void moe_combine_norm_long_kernel(const float* y, const float* weights, int k,
                                             const float* shared, const float* shared_gate, int h,
                                             float* x, const float* w, float eps, float* out,
                                             size_t gate_row_stride) {
  pdl::wait();
  combine_row(blockIdx.x, k, h, gate_row_stride, y, weights, shared, shared_gate, x, out);
  __shared__ float red[32];
  const float sg = shared_gate ? sigmoid(*shared_gate) : 1.0f;
  float ss = 0;
  for (int i = threadIdx.x; i < h; i += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < k; ++j) acc = fmaf(weights[j], y[static_cast<size_t>(j) * h + i], acc);
    const float v = x[i] + fmaf(sg, shared[i], acc);
    x[i] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(h) + eps);
  for (int i = threadIdx.x; i < h; i += blockDim.x) out[i] = x[i] * inv * (1.0f + w[i]);
}

// Pass 1: each block writes its (first) maximum's index; pass 2: one block reduces them.
__global__ void argmax_kernel(const float* logits, const int* candidates, int n, int* out) {
  pdl::wait();
  __shared__ float best_v[32];
  __shared__ int best_i[32];
  float v = -FLT_MAX;
  int idx = 0x7fffffff;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int id = candidates ? candidates[i] : i;
    if (id == 0x7fffffff) continue;  // a pass-1 block that saw no element
    const float x = logits[id];
    if (x > v || (x == v && id < idx)) {
      v = x;
      idx = id;
    }
  }
  warp_argmax(v, idx);
  if (threadIdx.x % 32 == 0) {
    best_v[threadIdx.x / 32] = v;
    best_i[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
      if (best_v[w] > best_v[0] || (best_v[w] == best_v[0] && best_i[w] < best_i[0])) {
        best_v[0] = best_v[w];
        best_i[0] = best_i[w];
      }
    }
    out[blockIdx.x] = best_i[0];
  }
}

__global__ void advance_kernel(const int* src, int* dst, int* pos) {
  pdl::wait();
  *dst = *src;
  *pos += 1;
}

__global__ void fill_kernel(uint32_t* words, size_t n, uint64_t seed, uint32_t mask,
                            uint32_t bits) {
  pdl::wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    words[i] = (static_cast<uint32_t>(z ^ (z >> 31)) & mask) | bits;
  }
}

int blocks_for(int n) {
  return std::min(1024, (n + kThreads - 1) / kThreads);
}
constexpr int kArgmaxBlocks = 256;

}  // namespace

cudaError_t embed(FloatKind kind, const void* table, int h, const int* token, float* out,
                  cudaStream_t stream) {
  return pdl::launch(embed_kernel, blocks_for(h), kThreads, 0, stream, kind, table, h, token, out);
}

cudaError_t rms_norm_1p(const float* x, const float* w, int n, int rows, float eps, float* out,
                        cudaStream_t stream) {
  return pdl::launch(rms_norm_kernel, rows, kThreads, 0, stream, x, w, n, eps, out);
}

cudaError_t add_rms_norm_1p(float* x, const float* y, const float* w, int n, float eps, float* out,
                            cudaStream_t stream) {
  return add_parts_rms_norm_1p(x, y, 1, 0, w, n, eps, out, stream);
}

cudaError_t add_parts_rms_norm_1p(float* x, const float* y, int n_parts, size_t part_stride,
                                  const float* w, int n, float eps, float* out, cudaStream_t stream,
                                  int rows, size_t y_row_stride) {
  if (n_parts < 1 || n_parts > kMaxNormParts || rows < 1 || rows > 65535) {
    return cudaErrorInvalidValue;
  }
  if (n <= kNormMaxN) {
    const bool m = rows > 1;
    auto* kernel =
        n_parts == 1   ? (m ? add_rms_norm_kernel<1, true> : add_rms_norm_kernel<1, false>)
        : n_parts == 2 ? (m ? add_rms_norm_kernel<2, true> : add_rms_norm_kernel<2, false>)
        : n_parts <= 4 ? (m ? add_rms_norm_kernel<4, true> : add_rms_norm_kernel<4, false>)
                       : (m ? add_rms_norm_kernel<kMaxNormParts, true>
                            : add_rms_norm_kernel<kMaxNormParts, false>);
    return pdl::launch(kernel, dim3(kNormCtas, rows), kNormThreads, 0, stream, x, y, n_parts,
                       part_stride, w, n, eps, out, y_row_stride);
  }
  return pdl::launch(add_rms_norm_long_kernel, rows, 1024, 0, stream, x, y, n_parts, part_stride, w,
                     n, eps, out, y_row_stride);
}

cudaError_t swiglu(const float* gate, const float* up, int n, int rows, size_t stride, float* out,
                   cudaStream_t stream) {
  return pdl::launch(swiglu_kernel, blocks_for(n * rows), kThreads, 0, stream, gate, up, n, rows,
                     stride, out);
}

cudaError_t router_topk(const float* logits, int e, int k, int* ids, float* weights,
                        cudaStream_t stream, int rows, size_t row_stride) {
  if (e < 1 || e > 1024 || k < 1 || k > e || k > 32 || rows < 1) return cudaErrorInvalidValue;
  const int per = (e + 31) / 32;
  const bool m = rows > 1;
  auto kernel = per <= 1    ? (m ? router_kernel<1, true> : router_kernel<1, false>)
                : per <= 2  ? (m ? router_kernel<2, true> : router_kernel<2, false>)
                : per <= 4  ? (m ? router_kernel<4, true> : router_kernel<4, false>)
                : per <= 8  ? (m ? router_kernel<8, true> : router_kernel<8, false>)
                : per <= 16 ? (m ? router_kernel<16, true> : router_kernel<16, false>)
                            : (m ? router_kernel<32, true> : router_kernel<32, false>);
  return pdl::launch(kernel, rows, 32, 0, stream, logits, e, k, ids, weights, row_stride);
}

cudaError_t moe_combine_norm(const float* y, const float* weights, int k, const float* shared,
                             const float* shared_gate, int h, float* x, const float* w, float eps,
                             float* out, cudaStream_t stream, int rows, size_t gate_row_stride) {
  if (rows < 1 || rows > 65535) return cudaErrorInvalidValue;
  if (h <= kNormMaxN && k <= 16) {
    const bool m = rows > 1;
    auto* kernel =
        k <= 8 ? (m ? moe_combine_norm_kernel<8, true> : moe_combine_norm_kernel<8, false>)
               : (m ? moe_combine_norm_kernel<16, true> : moe_combine_norm_kernel<16, false>);
    return pdl::launch(kernel, dim3(kNormCtas, rows), kNormThreads, 0, stream, y, weights, k,
                       shared, shared_gate, h, x, w, eps, out, gate_row_stride);
  }
  return pdl::launch(moe_combine_norm_long_kernel, rows, 1024, 0, stream, y, weights, k, shared,
                     shared_gate, h, x, w, eps, out, gate_row_stride);
}

int argmax_scratch_ints(int) {
  return kArgmaxBlocks;
}

cudaError_t argmax(const float* logits, int n, int* out, int* scratch, cudaStream_t stream) {
  const cudaError_t err =
      pdl::launch(argmax_kernel, kArgmaxBlocks, kThreads, 0, stream, logits, nullptr, n, scratch);
  if (err != cudaSuccess) return err;
  return pdl::launch(argmax_kernel, 1, kThreads, 0, stream, logits, scratch, kArgmaxBlocks, out);
}

cudaError_t fill_random_words(uint32_t* words, size_t n, uint64_t seed, uint32_t mask,
                              uint32_t bits, cudaStream_t stream) {
  return pdl::launch(fill_kernel, 1024, kThreads, 0, stream, words, n, seed, mask, bits);
}

cudaError_t advance(const int* src, int* dst, int* pos, cudaStream_t stream) {
  return pdl::launch(advance_kernel, 1, 1, 0, stream, src, dst, pos);
}

}  // namespace qf::kern
