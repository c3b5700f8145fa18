// The tensor-core form of attn_prefill's attention (attention_prefill.cu), called by
// attention.cu's attn_prefill after its append kernel has written the pass's k and v rows.
// Internal to kernels/src.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "qf/kern/attention.h"

namespace qf::kern::attn_detail {

// Launch shapes: kWide (128 query rows a block, 16-key tiles, 192 KB of shared memory: H100, H200)
// and kNarrow (32 rows, 96 KB: GPUs with less shared memory a block, as sm_120/121's 99 KB).
enum class MmaShape { kWide, kNarrow };

// Whether `shape` runs on the tensor-core path at all (head_dim 256), and the widest launch shape
// the current device's shared memory takes (false: neither fits).
bool mma_prefill_shape_ok(const AttnShape& shape);
bool mma_prefill_fits(MmaShape m);

// Floats of scratch the path needs: the K and V caches' rows as f16 limb pairs (max_len rows).
size_t mma_prefill_scratch_floats(const AttnShape& shape);

// out[t * ld_out + h * hd ..] = attention of token t (at pos[t], rows 0 .. pos[t] of the caches,
// which hold every row up to pos[n - 1]) for query head h, times sigmoid(gate); q from q_proj
// (row t at t * ld) normed and rotated as attn_decode does. The caches' entries: shape.kv.
cudaError_t launch_prefill_mma(MmaShape m, const AttnShape& shape, const float* q_proj, size_t ld,
                               int n, const float* q_norm_w, const float* rope, const int* pos,
                               const void* k_cache, const void* v_cache, float* out, size_t ld_out,
                               float* scratch, cudaStream_t stream);

}  // namespace qf::kern::attn_detail
