#include "device_model.h"

#include <chrono>
#include <cstring>

#include "qf/error.h"
#include "qf/kern/cuda_check.h"
#include "qf/quant/formats.h"

namespace qf::rt::cuda {
namespace {

using kern::DeviceLinear;
using kern::WeightKind;
using quant::StoredLinear;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(Errc::kIo, std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                               cudaGetErrorString(e) + ")");
  }
}

// Rows [r0, r1) of one module in the kernel layout, on the host.
struct HostRows {
  std::vector<uint8_t> w;
  std::vector<uint16_t> scales;  // f16
  std::vector<uint8_t> zeros;
  std::vector<float> block_scale;  // FP8: the block rows of [r0, r1) (r0 a multiple of the block)
};

// What a module looks like in the kernel layout: kind and sizes per row, without reading it.
struct RowLayout {
  DeviceLinear shape;     // kind, n, k, group, block (pointers unset)
  size_t w_row = 0;       // bytes of w per row
  size_t groups = 0;      // scales and zeros per row (INT4 / INT8)
  size_t block_cols = 0;  // FP8 block scales per block row
};

RowLayout layout_of(const StoredLinear& s) {
  RowLayout l;
  l.shape.n = static_cast<int>(s.n);
  l.shape.k = static_cast<int>(s.k);
  switch (s.kind) {
    case StoredLinear::Kind::kFloat: {
      const bool bf16 = s.w->dtype == ckpt::DType::kBF16;
      l.shape.kind = bf16 ? WeightKind::kBf16 : WeightKind::kF32;  // F16 is widened to F32
      l.w_row = static_cast<size_t>(s.k) * (bf16 ? 2 : 4);
      break;
    }
    case StoredLinear::Kind::kGptq:
      l.shape.kind = s.bits == 4 ? WeightKind::kInt4 : WeightKind::kInt8;
      l.shape.group = static_cast<int>(s.group);
      l.w_row = static_cast<size_t>(s.k / (32 / s.bits)) * 4;
      l.groups = static_cast<size_t>((s.k + s.group - 1) / s.group);
      break;
    case StoredLinear::Kind::kFp8:
      l.shape.kind = WeightKind::kFp8;
      l.shape.block = static_cast<int>(s.bn);
      l.w_row = static_cast<size_t>(s.k);
      l.block_cols = static_cast<size_t>(s.scale_inv->cols);
      break;
  }
  return l;
}

// Nibbles 0..3 of a 16-bit value at bits 0, 8, 16, 24.
uint32_t spread_nibbles(uint32_t x16) {
  x16 = (x16 | x16 << 8) & 0x00FF00FFu;
  return (x16 | x16 << 4) & 0x0F0F0F0Fu;
}

// Word p (inside the 128-column segments) of row r of the INT4 kernel layout from GPTQ qweight
// [K/8, N] (gemv.h): quarter q, word w of segment p / 16 holds, byte i, the columns
// 32 (2 (w / 2)) + 16 (w % 2) + 4q + i (low nibble) and 32 more (high nibble), i.e. half q % 2
// of GPTQ words A and A + 4 of the segment, A = 8 (w / 2) + 2 (w % 2) + q / 2.
uint32_t int4_segment_word(const uint32_t* qweight, int64_t n, int64_t r, int64_t p) {
  const int64_t w = p & 3, q = (p >> 2) & 3;
  const int64_t src = (p & ~int64_t{15}) + 8 * (w >> 1) + 2 * (w & 1) + (q >> 1);
  const int shift = 16 * static_cast<int>(q & 1);
  const uint32_t lo = (qweight[src * n + r] >> shift) & 0xFFFFu;
  const uint32_t hi = (qweight[(src + 4) * n + r] >> shift) & 0xFFFFu;
  return spread_nibbles(lo) | spread_nibbles(hi) << 4;
}

HostRows repack_rows(const StoredLinear& s, int64_t r0, int64_t r1) {
  HostRows h;
  const int64_t n = r1 - r0;
  switch (s.kind) {
    case StoredLinear::Kind::kFloat:
      if (s.w->dtype == ckpt::DType::kBF16 || s.w->dtype == ckpt::DType::kF32) {
        const size_t row = static_cast<size_t>(s.k) * (s.w->dtype == ckpt::DType::kF32 ? 4 : 2);
        const auto* base = static_cast<const uint8_t*>(s.w->data);
        h.w.assign(base + r0 * row, base + r1 * row);
      } else {  // F16: widened once, kernels read BF16 or F32
        h.w.resize(static_cast<size_t>(n * s.k) * 4);
        for (int64_t r = r0; r < r1; ++r) {
          s.row(r, reinterpret_cast<float*>(h.w.data()) + (r - r0) * s.k);
        }
      }
      return h;
    case StoredLinear::Kind::kGptq: {
      const int per = 32 / s.bits;
      const int64_t words = s.k / per, groups = (s.k + s.group - 1) / s.group;
      h.w.resize(static_cast<size_t>(n * words) * 4);
      h.scales.resize(static_cast<size_t>(n * groups));
      h.zeros.resize(static_cast<size_t>(n * groups));
      auto* w = reinterpret_cast<uint32_t*>(h.w.data());
      const uint32_t mask = (1u << s.bits) - 1;
      // Row ranges in parallel: the transpose from [K/per, N] to [N, K/per] is the loader's
      // main host cost. INT4 rows are then permuted within each 128-column segment (gemv.h).
      const int64_t seg_words = s.bits == 4 ? s.k / 128 * 16 : 0;
      quant::parallel_for(n, 0, 64, [&](int64_t a, int64_t b) {
        for (int64_t p = 0; p < words; ++p) {
          for (int64_t r = r0 + a; r < r0 + b; ++r) {
            w[(r - r0) * words + p] =
                p < seg_words ? int4_segment_word(s.qweight, s.n, r, p) : s.qweight[p * s.n + r];
          }
        }
        for (int64_t g = 0; g < groups; ++g) {
          for (int64_t r = r0 + a; r < r0 + b; ++r) {
            h.scales[(r - r0) * groups + g] = s.scales[g * s.n + r];
            const uint32_t zw = s.qzeros[g * (s.n / per) + r / per];
            h.zeros[(r - r0) * groups + g] =
                static_cast<uint8_t>(((zw >> (s.bits * (r % per))) & mask) + 1);
          }
        }
      });
      return h;
    }
    case StoredLinear::Kind::kFp8: {
      h.w.assign(s.codes + r0 * s.k, s.codes + r1 * s.k);
      const int64_t b0 = r0 / s.bn, b1 = (r1 + s.bn - 1) / s.bn, cols = s.scale_inv->cols;
      h.block_scale.resize(static_cast<size_t>((b1 - b0) * cols));
      for (int64_t b = b0; b < b1; ++b) s.scale_inv->row(b, h.block_scale.data() + (b - b0) * cols);
      return h;
    }
  }
  return h;
}

// Whether parts can share one launch over their concatenated rows: one kind, inner size, group
// and block, and FP8 parts that end on a scale-block boundary.
bool can_concat(const std::vector<RowLayout>& parts) {
  for (size_t i = 1; i < parts.size(); ++i) {
    const DeviceLinear &a = parts[0].shape, &b = parts[i].shape, &prev = parts[i - 1].shape;
    if (b.kind != a.kind || b.k != a.k || b.group != a.group || b.block != a.block ||
        (a.kind == WeightKind::kFp8 && prev.n % prev.block != 0)) {
      return false;
    }
  }
  return true;
}

constexpr size_t kChunkBytes = 32u << 20;  // host staging per copy: bounds the loader's memory

// A stack of `count` matrices (each the concatenation of `parts`' rows), filled part by part in
// row chunks so host memory stays bounded by kChunkBytes whatever the module's size.
class StackWriter {
 public:
  // paired: two parts of equal rows (n % 8 == 0) written in gemv.h's paired row order.
  StackWriter(DeviceModel& m, const std::vector<RowLayout>& parts, size_t count, std::string what,
              bool paired = false)
      : m_(m), parts_(parts), what_(std::move(what)), count_(count), paired_(paired) {
    d_ = parts[0].shape;
    d_.n = 0;
    for (const RowLayout& p : parts) {
      offsets_.push_back(d_.n);
      d_.n += p.shape.n;
    }
    const RowLayout& l = parts[0];
    d_.w_stride = l.w_row * static_cast<size_t>(d_.n);
    d_.scale_stride = d_.zero_stride = l.groups * static_cast<size_t>(d_.n);
    d_.block_scale_stride =
        l.block_cols ? l.block_cols * static_cast<size_t>((d_.n + d_.block - 1) / d_.block) : 0;
    d_.w = m.alloc(d_.w_stride * count);
    if (d_.scale_stride) {
      d_.scales = static_cast<const __half*>(m.alloc(d_.scale_stride * 2 * count));
      d_.zeros = static_cast<const uint8_t*>(m.alloc(d_.zero_stride * count));
    }
    if (d_.block_scale_stride) {
      d_.block_scale = static_cast<const float*>(m.alloc(d_.block_scale_stride * 4 * count));
    }
  }

  // Part j of matrix e.
  void put(size_t e, size_t j, const StoredLinear& s) {
    const RowLayout l = layout_of(s);
    const RowLayout& want = parts_[j];
    if (l.shape.kind != want.shape.kind || l.shape.n != want.shape.n || l.w_row != want.w_row ||
        l.groups != want.groups || l.shape.block != want.shape.block) {
      throw Error(Errc::kUnsupported, what_ +
                                          ": experts stored in different formats (expert 0 and " +
                                          std::to_string(e) + "); the CUDA engine needs one");
    }
    int64_t rows =
        std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / std::max<size_t>(1, l.w_row)));
    if (l.shape.kind == WeightKind::kFp8)
      rows = std::max<int64_t>(1, rows / l.shape.block) * l.shape.block;
    if (paired_) rows = std::max<int64_t>(1, rows / kern::kSwigluPairRows) * kern::kSwigluPairRows;
    for (int64_t r0 = 0; r0 < s.n; r0 += rows) {
      const int64_t r1 = std::min(s.n, r0 + rows);
      const HostRows h = repack_rows(s, r0, r1);
      const size_t row = static_cast<size_t>(offsets_[j] + r0);
      copy_rows(h.w, e * d_.w_stride, l.w_row, j, r0,
                static_cast<uint8_t*>(const_cast<void*>(d_.w)));
      copy_rows(h.scales, e * d_.scale_stride, l.groups, j, r0,
                reinterpret_cast<uint16_t*>(const_cast<__half*>(d_.scales)));
      copy_rows(h.zeros, e * d_.zero_stride, l.groups, j, r0, const_cast<uint8_t*>(d_.zeros));
      if (!h.block_scale.empty()) {
        copy(h.block_scale, e * d_.block_scale_stride + row / d_.block * l.block_cols,
             const_cast<float*>(d_.block_scale));
      }
      s.release();  // unmap what this chunk touched: resident memory stays at one chunk
    }
  }

  // Strides count elements of each array; w's element depends on the kind (gemv.h). INT4 rows,
  // written untiled, are tiled in place on the GPU (the kernel layout, gemv.h).
  DeviceLinear done() const {
    DeviceLinear d = d_;
    if (d.kind == WeightKind::kInt4) {
      check(kern::int4_tile(const_cast<void*>(d.w), d.n, d.k, count_, d.w_stride / 4, nullptr),
            "tiling INT4 weights");
      check(cudaDeviceSynchronize(), "tiling INT4 weights");
    }
    if (d.kind == WeightKind::kBf16) d.w_stride /= 2;
    if (d.kind == WeightKind::kF32 || d.kind == WeightKind::kInt4 || d.kind == WeightKind::kInt8) {
      d.w_stride /= 4;
    }
    return d;
  }

 private:
  template <class T>
  void copy(const std::vector<T>& v, size_t offset, T* base) {
    if (v.empty()) return;
    check(cudaMemcpy(base + offset, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
          "copying weights to the GPU");
    m_.host_bytes_read += v.size() * sizeof(T);
  }
  // Rows r0 .. of part j (row_elems elements each) into the matrix at mat_offset: at the part's
  // offset, or in runs of 8 rows to every other run of 8 (paired: tile r0 / 8 starts at row
  // 2 r0; r0 and the row count are multiples of 8).
  template <class T>
  void copy_rows(const std::vector<T>& v, size_t mat_offset, size_t row_elems, size_t j, int64_t r0,
                 T* base) {
    if (!paired_) {
      copy(v, mat_offset + static_cast<size_t>(offsets_[j] + r0) * row_elems, base);
      return;
    }
    if (v.empty()) return;
    const size_t run = kern::kSwigluPairRows * row_elems * sizeof(T);  // bytes of 8 rows
    T* dst =
        base + mat_offset + (2 * static_cast<size_t>(r0) + j * kern::kSwigluPairRows) * row_elems;
    check(cudaMemcpy2D(dst, 2 * run, v.data(), run, run, v.size() * sizeof(T) / run,
                       cudaMemcpyHostToDevice),
          "copying weights to the GPU");
    m_.host_bytes_read += v.size() * sizeof(T);
  }
  DeviceModel& m_;
  std::vector<RowLayout> parts_;
  std::string what_;
  DeviceLinear d_;
  std::vector<int> offsets_;
  size_t count_;
  bool paired_;
};

// stack[e] lists the parts of matrix e (one e for a plain group). Fused when the parts can be
// concatenated; otherwise each part becomes its own stack.
// swiglu_pairs: a gate | up pair goes in the paired row order where gemv_swiglu takes it.
RowGroup upload_group(DeviceModel& m, const std::vector<std::vector<const StoredLinear*>>& stack,
                      const std::string& what, bool swiglu_pairs = false) {
  RowGroup g;
  std::vector<RowLayout> parts;
  int offset = 0;
  for (const StoredLinear* s : stack[0]) {
    parts.push_back(layout_of(*s));
    g.offsets.push_back(offset);
    offset += parts.back().shape.n;
  }
  if (parts.size() > 1 && can_concat(parts)) {
    const DeviceLinear& p0 = parts[0].shape;
    g.swiglu_pairs = swiglu_pairs && parts.size() == 2 && parts[1].shape.n == p0.n &&
                     kern::gemv_swiglu_shape_ok(p0.kind, p0.n, p0.k, p0.group);
    StackWriter w(m, parts, stack.size(), what, g.swiglu_pairs);
    for (size_t e = 0; e < stack.size(); ++e) {
      for (size_t j = 0; j < parts.size(); ++j) w.put(e, j, *stack[e][j]);
    }
    g.fused = w.done();
    for (const RowLayout& p : parts) g.parts.push_back(p.shape);  // shapes only
    return g;
  }
  for (size_t j = 0; j < parts.size(); ++j) {
    StackWriter w(m, {parts[j]}, stack.size(), what);
    for (size_t e = 0; e < stack.size(); ++e) w.put(e, 0, *stack[e][j]);
    g.parts.push_back(w.done());
  }
  return g;
}

DeviceLinear upload_one(DeviceModel& m, const StoredLinear& s, const std::string& what) {
  return upload_group(m, {{&s}}, what).parts[0];
}

const float* upload_vec(DeviceModel& m, const std::vector<float>& v) {
  auto* p = static_cast<float*>(m.alloc(v.size() * 4));
  check(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "copying to the GPU");
  m.host_bytes_read += v.size() * 4;
  return p;
}

DeviceMoe upload_moe(DeviceModel& m, const MoeWeights& w, const std::string& where,
                     bool swiglu_pairs) {
  DeviceMoe d;
  d.router = upload_group(m, {{&w.router, &w.shared_expert_gate}}, where + "router");
  std::vector<std::vector<const StoredLinear*>> gate_up, down;
  for (size_t e = 0; e < w.gate.size(); ++e) {
    gate_up.push_back({&w.gate[e], &w.up[e]});
    down.push_back({&w.down[e]});
  }
  d.gate_up = upload_group(m, gate_up, where + "experts gate_proj/up_proj", swiglu_pairs);
  d.down = upload_group(m, down, where + "experts down_proj").parts[0];
  d.shared_gate_up = upload_group(m, {{&w.shared_gate, &w.shared_up}}, where + "shared expert");
  d.shared_down = upload_one(m, w.shared_down, where + "shared expert");
  return d;
}

}  // namespace

void* DeviceModel::alloc(size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, rounded);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear the error
    throw Error(Errc::kIo, "the GPU is out of memory: " + std::to_string(rounded) +
                               " more bytes needed after " + std::to_string(device_bytes) + " (" +
                               cudaGetErrorString(e) + ")");
  }
  arena.emplace_back();
  arena.back() = kern::DeviceBuffer<uint8_t>::adopt(static_cast<uint8_t*>(p), rounded);
  device_bytes += rounded;
  return p;
}

std::unique_ptr<DeviceModel> upload_model(const Model& model, bool swiglu_pairs) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<DeviceModel>();
  m->config = model.config();
  const ckpt::Qwen35Config& c = m->config;
  // The embedding as stored (BF16 or F32; F16 widened), copied in row chunks.
  {
    const quant::MatrixView& e = model.embedding();
    const bool bf16 = e.dtype == ckpt::DType::kBF16, f32 = e.dtype == ckpt::DType::kF32;
    const size_t row = static_cast<size_t>(c.hidden_size) * (bf16 ? 2 : 4);
    auto* table = static_cast<uint8_t*>(m->alloc(row * static_cast<size_t>(c.vocab_size)));
    const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / row));
    std::vector<float> chunk;
    for (int64_t r0 = 0; r0 < c.vocab_size; r0 += rows) {
      const int64_t r1 = std::min(c.vocab_size, r0 + rows);
      const void* src = static_cast<const uint8_t*>(e.data) + r0 * row;
      if (!bf16 && !f32) {
        chunk.resize(static_cast<size_t>((r1 - r0) * c.hidden_size));
        for (int64_t r = r0; r < r1; ++r) e.row(r, chunk.data() + (r - r0) * c.hidden_size);
        src = chunk.data();
      }
      check(cudaMemcpy(table + r0 * row, src, (r1 - r0) * row, cudaMemcpyHostToDevice),
            "copying the embedding to the GPU");
      m->host_bytes_read += (r1 - r0) * row;
      model.release_embedding();
    }
    m->embed = table;
    m->embed_kind = bf16 ? kern::FloatKind::kBf16 : kern::FloatKind::kF32;
  }
  for (size_t i = 0; i < model.layers().size(); ++i) {
    const LayerWeights& l = model.layers()[i];
    const std::string where = "layer " + std::to_string(i) + " ";
    DeviceLayer d;
    d.full_attention = l.full_attention;
    d.input_norm = upload_vec(*m, l.input_norm);
    d.post_norm = upload_vec(*m, l.post_norm);
    if (l.full_attention) {
      d.qkv = upload_group(*m, {{&l.attn.q, &l.attn.k, &l.attn.v}}, where + "q/k/v_proj");
      d.o = upload_one(*m, l.attn.o, where);
      d.q_norm = upload_vec(*m, l.attn.q_norm);
      d.k_norm = upload_vec(*m, l.attn.k_norm);
    } else {
      d.gdn_in = upload_group(*m, {{&l.gdn.in_qkv, &l.gdn.in_z, &l.gdn.in_b, &l.gdn.in_a}},
                              where + "in_proj_qkv/z/b/a");
      d.out = upload_one(*m, l.gdn.out, where);
      d.conv = upload_vec(*m, l.gdn.conv);
      d.dt_bias = upload_vec(*m, l.gdn.dt_bias);
      d.a_log = upload_vec(*m, l.gdn.a_log);
      d.gdn_norm = upload_vec(*m, l.gdn.norm);
    }
    d.moe = upload_moe(*m, l.moe, where, swiglu_pairs);
    m->layers.push_back(d);
  }
  m->final_norm = upload_vec(*m, model.final_norm());
  m->lm_head = upload_one(*m, model.lm_head(), "lm_head");
  m->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

}  // namespace qf::rt::cuda
