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

template <class T>
void put(DeviceModel& m, const std::vector<T>& v, size_t offset_elems, T* base) {
  if (v.empty()) return;
  check(cudaMemcpy(base + offset_elems, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
        "copying weights to the GPU");
  m.host_bytes_read += v.size() * sizeof(T);
}

// `count` modules of one shape and format, stored `stride` apart (a stack of experts, or one).
DeviceLinear upload_stack(DeviceModel& m, const std::vector<const StoredLinear*>& mods,
                          const std::string& what) {
  DeviceLinear d;
  for (size_t e = 0; e < mods.size(); ++e) {
    HostLinear h = repack(*mods[e]);
    mods[e]->release();
    if (e == 0) {
      d = h.shape;
      d.w_stride = h.w.size();
      d.scale_stride = h.scales.size();
      d.zero_stride = h.zeros.size();
      d.block_scale_stride = h.block_scale.size();
      d.w = m.alloc(d.w_stride * mods.size());
      if (!h.scales.empty())
        d.scales = static_cast<const __half*>(m.alloc(d.scale_stride * 2 * mods.size()));
      if (!h.zeros.empty())
        d.zeros = static_cast<const uint8_t*>(m.alloc(d.zero_stride * mods.size()));
      if (!h.block_scale.empty()) {
        d.block_scale = static_cast<const float*>(m.alloc(d.block_scale_stride * 4 * mods.size()));
      }
    } else if (h.shape.kind != d.kind || h.w.size() != d.w_stride ||
               h.scales.size() != d.scale_stride || h.shape.group != d.group ||
               h.shape.block != d.block) {
      throw Error(Errc::kUnsupported, what +
                                          ": experts stored in different formats (expert 0 and " +
                                          std::to_string(e) + "); the CUDA engine needs one");
    }
    put(m, h.w, e * d.w_stride, static_cast<uint8_t*>(const_cast<void*>(d.w)));
    put(m, h.scales, e * d.scale_stride,
        reinterpret_cast<uint16_t*>(const_cast<__half*>(d.scales)));
    put(m, h.zeros, e * d.zero_stride, const_cast<uint8_t*>(d.zeros));
    put(m, h.block_scale, e * d.block_scale_stride, const_cast<float*>(d.block_scale));
  }
  // Strides count elements of each array: bytes for w (as the kernels index it by kind).
  switch (d.kind) {
    case WeightKind::kBf16:
      d.w_stride /= 2;
      break;
    case WeightKind::kF32:
    case WeightKind::kInt4:
    case WeightKind::kInt8:
      d.w_stride /= 4;
      break;
    case WeightKind::kFp8:
      break;
  }
  return d;
}

DeviceLinear upload_one(DeviceModel& m, const StoredLinear& s, const std::string& what) {
  return upload_stack(m, {&s}, what);
}

const float* upload_vec(DeviceModel& m, const std::vector<float>& v) {
  auto* p = static_cast<float*>(m.alloc(v.size() * 4));
  put(m, v, 0, p);
  return p;
}

DeviceMoe upload_moe(DeviceModel& m, const MoeWeights& w, const std::string& where) {
  DeviceMoe d;
  d.router = upload_one(m, w.router, where + "router");
  const auto ptrs = [](const std::vector<Linear>& v) {
    std::vector<const StoredLinear*> p;
    for (const Linear& l : v) p.push_back(&l);
    return p;
  };
  d.gate = upload_stack(m, ptrs(w.gate), where + "experts gate_proj");
  d.up = upload_stack(m, ptrs(w.up), where + "experts up_proj");
  d.down = upload_stack(m, ptrs(w.down), where + "experts down_proj");
  d.shared_gate = upload_one(m, w.shared_gate, where);
  d.shared_up = upload_one(m, w.shared_up, where);
  d.shared_down = upload_one(m, w.shared_down, where);
  d.shared_expert_gate = upload_one(m, w.shared_expert_gate, where);
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
      put(*m, bf, 0, p);
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
      d.q = upload_one(*m, l.attn.q, where);
      d.k = upload_one(*m, l.attn.k, where);
      d.v = upload_one(*m, l.attn.v, where);
      d.o = upload_one(*m, l.attn.o, where);
      d.q_norm = upload_vec(*m, l.attn.q_norm);
      d.k_norm = upload_vec(*m, l.attn.k_norm);
    } else {
      d.in_qkv = upload_one(*m, l.gdn.in_qkv, where);
      d.in_z = upload_one(*m, l.gdn.in_z, where);
      d.in_b = upload_one(*m, l.gdn.in_b, where);
      d.in_a = upload_one(*m, l.gdn.in_a, where);
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
