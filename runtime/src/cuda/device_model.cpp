#include "device_model.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "qf/ckpt/file_io.h"
#include "qf/error.h"
#include "qf/kern/cuda_check.h"
#include "qf/quant/formats.h"
#include "qf/rt/thread_pool.h"

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

constexpr size_t kChunkBytes = 32u << 20;  // weight bytes per staging buffer (Staging)

// Pinned host memory that every weight goes through on its way to the GPU: the host repacks a
// chunk into one buffer while the GPU copies the previous chunk out of the other
// (cudaMemcpyAsync on a stream of its own, an event per buffer), so the copies overlap the
// repacking and need no pageable bounce buffer. Host memory: two chunks.
class Staging {
 public:
  Staging() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a copy stream");
    for (cudaEvent_t& e : sent_) {
      check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating a copy event");
    }
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {  // also after an error: no copy may still read a buffer being freed
    cudaStreamSynchronize(stream_);
    for (int i = 0; i < 2; ++i) {
      cudaFreeHost(buf_[i]);
      cudaEventDestroy(sent_[i]);
    }
    cudaStreamDestroy(stream_);
  }

  // The other buffer, at least `bytes` long, once the copies out of it have finished.
  uint8_t* next(size_t bytes) {
    cur_ ^= 1;
    check(cudaEventSynchronize(sent_[cur_]), "copying weights to the GPU");
    if (cap_[cur_] < bytes) {
      check(cudaFreeHost(buf_[cur_]), "freeing pinned memory");
      buf_[cur_] = nullptr;
      cap_[cur_] = 0;
      void* p = nullptr;
      check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "allocating pinned host memory");
      buf_[cur_] = static_cast<uint8_t*>(p);
      cap_[cur_] = bytes;
    }
    return buf_[cur_];
  }
  // Copies out of the current buffer; sent() after the last of them.
  void copy(void* dst, const void* src, size_t bytes) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
          "copying weights to the GPU");
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t width, size_t height) {
    check(cudaMemcpy2DAsync(dst, dst_pitch, src, width, width, height, cudaMemcpyHostToDevice,
                            stream_),
          "copying weights to the GPU");
  }
  void sent() { check(cudaEventRecord(sent_[cur_], stream_), "copying weights to the GPU"); }
  cudaStream_t stream() const { return stream_; }
  // Every copy issued so far has landed, and every kernel queued behind them has run.
  void drain() {
    check(cudaStreamSynchronize(stream_), "copying weights to the GPU (or tiling them there)");
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t sent_[2] = {};
  uint8_t* buf_[2] = {};
  size_t cap_[2] = {};
  int cur_ = 1;
};

// An upload in progress: the model it fills, the staging its weights go through, the threads
// that repack them (started once: a 35B-A3B has thousands of expert matrices to repack) and the
// tensors read since the last drop_cache().
struct Upload {
  explicit Upload(DeviceModel& model) : m(model) {}
  DeviceModel& m;
  Staging staging;
  ThreadPool pool;
  std::vector<uint32_t> slice;  // a GPTQ qweight's columns read by pread (repack_rows)
  std::map<const ckpt::SafetensorsFile*, std::vector<std::pair<uint64_t, uint64_t>>> read;

  void note_read(const StoredLinear& s) {
    for (const ckpt::TensorRef* p : s.parts)
      read[p->file].emplace_back(p->info->begin, p->info->end);
  }
  // The tensors read since the last call leave the page cache (on a GB10 its pages would hold
  // the unified memory the weights need), in runs of tensors that lie side by side in the file
  // (gaps under 4 KiB closed): the page cache keeps large folios (up to 2 MiB) whole, so a
  // tensor smaller than one, or the folio it shares with its neighbour, would stay. Tensors
  // not read yet are left cached: dropping a layer's whole span of the file made a warm load
  // as slow as a cold one.
  void drop_cache() {
    for (auto& [file, ranges] : read) {
      std::sort(ranges.begin(), ranges.end());
      uint64_t lo = ranges[0].first, hi = ranges[0].second;
      for (const auto& [b, e] : ranges) {
        if (b > hi + 4096) {
          file->drop_cached(lo, hi - lo);
          lo = b;
        }
        hi = std::max(hi, e);
      }
      file->drop_cached(lo, hi - lo);
    }
    read.clear();
  }
};

// dst <- src on every thread (the source is a mapped file: its page faults go in parallel too).
void copy_parallel(ThreadPool& pool, uint8_t* dst, const uint8_t* src, size_t bytes) {
  pool.run(static_cast<int64_t>(bytes), int64_t{1} << 20, [&](int64_t a, int64_t b) {
    std::memcpy(dst + a, src + a, static_cast<size_t>(b - a));
  });
}

// Rows [r0, r1) of one module in the kernel layout, in a staging buffer.
struct HostRows {
  const uint8_t* w = nullptr;
  size_t w_bytes = 0;
  const uint16_t* scales = nullptr;  // f16, n_groups of them
  const uint8_t* zeros = nullptr;    // n_groups
  size_t n_groups = 0;
  const float* block_scale = nullptr;  // FP8: the block rows of [r0, r1) (r0 a block multiple)
  size_t n_block_scale = 0;
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

constexpr size_t align16(size_t bytes) {
  return (bytes + 15) / 16 * 16;
}

// Repacks straight into the next staging buffer (no host copy in between).
HostRows repack_rows(const StoredLinear& s, int64_t r0, int64_t r1, Upload& up) {
  Staging& st = up.staging;
  HostRows h;
  const int64_t n = r1 - r0;
  switch (s.kind) {
    case StoredLinear::Kind::kFloat: {
      const bool widen = s.w->dtype != ckpt::DType::kBF16 && s.w->dtype != ckpt::DType::kF32;
      const size_t row = static_cast<size_t>(s.k) * (s.w->dtype == ckpt::DType::kBF16 ? 2 : 4);
      h.w_bytes = static_cast<size_t>(n) * row;
      uint8_t* out = st.next(h.w_bytes);
      h.w = out;
      if (!widen) {
        copy_parallel(up.pool, out, static_cast<const uint8_t*>(s.w->data) + r0 * row, h.w_bytes);
      } else {  // F16: widened once, kernels read BF16 or F32
        for (int64_t r = r0; r < r1; ++r) {
          s.row(r, reinterpret_cast<float*>(out) + (r - r0) * s.k);
        }
      }
      return h;
    }
    case StoredLinear::Kind::kGptq: {
      const int per = 32 / s.bits;
      const int64_t words = s.k / per, groups = (s.k + s.group - 1) / s.group;
      h.w_bytes = static_cast<size_t>(n * words) * 4;
      h.n_groups = static_cast<size_t>(n * groups);
      const size_t scales_at = align16(h.w_bytes), zeros_at = scales_at + align16(h.n_groups * 2);
      uint8_t* out = st.next(zeros_at + h.n_groups);
      auto* w = reinterpret_cast<uint32_t*>(out);
      auto* scales = reinterpret_cast<uint16_t*>(out + scales_at);
      uint8_t* zeros = out + zeros_at;
      h.w = out;
      h.scales = scales;
      h.zeros = zeros;
      const uint32_t mask = (1u << s.bits) - 1;
      // A qweight larger than two chunks (the INT8 LM head: 728 MiB) is read by pread, one
      // slice of a K-row at a time: rows r0 .. r1 are a column slice of its [K/per, N], and
      // reading them through the mapping maps the whole tensor (the page cache keeps large
      // folios whole): a 4-layer 122B with its INT8 head peaked at 944 MB of RSS, 224 MB now.
      const uint32_t* src = s.qweight;
      int64_t stride = s.n, r_src = 0;         // word p of row r: src[p * stride + r - r_src]
      const ckpt::TensorRef& q = *s.parts[0];  // resolve_linear lists qweight first
      if (q.info->n_bytes() > 2 * kChunkBytes) {
        up.slice.resize(static_cast<size_t>(n * words));
        const uint64_t at = q.file->header().data_offset() + q.info->begin;
        QF_ASSERT(q.file->map().data() + at == reinterpret_cast<const std::byte*>(s.qweight),
                  "a GPTQ module's first part is its qweight");
        up.pool.run(words, 1, [&](int64_t a, int64_t b) {
          for (int64_t p = a; p < b; ++p) {
            ckpt::pread_all(q.file->map().fd(), up.slice.data() + p * n, static_cast<size_t>(n) * 4,
                            at + static_cast<uint64_t>(p * s.n + r0) * 4, q.file->path());
          }
        });
        src = up.slice.data();
        stride = n;
        r_src = r0;
      }
      // Row ranges in parallel: the transpose from [K/per, N] to [N, K/per] is the loader's
      // main host cost. INT4 rows are then permuted within each 128-column segment (gemv.h).
      const int64_t seg_words = s.bits == 4 ? s.k / 128 * 16 : 0;
      up.pool.run(n, 64, [&](int64_t a, int64_t b) {
        for (int64_t p = 0; p < words; ++p) {
          for (int64_t r = r0 + a; r < r0 + b; ++r) {
            w[(r - r0) * words + p] = p < seg_words ? int4_segment_word(src, stride, r - r_src, p)
                                                    : src[p * stride + r - r_src];
          }
        }
        for (int64_t g = 0; g < groups; ++g) {
          for (int64_t r = r0 + a; r < r0 + b; ++r) {
            scales[(r - r0) * groups + g] = s.scales[g * s.n + r];
            const uint32_t zw = s.qzeros[g * (s.n / per) + r / per];
            zeros[(r - r0) * groups + g] =
                static_cast<uint8_t>(((zw >> (s.bits * (r % per))) & mask) + 1);
          }
        }
      });
      return h;
    }
    case StoredLinear::Kind::kFp8: {
      h.w_bytes = static_cast<size_t>(n * s.k);
      const int64_t b0 = r0 / s.bn, b1 = (r1 + s.bn - 1) / s.bn, cols = s.scale_inv->cols;
      h.n_block_scale = static_cast<size_t>((b1 - b0) * cols);
      const size_t scale_at = align16(h.w_bytes);
      uint8_t* out = st.next(scale_at + h.n_block_scale * 4);
      copy_parallel(up.pool, out, s.codes + r0 * s.k, h.w_bytes);
      auto* bs = reinterpret_cast<float*>(out + scale_at);
      for (int64_t b = b0; b < b1; ++b) s.scale_inv->row(b, bs + (b - b0) * cols);
      h.w = out;
      h.block_scale = bs;
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

// A stack of `count` matrices (each the concatenation of `parts`' rows), filled part by part in
// row chunks so host memory stays bounded by two chunks whatever the module's size.
class StackWriter {
 public:
  // paired: two parts of equal rows (n % 8 == 0) written in gemv.h's paired row order.
  StackWriter(Upload& up, const std::vector<RowLayout>& parts, size_t count, std::string what,
              bool paired = false)
      : up_(up), parts_(parts), what_(std::move(what)), count_(count), paired_(paired) {
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
    DeviceModel& m = up.m;
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
      const HostRows h = repack_rows(s, r0, r1, up_);
      const size_t row = static_cast<size_t>(offsets_[j] + r0);
      copy_rows(h.w, h.w_bytes, e * d_.w_stride, l.w_row, j, r0,
                static_cast<uint8_t*>(const_cast<void*>(d_.w)));
      copy_rows(h.scales, h.n_groups, e * d_.scale_stride, l.groups, j, r0,
                reinterpret_cast<uint16_t*>(const_cast<__half*>(d_.scales)));
      copy_rows(h.zeros, h.n_groups, e * d_.zero_stride, l.groups, j, r0,
                const_cast<uint8_t*>(d_.zeros));
      copy(h.block_scale, h.n_block_scale,
           e * d_.block_scale_stride + row / d_.block * l.block_cols,
           const_cast<float*>(d_.block_scale));
      up_.staging.sent();
      s.release();  // unmap what this chunk touched
    }
    up_.note_read(s);
  }

  // Strides count elements of each array; w's element depends on the kind (gemv.h). INT4 rows,
  // written untiled, are tiled in place on the GPU (the kernel layout, gemv.h), on the copy
  // stream: after their rows land, while the host repacks the next module.
  DeviceLinear done() const {
    DeviceLinear d = d_;
    if (d.kind == WeightKind::kInt4) {
      check(kern::int4_tile(const_cast<void*>(d.w), d.n, d.k, count_, d.w_stride / 4,
                            up_.staging.stream()),
            "tiling INT4 weights");
    }
    if (d.kind == WeightKind::kBf16) d.w_stride /= 2;
    if (d.kind == WeightKind::kF32 || d.kind == WeightKind::kInt4 || d.kind == WeightKind::kInt8) {
      d.w_stride /= 4;
    }
    return d;
  }

 private:
  // n elements from the staging buffer to base + offset.
  template <class T>
  void copy(const T* v, size_t n, size_t offset, T* base) {
    if (n == 0) return;
    up_.staging.copy(base + offset, v, n * sizeof(T));
    up_.m.host_bytes_read += n * sizeof(T);
  }
  // Rows r0 .. of part j (row_elems elements each) into the matrix at mat_offset: at the part's
  // offset, or in runs of 8 rows to every other run of 8 (paired: tile r0 / 8 starts at row
  // 2 r0; r0 and the row count are multiples of 8).
  template <class T>
  void copy_rows(const T* v, size_t n, size_t mat_offset, size_t row_elems, size_t j, int64_t r0,
                 T* base) {
    if (!paired_) {
      copy(v, n, mat_offset + static_cast<size_t>(offsets_[j] + r0) * row_elems, base);
      return;
    }
    if (n == 0) return;
    const size_t run = kern::kSwigluPairRows * row_elems * sizeof(T);  // bytes of 8 rows
    T* dst =
        base + mat_offset + (2 * static_cast<size_t>(r0) + j * kern::kSwigluPairRows) * row_elems;
    up_.staging.copy_2d(dst, 2 * run, v, run, n * sizeof(T) / run);
    up_.m.host_bytes_read += n * sizeof(T);
  }
  Upload& up_;
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
RowGroup upload_group(Upload& up, const std::vector<std::vector<const StoredLinear*>>& stack,
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
    StackWriter w(up, parts, stack.size(), what, g.swiglu_pairs);
    for (size_t e = 0; e < stack.size(); ++e) {
      for (size_t j = 0; j < parts.size(); ++j) w.put(e, j, *stack[e][j]);
    }
    g.fused = w.done();
    for (const RowLayout& p : parts) g.parts.push_back(p.shape);  // shapes only
    return g;
  }
  for (size_t j = 0; j < parts.size(); ++j) {
    StackWriter w(up, {parts[j]}, stack.size(), what);
    for (size_t e = 0; e < stack.size(); ++e) w.put(e, 0, *stack[e][j]);
    g.parts.push_back(w.done());
  }
  return g;
}

DeviceLinear upload_one(Upload& up, const StoredLinear& s, const std::string& what) {
  return upload_group(up, {{&s}}, what).parts[0];
}

const float* upload_vec(DeviceModel& m, const std::vector<float>& v) {
  auto* p = static_cast<float*>(m.alloc(v.size() * 4));
  check(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "copying to the GPU");
  m.host_bytes_read += v.size() * 4;
  return p;
}

DeviceMoe upload_moe(Upload& up, const MoeWeights& w, const std::string& where, bool swiglu_pairs) {
  DeviceMoe d;
  d.router = upload_group(up, {{&w.router, &w.shared_expert_gate}}, where + "router");
  std::vector<std::vector<const StoredLinear*>> gate_up, down;
  for (size_t e = 0; e < w.gate.size(); ++e) {
    gate_up.push_back({&w.gate[e], &w.up[e]});
    down.push_back({&w.down[e]});
  }
  d.gate_up = upload_group(up, gate_up, where + "experts gate_proj/up_proj", swiglu_pairs);
  d.down = upload_group(up, down, where + "experts down_proj").parts[0];
  d.shared_gate_up = upload_group(up, {{&w.shared_gate, &w.shared_up}}, where + "shared expert");
  d.shared_down = upload_one(up, w.shared_down, where + "shared expert");
  return d;
}

DeviceLayer upload_layer(Upload& up, const LayerWeights& l, const std::string& where,
                         bool swiglu_pairs) {
  DeviceModel& m = up.m;
  DeviceLayer d;
  d.full_attention = l.full_attention;
  d.input_norm = upload_vec(m, l.input_norm);
  d.post_norm = upload_vec(m, l.post_norm);
  if (l.full_attention) {
    d.qkv = upload_group(up, {{&l.attn.q, &l.attn.k, &l.attn.v}}, where + "q/k/v_proj");
    d.o = upload_one(up, l.attn.o, where);
    d.q_norm = upload_vec(m, l.attn.q_norm);
    d.k_norm = upload_vec(m, l.attn.k_norm);
  } else {
    d.gdn_in = upload_group(up, {{&l.gdn.in_qkv, &l.gdn.in_z, &l.gdn.in_b, &l.gdn.in_a}},
                            where + "in_proj_qkv/z/b/a");
    d.out = upload_one(up, l.gdn.out, where);
    d.conv = upload_vec(m, l.gdn.conv);
    d.dt_bias = upload_vec(m, l.gdn.dt_bias);
    d.a_log = upload_vec(m, l.gdn.a_log);
    d.gdn_norm = upload_vec(m, l.gdn.norm);
  }
  d.moe = upload_moe(up, l.moe, where, swiglu_pairs);
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

std::unique_ptr<DeviceModel> upload_model(const Model& model, bool swiglu_pairs, bool mtp) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<DeviceModel>();
  m->config = model.config();
  const ckpt::Qwen35Config& c = m->config;
  Upload up(*m);
  // The embedding as stored (BF16 or F32; F16 widened), copied in row chunks.
  {
    const quant::MatrixView& e = model.embedding();
    const bool bf16 = e.dtype == ckpt::DType::kBF16, f32 = e.dtype == ckpt::DType::kF32;
    const size_t row = static_cast<size_t>(c.hidden_size) * (bf16 ? 2 : 4);
    auto* table = static_cast<uint8_t*>(m->alloc(row * static_cast<size_t>(c.vocab_size)));
    const int64_t rows = std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / row));
    for (int64_t r0 = 0; r0 < c.vocab_size; r0 += rows) {
      const int64_t r1 = std::min(c.vocab_size, r0 + rows);
      const size_t bytes = static_cast<size_t>(r1 - r0) * row;
      uint8_t* chunk = up.staging.next(bytes);
      if (bf16 || f32) {
        copy_parallel(up.pool, chunk, static_cast<const uint8_t*>(e.data) + r0 * row, bytes);
      } else {
        auto* f = reinterpret_cast<float*>(chunk);
        for (int64_t r = r0; r < r1; ++r) e.row(r, f + (r - r0) * c.hidden_size);
      }
      up.staging.copy(table + r0 * row, chunk, bytes);
      up.staging.sent();
      m->host_bytes_read += bytes;
      model.release_embedding();
    }
    model.release_embedding(true);  // its pages leave the page cache (Upload::drop_cache)
    m->embed = table;
    m->embed_kind = bf16 ? kern::FloatKind::kBf16 : kern::FloatKind::kF32;
  }
  for (size_t i = 0; i < model.layers().size(); ++i) {
    m->layers.push_back(
        upload_layer(up, model.layers()[i], "layer " + std::to_string(i) + " ", swiglu_pairs));
    up.drop_cache();
  }
  m->final_norm = upload_vec(*m, model.final_norm());
  m->lm_head = upload_one(up, model.lm_head(), "lm_head");
  up.drop_cache();
  if (const std::optional<MtpWeights>& t = model.mtp(); mtp && t) {
    DeviceMtp d;
    d.fc = upload_one(up, t->fc, "mtp.fc");
    d.pre_fc_norm_embedding = upload_vec(*m, t->pre_fc_norm_embedding);
    d.pre_fc_norm_hidden = upload_vec(*m, t->pre_fc_norm_hidden);
    d.norm = upload_vec(*m, t->norm);
    d.layer = upload_layer(up, t->layer, "mtp layer ", swiglu_pairs);
    m->mtp = d;
    up.drop_cache();
  }
  up.staging.drain();
  m->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

}  // namespace qf::rt::cuda
