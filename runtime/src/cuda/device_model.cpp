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

// One module in the kernel layout, on the host.
struct HostLinear {
  DeviceLinear shape;  // kind, n, k, group, block (pointers unset)
  std::vector<uint8_t> w;
  std::vector<uint16_t> scales;  // f16
  std::vector<uint8_t> zeros;
  std::vector<float> block_scale;
};

HostLinear repack(const StoredLinear& s) {
  HostLinear h;
  h.shape.n = static_cast<int>(s.n);
  h.shape.k = static_cast<int>(s.k);
  switch (s.kind) {
    case StoredLinear::Kind::kFloat: {
      const bool f32 = s.w->dtype == ckpt::DType::kF32, f16 = s.w->dtype == ckpt::DType::kF16;
      h.shape.kind = f32 || f16 ? WeightKind::kF32 : WeightKind::kBf16;
      const size_t elems = static_cast<size_t>(s.n * s.k);
      if (f16) {  // widened once: kernels read BF16 or F32
        h.w.resize(elems * 4);
        std::vector<float> row(static_cast<size_t>(s.k));
        for (int64_t r = 0; r < s.n; ++r) {
          s.row(r, row.data());
          std::memcpy(h.w.data() + r * s.k * 4, row.data(), row.size() * 4);
        }
      } else {
        h.w.resize(elems * (f32 ? 4 : 2));
        std::memcpy(h.w.data(), s.w->data, h.w.size());
      }
      return h;
    }
    case StoredLinear::Kind::kGptq: {
      h.shape.kind = s.bits == 4 ? WeightKind::kInt4 : WeightKind::kInt8;
      h.shape.group = static_cast<int>(s.group);
      const int per = 32 / s.bits;
      const int64_t words = s.k / per, groups = (s.k + s.group - 1) / s.group;
      h.w.resize(static_cast<size_t>(s.n * words) * 4);
      auto* w = reinterpret_cast<uint32_t*>(h.w.data());
      for (int64_t p = 0; p < words; ++p) {  // [K/per, N] -> [N, K/per]
        for (int64_t r = 0; r < s.n; ++r) w[r * words + p] = s.qweight[p * s.n + r];
      }
      h.scales.resize(static_cast<size_t>(s.n * groups));
      h.zeros.resize(static_cast<size_t>(s.n * groups));
      const uint32_t mask = (1u << s.bits) - 1;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t r = 0; r < s.n; ++r) {
          h.scales[r * groups + g] = s.scales[g * s.n + r];
          const uint32_t zw = s.qzeros[g * (s.n / per) + r / per];
          h.zeros[r * groups + g] = static_cast<uint8_t>(((zw >> (s.bits * (r % per))) & mask) + 1);
        }
      }
      return h;
    }
    case StoredLinear::Kind::kFp8: {
      h.shape.kind = WeightKind::kFp8;
      h.shape.block = static_cast<int>(s.bn);
      h.w.assign(s.codes, s.codes + s.n * s.k);
      const int64_t rows = s.scale_inv->rows, cols = s.scale_inv->cols;
      h.block_scale.resize(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r) s.scale_inv->row(r, h.block_scale.data() + r * cols);
      return h;
    }
  }
  return h;
}

// Rows of `parts` as one matrix, or false when they cannot share a launch (different kinds,
// groups, inner sizes, or FP8 parts that end inside a scale block).
bool concat_rows(const std::vector<HostLinear>& parts, HostLinear& out) {
  out = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const HostLinear& p = parts[i];
    const DeviceLinear& prev = parts[i - 1].shape;
    if (p.shape.kind != out.shape.kind || p.shape.k != out.shape.k ||
        p.shape.group != out.shape.group || p.shape.block != out.shape.block ||
        (out.shape.kind == WeightKind::kFp8 && prev.n % prev.block != 0)) {
      return false;
    }
    out.shape.n += p.shape.n;
    out.w.insert(out.w.end(), p.w.begin(), p.w.end());
    out.scales.insert(out.scales.end(), p.scales.begin(), p.scales.end());
    out.zeros.insert(out.zeros.end(), p.zeros.begin(), p.zeros.end());
    out.block_scale.insert(out.block_scale.end(), p.block_scale.begin(), p.block_scale.end());
  }
  return true;
}

// A stack of `count` matrices of one shape and format, filled slot by slot.
class StackWriter {
 public:
  StackWriter(DeviceModel& m, const HostLinear& first, size_t count, std::string what)
      : m_(m), what_(std::move(what)) {
    d_ = first.shape;
    d_.w_stride = first.w.size();
    d_.scale_stride = first.scales.size();
    d_.zero_stride = first.zeros.size();
    d_.block_scale_stride = first.block_scale.size();
    d_.w = m.alloc(d_.w_stride * count);
    if (d_.scale_stride)
      d_.scales = static_cast<const __half*>(m.alloc(d_.scale_stride * 2 * count));
    if (d_.zero_stride) d_.zeros = static_cast<const uint8_t*>(m.alloc(d_.zero_stride * count));
    if (d_.block_scale_stride) {
      d_.block_scale = static_cast<const float*>(m.alloc(d_.block_scale_stride * 4 * count));
    }
  }

  void put(size_t e, const HostLinear& h) {
    if (h.shape.kind != d_.kind || h.shape.n != d_.n || h.w.size() != d_.w_stride ||
        h.scales.size() != d_.scale_stride || h.shape.group != d_.group ||
        h.shape.block != d_.block) {
      throw Error(Errc::kUnsupported, what_ +
                                          ": experts stored in different formats (expert 0 and " +
                                          std::to_string(e) + "); the CUDA engine needs one");
    }
    copy(h.w, e * d_.w_stride, static_cast<uint8_t*>(const_cast<void*>(d_.w)));
    copy(h.scales, e * d_.scale_stride,
         reinterpret_cast<uint16_t*>(const_cast<__half*>(d_.scales)));
    copy(h.zeros, e * d_.zero_stride, const_cast<uint8_t*>(d_.zeros));
    copy(h.block_scale, e * d_.block_scale_stride, const_cast<float*>(d_.block_scale));
  }

  // Strides count elements of each array; w's element depends on the kind (gemv.h).
  DeviceLinear done() const {
    DeviceLinear d = d_;
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
  DeviceModel& m_;
  std::string what_;
  DeviceLinear d_;
};

std::vector<HostLinear> repack_all(const std::vector<const StoredLinear*>& mods) {
  std::vector<HostLinear> out;
  for (const StoredLinear* s : mods) {
    out.push_back(repack(*s));
    s->release();
  }
  return out;
}

// stack[e] lists the parts of matrix e (one e for a plain group). Fused when expert 0's parts
// concatenate; then every expert must.
RowGroup upload_group(DeviceModel& m, const std::vector<std::vector<const StoredLinear*>>& stack,
                      const std::string& what) {
  RowGroup g;
  std::vector<HostLinear> first = repack_all(stack[0]);
  int offset = 0;
  for (const HostLinear& h : first) {
    g.offsets.push_back(offset);
    offset += h.shape.n;
  }
  HostLinear merged;
  if (first.size() > 1 && concat_rows(first, merged)) {
    StackWriter w(m, merged, stack.size(), what);
    w.put(0, merged);
    for (size_t e = 1; e < stack.size(); ++e) {
      if (!concat_rows(repack_all(stack[e]), merged)) {
        throw Error(Errc::kUnsupported, what + ": expert " + std::to_string(e) +
                                            " is stored in another format than expert 0");
      }
      w.put(e, merged);
    }
    g.fused = w.done();
    for (const HostLinear& h : first) g.parts.push_back(h.shape);  // shapes only
    return g;
  }
  for (size_t j = 0; j < first.size(); ++j) {
    StackWriter w(m, first[j], stack.size(), what);
    w.put(0, first[j]);
    for (size_t e = 1; e < stack.size(); ++e) {
      HostLinear h = repack(*stack[e][j]);
      stack[e][j]->release();
      w.put(e, h);
    }
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

DeviceMoe upload_moe(DeviceModel& m, const MoeWeights& w, const std::string& where) {
  DeviceMoe d;
  d.router = upload_group(m, {{&w.router, &w.shared_expert_gate}}, where + "router");
  std::vector<std::vector<const StoredLinear*>> gate_up, down;
  for (size_t e = 0; e < w.gate.size(); ++e) {
    gate_up.push_back({&w.gate[e], &w.up[e]});
    down.push_back({&w.down[e]});
  }
  d.gate_up = upload_group(m, gate_up, where + "experts gate_proj/up_proj");
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

std::unique_ptr<DeviceModel> upload_model(const Model& model) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = std::make_unique<DeviceModel>();
  m->config = model.config();
  const ckpt::Qwen35Config& c = m->config;
  // Embedding rows as BF16 or F32 (the table stays as stored; only rows are read).
  {
    std::vector<float> row(static_cast<size_t>(c.hidden_size));
    std::vector<uint16_t> bf(static_cast<size_t>(c.vocab_size * c.hidden_size));
    std::vector<float> f32;
    bool exact_bf16 = true;
    for (int64_t r = 0; r < c.vocab_size && exact_bf16; ++r) {
      model.embed(static_cast<int32_t>(r), row.data());
      for (int64_t i = 0; i < c.hidden_size; ++i) {
        const uint16_t b = quant::f32_to_bf16(row[i]);
        exact_bf16 &= quant::bf16_to_f32(b) == row[i];
        bf[r * c.hidden_size + i] = b;
      }
    }
    if (exact_bf16) {
      auto* p = static_cast<uint16_t*>(m->alloc(bf.size() * 2));
      check(cudaMemcpy(p, bf.data(), bf.size() * 2, cudaMemcpyHostToDevice), "copying to the GPU");
      m->host_bytes_read += bf.size() * 2;
      m->embed = p;
    } else {
      f32.resize(bf.size());
      for (int64_t r = 0; r < c.vocab_size; ++r)
        model.embed(static_cast<int32_t>(r), f32.data() + r * c.hidden_size);
      m->embed = upload_vec(*m, f32);
      m->embed_kind = kern::FloatKind::kF32;
    }
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
    d.moe = upload_moe(*m, l.moe, where);
    m->layers.push_back(d);
  }
  m->final_norm = upload_vec(*m, model.final_norm());
  m->lm_head = upload_one(*m, model.lm_head(), "lm_head");
  m->load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return m;
}

}  // namespace qf::rt::cuda
