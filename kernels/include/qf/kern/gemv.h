// Matrix-vector products for batch-1 decode, one kernel per weight format, all reading the
// "kernel layouts" below (produced once at load from the checkpoint's layouts by repack_*).
// fp32 activations in and out, fp32 accumulation; each weight element is reconstructed exactly
// as qf/quant/formats.h defines it, so results equal the CPU reference (quant::StoredLinear)
// up to summation order.
//
// Kernel layouts (all row-major over the N output rows, so one row is one contiguous stream):
//   kBf16 / kF32  w: [N, K] as stored.
//   kInt4         w: [N, K/8] u32, word p of row r = columns 8p..8p+7, nibble j = column 8p+j
//                 (the GPTQ nibble order, transposed from qweight [K/8, N]);
//                 scales: [N, G] f16; zeros: [N, G] u8 holding the v1 zero point + 1;
//                 w = scale * (code - zero), G = ceil(K / group).
//   kInt8         as kInt4 with 4 columns per word (byte j = column 4p+j).
//   kFp8          w: [N, K] E4M3FN codes; block_scale: [ceil(N/block), ceil(K/block)] f32,
//                 w = e4m3(code) * block_scale[r / block][c / block].
// Experts: `n_slots` products in one launch. Slot s uses matrix ids[s] (nullptr: matrix s) of a
// stack of equal matrices `expert_stride_*` apart, reads x + s * x_stride (0: one shared x) and
// writes y + s * y_stride.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace qf::kern {

enum class WeightKind { kBf16, kF32, kInt4, kInt8, kFp8 };

struct DeviceLinear {
  WeightKind kind = WeightKind::kBf16;
  int n = 0, k = 0;
  const void* w = nullptr;
  const __half* scales = nullptr;      // kInt4 / kInt8
  const uint8_t* zeros = nullptr;      // kInt4 / kInt8
  const float* block_scale = nullptr;  // kFp8
  int group = 128;                     // kInt4 / kInt8: columns per scale
  int block = 128;                     // kFp8: block edge
  // Distance between consecutive experts of a stack, in elements of each array; w's element is
  // the BF16 value, the F32 value, the 32-bit word (INT4/INT8) or the FP8 code byte.
  size_t w_stride = 0, scale_stride = 0, zero_stride = 0, block_scale_stride = 0;
};

struct GemvBatch {
  int n_slots = 1;
  const int* ids = nullptr;  // device, n_slots expert ids (nullptr: slot s uses expert s)
  size_t x_stride = 0;       // floats between slots' inputs (0: all slots read x)
  size_t y_stride = 0;       // floats between slots' outputs
};

// y = W x for every slot. Device pointers; stream-ordered, allocates nothing, graph-capturable.
cudaError_t gemv(const DeviceLinear& w, const float* x, float* y, const GemvBatch& batch,
                 cudaStream_t stream);

// Host twin on host copies of the same kernel-layout arrays (pointers in `w` are host pointers).
void gemv_ref(const DeviceLinear& w, const float* x, float* y, const GemvBatch& batch,
              const int* host_ids);

// Bytes of weights (codes, scales, zeros) one product of `w` reads: for bandwidth figures.
size_t weight_bytes(const DeviceLinear& w);

}  // namespace qf::kern
