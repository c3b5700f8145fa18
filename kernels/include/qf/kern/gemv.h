// Matrix-vector products for batch-1 decode, one kernel per weight format, all reading the
// "kernel layouts" below (produced once at load from the checkpoint's layouts by repack_*).
// fp32 activations in and out, fp32 accumulation; each weight element is reconstructed exactly
// as qf/quant/formats.h defines it, so results equal the CPU reference (quant::StoredLinear)
// up to summation order. INT4 products run on integer tensor cores with exact integer sums; x
// enters them rounded to 31 bits relative to the largest |x| of its 128-column segment (exact
// for elements within 2^7 of it), see gemv_int4.cu.
//
// Kernel layouts (all row-major over the N output rows, so one row is one contiguous stream):
//   kBf16 / kF32  w: [N, K] as stored.
//   kInt4         w: N * K/8 u32 words (from qweight [K/8, N]). Row order: a row is K/128
//                 segments of 128 columns (16 words = four 16-byte quarters), then the K % 128
//                 tail in the GPTQ order (nibble j of word p = column 8p + j). In a segment,
//                 quarter q, word w (0..3), byte i, nibble h (0 low, 1 high) hold column
//                 32 (2 (w / 2) + h) + 16 (w % 2) + 4q + i: for the m16n8k32 mma, lane (g, q) of
//                 a warp loads quarter q of rows g and g + 8 and masks out A fragments of four
//                 codes (low nibbles: 32-column blocks 0 and 2; high nibbles, 16 x code: blocks 1
//                 and 3). int4_column() below is the map.
//                 Placement: when int4_tiled(K) (K % 128 == 0, K <= 10240), rows 16T .. 16T+15
//                 of each whole tile T < N / 16 occupy the same words as untiled rows would, as
//                 K/128 blocks of 1 KB: segment s's block holds quarter q of row 16T + g at
//                 16-byte slot 4g + q and of row 16T + 8 + g at 32 + 4g + q, so a warp reads one
//                 contiguous 1 KB per segment of 16 rows. Other rows (the last N % 16, or all
//                 when K is not tiled): row r at words r * K/8 ... int4_word_index() is the map.
//                 scales: [N, G] f16; zeros: [N, G] u8 holding the v1 zero point + 1 (<= 16);
//                 w = scale * (code - zero), G = ceil(K / group).
//   kInt8         w: [N, K/4] u32, byte j of word p = column 4p + j; scales, zeros as kInt4
//                 (zeros: any u8).
//   kFp8          w: [N, K] E4M3FN codes; block_scale: [ceil(N/block), ceil(K/block)] f32,
//                 w = e4m3(code) * block_scale[r / block][c / block].
// Experts: `n_slots` products in one launch. Slot s uses matrix ids[s] (nullptr: matrix s) of a
// stack of equal matrices `expert_stride_*` apart, reads x + (s / slots_per_x) * x_stride (0: one
// shared x) and writes y + s * y_stride.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace qf::kern {

enum class WeightKind { kBf16, kF32, kInt4, kInt8, kFp8 };

// kInt4 rows are tiled (layout above) when K is a multiple of 128 and at most this.
inline constexpr int kInt4TileMaxK = 10240;
__host__ __device__ constexpr bool int4_tiled(int k) {
  return k % 128 == 0 && k <= kInt4TileMaxK;
}

// Index in u32 words from the matrix start of word p (0 .. k/8 - 1, the row order below) of
// row r of a kInt4 matrix of n rows (layout above).
__host__ __device__ constexpr size_t int4_word_index(int n, int k, int r, int p) {
  const size_t row_words = static_cast<size_t>(k / 8);
  if (!int4_tiled(k) || r >= n / 16 * 16) return static_cast<size_t>(r) * row_words + p;
  const int rl = r % 16, s = p / 16, q = (p / 4) % 4, w = p % 4;
  return static_cast<size_t>(r / 16) * 16 * row_words + static_cast<size_t>(s) * 256 +
         static_cast<size_t>(32 * (rl / 8) + 4 * (rl % 8) + q) * 4 + w;
}

// Column of nibble j (bits 4j .. 4j + 3) of word p of a kInt4 row of k columns (layout above).
__host__ __device__ constexpr int int4_column(int k, int p, int j) {
  if (p >= k / 128 * 16) return 8 * p + j;  // the tail: GPTQ order
  const int w = p & 3, q = (p >> 2) & 3, i = j >> 1, h = j & 1;
  return (p >> 4) * 128 + 32 * (2 * (w >> 1) + h) + 16 * (w & 1) + 4 * q + i;
}

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
  // k_splits > 1 (where gemv_k_split_ok): K is cut into k_splits ranges of split_cols(k,
  // k_splits) columns (the last may be shorter) and part j of slot s writes the partial product
  // over its range to y + s * y_stride + j * split_stride; the caller adds the parts. More
  // blocks for a deep, narrow product (the out projection, [3072 x 8192]) at the cost of n extra
  // floats per part.
  int k_splits = 1;
  size_t split_stride = 0;
  // The ids were written two or more launches back on the stream (or by work joined to it
  // before the launch just before): the INT4 tensor-core kernel then reads them, through L2,
  // and issues its first weight loads before waiting for its predecessor (pdl.cuh, early loads
  // (b)). Other kernels wait first either way. Leave false when the launch just before writes
  // the ids (the router's top-k before the gate | up product).
  bool ids_early = false;
  // Slots that read one input: slot s reads x + (s / slots_per_x) * x_stride (two tokens' routed
  // experts in one launch: 8 slots on each token's x).
  int slots_per_x = 1;
};

// Columns of each k_splits range: whole 128-column segments.
__host__ __device__ constexpr int split_cols(int k, int k_splits) {
  return (k / 128 + k_splits - 1) / k_splits * 128;
}

// Whether gemv takes `batch.k_splits` for `w`: 1 always; more on the INT4 tensor-core path
// (K a multiple of 128, at most k / 128 parts, no SwiGLU epilogue).
bool gemv_k_split_ok(const DeviceLinear& w, const GemvBatch& batch);

// y = W x for every slot. Device pointers; stream-ordered, allocates nothing, graph-capturable.
cudaError_t gemv(const DeviceLinear& w, const float* x, float* y, const GemvBatch& batch,
                 cudaStream_t stream);

// Host twin on host copies of the same kernel-layout arrays (pointers in `w` are host pointers).
void gemv_ref(const DeviceLinear& w, const float* x, float* y, const GemvBatch& batch,
              const int* host_ids);

// Gate|up products with SwiGLU in the epilogue (one launch instead of gemv + swiglu): `w` holds
// 2 * n_h rows in the paired row order, tile T of 16 rows = gate rows 8T .. 8T + 7, then up rows
// 8T .. 8T + 7 (swiglu_pair_row() is the map), so the warp that owns a tile holds both sums of
// each pair. Writes h[s * y_stride + j] = silu(g_j) * u_j for j < n_h, silu(g) = g / (1 + e^-g)
// evaluated as swiglu (ops.h) does, from the same sums gemv would write: bit for bit gemv then
// swiglu on the paired rows. Only where gemv_swiglu_ok (kInt4, the tensor-core kernel, w.n a
// multiple of 16); cudaErrorNotSupported otherwise (the caller keeps gemv + swiglu).
inline constexpr int kSwigluPairRows = 8;
__host__ __device__ constexpr int swiglu_pair_row(int j, bool up) {  // pair j: its gate or up row
  return (j / kSwigluPairRows) * 2 * kSwigluPairRows + (up ? kSwigluPairRows : 0) +
         j % kSwigluPairRows;
}
// Whether a gate|up pair of n_h rows each, of this kind, inner size and group, can be paired at
// load (alignment is the loader's: 256-byte allocations).
bool gemv_swiglu_shape_ok(WeightKind kind, int n_h, int k, int group);
bool gemv_swiglu_ok(const DeviceLinear& w, const GemvBatch& batch);
cudaError_t gemv_swiglu(const DeviceLinear& w, const float* x, float* h, const GemvBatch& batch,
                        cudaStream_t stream);
void gemv_swiglu_ref(const DeviceLinear& w, const float* x, float* h, const GemvBatch& batch,
                     const int* host_ids);

// The MoE block's products with the shared expert as extra expert slots (one launch instead of
// the routed launch plus the shared expert's own): `experts` as gemv (swiglu: gemv_swiglu) of x
// into y, and in the same launch the FP8 shared product `shared.w` of shared.x into shared.y,
// its swiglu rows unpaired (gate rows 0 .. n/2 - 1, up rows n/2 ..: shared.y[j] = silu(gate_j) *
// up_j, n/2 values; else n). The routed slots' results are gemv's / gemv_swiglu's bit for bit;
// the shared rows apply each FP8 block scale to a 16-column chunk's sum (gemv rounds every
// scaled weight), so they are within gemv_test's bound of gemv_ref, not bit for bit gemv's.
// With shared.gate (down product) each shared output is multiplied by its sigmoid.
// Where gemv_moe_ok is false: cudaErrorNotSupported (the caller keeps separate launches).
struct SharedProduct {
  DeviceLinear w;            // kFp8, K % 16 == 0 and <= 3072, block a power of two >= 16
  const float* x = nullptr;  // 16-byte aligned
  float* y = nullptr;
  // Not swiglu: the shared expert's gate logit (device scalar, read after the PDL wait); each
  // output is then sigmoid(*gate) * sum, sigmoid(g) = 1 / (1 + e^-g) as moe_combine_norm forms
  // it (the gate folded into the epilogue; the combine then adds the output ungated).
  const float* gate = nullptr;
};
bool gemv_moe_ok(const DeviceLinear& experts, const GemvBatch& batch, bool swiglu,
                 const SharedProduct& shared);
cudaError_t gemv_moe(const DeviceLinear& experts, const float* x, float* y, const GemvBatch& batch,
                     bool swiglu, const SharedProduct& shared, cudaStream_t stream);
void gemv_moe_ref(const DeviceLinear& experts, const float* x, float* y, const GemvBatch& batch,
                  bool swiglu, const SharedProduct& shared, const int* host_ids);

// Turns n_mats kInt4 matrices (mat_words u32 words apart) written with untiled rows (every row
// as the layout's row order, row r at word r * k / 8) into the kernel layout, in place: their
// tiles of 16 rows when int4_tiled(k) (nothing to do otherwise). The loader's last step.
cudaError_t int4_tile(void* w, int n, int k, size_t n_mats, size_t mat_words, cudaStream_t stream);

// Bytes of weights (codes, scales, zeros) one product of `w` reads: for bandwidth figures.
size_t weight_bytes(const DeviceLinear& w);

}  // namespace qf::kern
