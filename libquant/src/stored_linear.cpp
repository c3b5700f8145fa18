#include "qf/quant/stored_linear.h"

#include <algorithm>
#include <array>

#include "qf/error.h"
#include "qf/quant/formats.h"

namespace qf::quant {
namespace {

template <class T>
const T* typed(const ckpt::TensorRef& r) {
  return r.file->view(*r.info).as<T>().data();
}

const ckpt::TensorRef& need(const ckpt::Checkpoint& c, const std::string& name) {
  const ckpt::TensorRef* r = c.find(name);
  if (!r) throw Error(Errc::kTensorNotFound, "the checkpoint has no tensor '" + name + "'");
  return *r;
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> v{};
    for (int i = 0; i < 256; ++i)
      v[static_cast<size_t>(i)] = e4m3fn_to_f32(static_cast<uint8_t>(i));
    return v;
  }();
  return t;
}

int64_t json_int(const nlohmann::json& o, const char* key, int64_t fallback,
                 const std::string& where) {
  if (!o.is_object() || !o.contains(key)) return fallback;
  if (!o[key].is_number_integer()) {
    throw Error(Errc::kConfigInvalid, where + "." + key + " must be an integer");
  }
  return o[key].get<int64_t>();
}

int64_t block_edge(const nlohmann::json& o, const std::string& where, int64_t fallback) {
  if (!o.is_object() || !o.contains("weight_block_size")) return fallback;
  const nlohmann::json& b = o["weight_block_size"];
  if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || b[0] != b[1] ||
      b[0].get<int64_t>() <= 0) {
    throw Error(Errc::kConfigInvalid,
                where + ".weight_block_size must be two equal positive integers");
  }
  return b[0].get<int64_t>();
}

}  // namespace

CheckpointLayout checkpoint_layout(const nlohmann::json& config, const std::string& source) {
  CheckpointLayout l;
  const nlohmann::json qcfg =
      config.is_object() ? config.value("quantization_config", nlohmann::json()) : nlohmann::json();
  check_quantization_config(qcfg, source + ": quantization_config");
  if (is_inc_config(qcfg)) {
    l.inc.emplace(qcfg);
    const std::string packing = qcfg.value("packing_format", "auto_round:auto_gptq");
    if (packing != "auto_round:auto_gptq") {
      throw Error(Errc::kUnsupported, source + ": packing_format \"" + packing +
                                          "\" (only auto_round:auto_gptq, GPTQ v1 zeros, is read)");
    }
  }
  l.group = json_int(qcfg, "group_size", l.group, source + ": quantization_config");
  l.block = block_edge(qcfg, source + ": quantization_config", l.block);
  if (config.contains("qforge") && config["qforge"].is_object()) {
    const nlohmann::json hybrid = config["qforge"].value("hybrid", nlohmann::json());
    if (!hybrid.is_null() && !hybrid.is_object()) {
      throw Error(Errc::kConfigInvalid, source + ": qforge.hybrid must be an object");
    }
    l.block = block_edge(hybrid, source + ": qforge.hybrid", l.block);
  }
  return l;
}

StoredLinear StoredLinear::float_view(const void* data, ckpt::DType dtype, int64_t n, int64_t k) {
  StoredLinear s;
  s.n = n;
  s.k = k;
  s.w.emplace(data, dtype, n, k);
  return s;
}

std::string StoredLinear::format() const {
  switch (kind) {
    case Kind::kFloat:
      return w->dtype == ckpt::DType::kF32 ? "f32" : w->dtype == ckpt::DType::kF16 ? "f16" : "bf16";
    case Kind::kGptq:
      return bits == 4 ? "int4" : "int8";
    case Kind::kFp8:
      return "fp8";
  }
  return "";
}

void StoredLinear::row(int64_t r, float* out) const {
  switch (kind) {
    case Kind::kFloat:
      w->row(r, out);
      return;
    case Kind::kGptq: {
      const int per = 32 / bits;
      const uint32_t mask = (1u << bits) - 1;
      for (int64_t g0 = 0, g = 0; g0 < k; g0 += group, ++g) {
        const uint32_t zw = qzeros[g * (n / per) + r / per];
        const int32_t zero = static_cast<int32_t>((zw >> (bits * (r % per))) & mask) + 1;  // v1
        const float scale = f16_to_f32(scales[g * n + r]);
        for (int64_t c = g0; c < std::min(k, g0 + group); ++c) {
          const uint32_t code = (qweight[(c / per) * n + r] >> (bits * (c % per))) & mask;
          out[c] = scale * static_cast<float>(static_cast<int32_t>(code) - zero);
        }
      }
      return;
    }
    case Kind::kFp8: {
      const std::array<float, 256>& t = e4m3_table();
      for (int64_t c0 = 0; c0 < k; c0 += bk) {
        const float s = scale_inv->at(r / bn, c0 / bk);
        for (int64_t c = c0; c < std::min(k, c0 + bk); ++c) out[c] = t[codes[r * k + c]] * s;
      }
      return;
    }
  }
}

void StoredLinear::matvec_rows(const float* x, float* y, int64_t r0, int64_t r1) const {
  if (kind == Kind::kGptq) {
    // qweight is [k / per, n]: a packed row holds `per` codes of the rows r0..r1 side by side, so
    // the loops over i are contiguous and vectorize. Per group, y += scale * (sum code * x -
    // zero * sum x).
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    const int64_t m = r1 - r0;
    std::vector<float> scale(static_cast<size_t>(m)), zero(static_cast<size_t>(m)),
        acc(static_cast<size_t>(m));
    std::fill(y, y + m, 0.0f);
    for (int64_t g0 = 0, g = 0; g0 < k; g0 += group, ++g) {
      for (int64_t i = 0; i < m; ++i) {
        const int64_t r = r0 + i;
        const uint32_t zw = qzeros[g * (n / per) + r / per];
        zero[i] = static_cast<float>(((zw >> (bits * (r % per))) & mask) + 1);
        scale[i] = f16_to_f32(scales[g * n + r]);
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float xsum = 0.0f;
      const int64_t g1 = std::min(k, g0 + group);
      for (int64_t p = g0 / per; p * per < g1; ++p) {
        const uint32_t* words = qweight + p * n + r0;
        for (int j = 0; j < per; ++j) {
          const float xj = x[p * per + j];
          const int shift = bits * j;
          xsum += xj;
          for (int64_t i = 0; i < m; ++i) {
            acc[static_cast<size_t>(i)] += static_cast<float>((words[i] >> shift) & mask) * xj;
          }
        }
      }
      for (int64_t i = 0; i < m; ++i) y[i] += scale[i] * (acc[i] - zero[i] * xsum);
    }
    return;
  }
  std::vector<float> wrow(static_cast<size_t>(k));
  for (int64_t r = r0; r < r1; ++r) {
    row(r, wrow.data());
    float acc[8] = {};
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
      for (int j = 0; j < 8; ++j) acc[j] += wrow[c + j] * x[c + j];
    }
    for (; c < k; ++c) acc[0] += wrow[c] * x[c];
    y[r - r0] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  }
}

void StoredLinear::release() const {
  for (const ckpt::TensorRef* p : parts) p->file->release(p->info->begin, p->info->n_bytes());
}

StoredLinear resolve_linear(const ckpt::Checkpoint& c, const LinearLayout& layout,
                            const std::string& m, int64_t n, int64_t k) {
  StoredLinear s;
  s.n = n;
  s.k = k;
  if (const ckpt::TensorRef* qw = c.find(m + ".qweight")) {
    s.kind = StoredLinear::Kind::kGptq;
    s.bits = qw->info->shape[0] * 8 == static_cast<uint64_t>(k) ? 4 : 8;
    s.group = layout.inc ? layout.inc->group_size(m) : layout.group;
    if (s.group <= 0) s.group = k;
    const ckpt::TensorRef& qz = need(c, m + ".qzeros");
    const ckpt::TensorRef& sc = need(c, m + ".scales");
    s.qweight = typed<uint32_t>(*qw);
    s.qzeros = typed<uint32_t>(qz);
    s.scales = typed<uint16_t>(sc);
    s.parts = {qw, &qz, &sc};
    return s;
  }
  const ckpt::TensorRef& w = need(c, m + ".weight");
  if (w.info->dtype == ckpt::DType::kF8E4M3) {
    const ckpt::TensorRef& si = need(c, m + ".weight_scale_inv");
    s.kind = StoredLinear::Kind::kFp8;
    s.codes = typed<uint8_t>(w);
    const auto sv = si.file->view(*si.info);
    s.scale_inv.emplace(sv.bytes.data(), si.info->dtype, static_cast<int64_t>(si.info->shape[0]),
                        static_cast<int64_t>(si.info->shape[1]));
    s.bn = s.bk = layout.block;
    s.parts = {&w, &si};
    return s;
  }
  s.w.emplace(w.file->view(*w.info).bytes.data(), w.info->dtype, n, k);
  s.parts = {&w};
  return s;
}

}  // namespace qf::quant
