// attn_decode's attention on the tensor cores for bf16 and fp8 caches (attention_decode_mma.cu),
// called by attention.cu's launch_decode in place of its split kernel. Internal to kernels/src.
#pragma once

#include <cuda_runtime.h>

#include "attention_common.cuh"
#include "qf/kern/attention.h"

namespace qf::kern::attn_detail {

// Whether `shape` runs on this path (bf16 or fp8 caches, head_dim 256) and the current device's
// shared memory takes its block (98 KB).
bool mma_decode_shape_ok(const AttnShape& shape);
bool mma_decode_fits();

// Blocks a KV head's query group takes (16 query heads each).
int mma_decode_head_blocks(const AttnShape& shape);

// The split kernel's work for a decode step, as attn_split_kernel does it: grid (n_splits x
// mma_decode_head_blocks, Nkv), a block's split and head block by split_block; appends the new k
// and v rows at *a.pos, writes a.q, and leaves each split's (m, l) and unnormalized output in
// a.part_ml and a.part_o for attn_combine_kernel. A PDL launch, its early loads those of
// attn_decode's contract. With a.n_tokens > 0 (a verify's tokens, attn_decode_rows) grid.x is split
// x token x head block (split_block), every row comes from the cache (the rows appended before),
// token t's q_proj and partials at t times their strides: a plain launch.
cudaError_t launch_decode_mma(const AttnShape& shape, int n_splits, const AttnArgs& a,
                              cudaStream_t stream);

}  // namespace qf::kern::attn_detail
