#include "qf/ckpt/summary.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace qf::ckpt {
namespace {

struct Member {
  std::string_view leaf;
  const TensorInfo* t;
};

bool is_fp8(DType d) {
  return d == DType::kF8E4M3 || d == DType::kF8E5M2 || d == DType::kF8E4M3Fnuz ||
         d == DType::kF8E5M2Fnuz;
}

std::string lower_dtype(DType d) {
  std::string s(dtype_name(d));
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

// GPTQ packing: scales [K/G, N], qzeros [K/G, N*bits/32]. Returns 0 when it does not add up.
int gptq_bits(const TensorInfo& qzeros, const TensorInfo& scales) {
  if (qzeros.shape.size() != 2 || scales.shape.size() != 2 || scales.shape[1] == 0) return 0;
  const uint64_t n = scales.shape[1];
  const uint64_t packed = qzeros.shape[1] * 32;
  if (packed % n != 0) return 0;
  const uint64_t bits = packed / n;
  return bits == 2 || bits == 3 || bits == 4 || bits == 8 ? static_cast<int>(bits) : 0;
}

class Tally {
 public:
  void add_module(const std::string& family, const std::string& members,
                  std::initializer_list<const TensorInfo*> ts) {
    FormatStat& s = stat(family, members);
    ++s.n_modules;
    for (const TensorInfo* t : ts) {
      ++s.n_tensors;
      s.bytes += t->n_bytes();
    }
  }
  std::vector<FormatStat> take() {
    std::vector<FormatStat> out;
    for (auto& [key, s] : stats_) out.push_back(std::move(s));
    std::sort(out.begin(), out.end(), [](const FormatStat& a, const FormatStat& b) {
      return a.bytes != b.bytes ? a.bytes > b.bytes : a.family < b.family;
    });
    return out;
  }

 private:
  FormatStat& stat(const std::string& family, const std::string& members) {
    FormatStat& s = stats_[family];
    s.family = family;
    s.members = members;
    return s;
  }
  std::map<std::string, FormatStat> stats_;
};

void classify_module(const std::vector<Member>& members, Tally& tally) {
  auto get = [&](std::string_view leaf) -> const TensorInfo* {
    for (const Member& m : members) {
      if (m.leaf == leaf) return m.t;
    }
    return nullptr;
  };
  std::vector<const TensorInfo*> used;
  const TensorInfo* qweight = get("qweight");
  const TensorInfo* qzeros = get("qzeros");
  const TensorInfo* scales = get("scales");
  const TensorInfo* weight = get("weight");
  const TensorInfo* scale_inv = get("weight_scale_inv");
  const TensorInfo* scale = get("weight_scale");
  if (qweight && qzeros && scales) {
    const int bits = gptq_bits(*qzeros, *scales);
    tally.add_module(bits ? "int" + std::to_string(bits) + "-gptq" : "gptq",
                     "qweight+qzeros+scales", {qweight, qzeros, scales});
    used = {qweight, qzeros, scales};
  } else if (weight && is_fp8(weight->dtype) && scale_inv) {
    tally.add_module("fp8-block", "weight+weight_scale_inv", {weight, scale_inv});
    used = {weight, scale_inv};
  } else if (weight && is_fp8(weight->dtype) && scale) {
    tally.add_module("fp8-scaled", "weight+weight_scale", {weight, scale});
    used = {weight, scale};
  } else if (weight && weight->dtype == DType::kI8 && scale) {
    tally.add_module("int8-rowwise", "weight+weight_scale", {weight, scale});
    used = {weight, scale};
  }
  for (const Member& m : members) {
    if (std::find(used.begin(), used.end(), m.t) != used.end()) continue;
    const bool lone_fp8 = m.leaf == "weight" && is_fp8(m.t->dtype);
    tally.add_module(lone_fp8 ? "fp8-unscaled" : lower_dtype(m.t->dtype), "", {m.t});
  }
}

}  // namespace

Summary summarize(const Checkpoint& c) {
  Summary s;
  std::vector<DTypeStat> by_dtype(kNumDTypes);
  std::unordered_map<std::string_view, std::vector<Member>> modules;
  modules.reserve(c.n_tensors());
  auto add_file = [&](const SafetensorsFile& f, bool model) {
    FileStat fs{c.file_name(f), FileRole::kStray,        f.tensors().size(),
                f.file_size(),  f.header().header_bytes, 0};
    for (const CheckpointFile& lf : c.listing()) {
      if (lf.name == fs.name) fs.role = lf.role;
    }
    for (const TensorInfo& t : f.tensors()) {
      fs.tensor_bytes += t.n_bytes();
      if (!model) continue;
      DTypeStat& d = by_dtype[static_cast<size_t>(t.dtype)];
      d.dtype = t.dtype;
      ++d.n_tensors;
      d.bytes += t.n_bytes();
      const std::string_view name = t.name;
      const size_t dot = name.rfind('.');
      const std::string_view module = dot == std::string_view::npos ? "" : name.substr(0, dot);
      const std::string_view leaf = dot == std::string_view::npos ? name : name.substr(dot + 1);
      modules[module].push_back({leaf, &t});
    }
    if (model) {
      s.n_tensors += fs.n_tensors;
      s.tensor_bytes += fs.tensor_bytes;
    }
    s.files.push_back(std::move(fs));
  };
  for (const SafetensorsFile& f : c.tensor_files()) add_file(f, true);
  for (const SafetensorsFile& f : c.stray_files()) add_file(f, false);

  Tally tally;
  for (const auto& [module, members] : modules) classify_module(members, tally);
  s.by_format = tally.take();
  for (const DTypeStat& d : by_dtype) {
    if (d.n_tensors) s.by_dtype.push_back(d);
  }
  std::sort(s.by_dtype.begin(), s.by_dtype.end(), [](const DTypeStat& a, const DTypeStat& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.dtype < b.dtype;
  });
  return s;
}

}  // namespace qf::ckpt
