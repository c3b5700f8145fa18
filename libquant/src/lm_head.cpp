#include "qf/quant/lm_head.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numbers>
#include <optional>
#include <random>
#include <set>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/checksum.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/writer.h"
#include "qf/error.h"
#include "qf/quant/formats.h"
#include "qf/quant/int4.h"
#include "qf/quant/int8_row.h"
#include "qf/quant/matrix.h"
#include "qf/quant/metrics.h"
#include "qf/quant/quant_config.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;
using nlohmann::ordered_json;

constexpr uint64_t kChunkBytes = 32ull << 20;  // weight rows read (then released) at a time
constexpr uint64_t kStripBytes = 64ull << 20;  // qweight rows assembled before writing

struct Head {
  const ckpt::SafetensorsFile* file;
  const ckpt::TensorInfo* info;
  int64_t v, h;  // rows (vocabulary), columns (hidden)
  MatrixView w;
  int64_t chunk_rows;
  int bits;
  int64_t group;  // columns per scale (the row for INT8)
  int64_t groups() const { return (h + group - 1) / group; }
  int64_t per_word() const { return 32 / bits; }
  // Drops the mapped pages of rows [r0, r1): memory stays bounded by one chunk.
  void release(int64_t r0, int64_t r1) const {
    const uint64_t row_bytes = static_cast<uint64_t>(h) * ckpt::dtype_size(info->dtype);
    file->release(info->begin + static_cast<uint64_t>(r0) * row_bytes,
                  static_cast<uint64_t>(r1 - r0) * row_bytes);
  }
};

fs::path normalized(const fs::path& p) {
  fs::path n = fs::absolute(p).lexically_normal();
  if (n.filename().empty()) n = n.parent_path();  // "dir/" -> "dir"
  return n;
}

ordered_json read_json(const fs::path& p) {
  try {
    return ordered_json::parse(ckpt::read_text_file(p));
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::kConfigInvalid, p.string() + ": " + e.what());
  }
}

Head find_head(const ckpt::Checkpoint& c, const ordered_json& config, int bits) {
  if (c.find("lm_head.qweight")) {
    throw Error(Errc::kUnsupported,
                "'" + c.root().string() + "' already has a quantized LM head (lm_head.qweight)");
  }
  const ckpt::TensorRef* r = c.find("lm_head.weight");
  if (!r) {
    const auto flag = [](const ordered_json& o) {
      return o.is_object() && o.contains("tie_word_embeddings") &&
             o["tie_word_embeddings"].is_boolean() && o["tie_word_embeddings"].get<bool>();
    };
    const bool tied = flag(config) || (config.is_object() && config.contains("text_config") &&
                                       flag(config["text_config"]));
    throw Error(
        Errc::kTensorNotFound,
        "'" + c.root().string() + "' has no lm_head.weight" +
            (tied ? " (tie_word_embeddings: the head is embed_tokens, nothing to quantize)" : ""));
  }
  const ckpt::TensorInfo& t = *r->info;
  if (t.shape.size() != 2 ||
      (t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kF32)) {
    throw Error(Errc::kUnsupported, "lm_head.weight is " + std::string(ckpt::dtype_name(t.dtype)) +
                                        " " + ckpt::shape_to_string(t.shape) +
                                        ", expected BF16, F16 or F32 [vocab, hidden]");
  }
  const int64_t v = static_cast<int64_t>(t.shape[0]), h = static_cast<int64_t>(t.shape[1]);
  const int per_word = 32 / bits;
  if (v % per_word != 0 || h % per_word != 0 || v == 0 || h == 0) {
    throw Error(Errc::kUnsupported, "lm_head.weight " + ckpt::shape_to_string(t.shape) + ": GPTQ " +
                                        std::to_string(bits) +
                                        "-bit packing needs both dimensions multiples of " +
                                        std::to_string(per_word));
  }
  const ckpt::TensorView view = r->file->view(t);
  const int64_t row_bytes = h * static_cast<int64_t>(ckpt::dtype_size(t.dtype));
  return {r->file,
          r->info,
          v,
          h,
          MatrixView(view.bytes.data(), t.dtype, v, h),
          std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes) / row_bytes),
          bits,
          bits == 8 ? h : kLmHeadInt4Group};
}

// Eight independent lanes so the float sum vectorizes without reassociation flags.
float dot(const float* a, const float* b, int64_t n) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] += a[i + j] * b[i + j];
  }
  float s = 0;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float l : lane) s += l;
  return s;
}

// Random hidden states x ~ N(0, 1), Box-Muller over mt19937_64 (the same on every platform).
std::vector<float> hidden_states(int samples, int64_t h, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  std::vector<float> x(static_cast<size_t>(samples * h));
  for (size_t i = 0; i < x.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())),
                 phi = 2.0 * std::numbers::pi * uniform();
    x[i] = static_cast<float>(r * std::cos(phi));
    if (i + 1 < x.size()) x[i + 1] = static_cast<float>(r * std::sin(phi));
  }
  return x;
}

// Row r's INT4 scales (into scales [G, V]) and its dequantized weights.
void int4_row(const Head& hd, int64_t r, const float* w, std::vector<uint16_t>& scales,
              float* deq) {
  uint8_t codes[kLmHeadInt4Group];
  for (int64_t g = 0; g < hd.groups(); ++g) {
    const int64_t c0 = g * hd.group, len = std::min(hd.h - c0, hd.group);
    const uint16_t s = int4_sym_scale(w + c0, len);
    scales[static_cast<size_t>(g * hd.v + r)] = s;
    int4_sym_codes(w + c0, len, s, codes);
    const float sf = f16_to_f32(s);
    for (int64_t c = 0; c < len; ++c) deq[c0 + c] = static_cast<float>(codes[c] - 8) * sf;
  }
}

// Pass 1: the scales (F16, rounded before the codes are computed; [G, V]), the error of the
// dequantized weights, and the logits of both on random hidden states.
void measure(const Head& hd, const LmHeadOptions& o, std::vector<uint16_t>& scales,
             LmHeadReport& rep, ckpt::Progress* progress) {
  const int64_t v = hd.v, h = hd.h;
  scales.assign(static_cast<size_t>(hd.groups() * v), 0);
  std::vector<float> scales_f32(hd.bits == 8 ? static_cast<size_t>(v) : 0);
  const int samples = std::max(0, o.samples);
  const std::vector<float> x = hidden_states(samples, h, o.seed);
  std::vector<float> ref_logits(static_cast<size_t>(samples * v)),
      q_logits(static_cast<size_t>(samples * v));
  std::vector<int8_t> q(hd.bits == 8 ? static_cast<size_t>(hd.chunk_rows * h) : 0);
  double max_abs = 0, sum_abs = 0, min_cos = 1, sum_cos = 0;
  std::mutex mu;
  const uint64_t row_bytes = static_cast<uint64_t>(h) * ckpt::dtype_size(hd.info->dtype);
  for (int64_t r0 = 0; r0 < v; r0 += hd.chunk_rows) {
    const int64_t r1 = std::min(v, r0 + hd.chunk_rows);
    if (hd.bits == 8) {
      quantize_int8_rows_into(hd.w, r0, r1 - r0, DType::kF16, q.data(),
                              reinterpret_cast<uint8_t*>(scales.data() + r0),
                              scales_f32.data() + r0, o.threads);
    }
    parallel_for(r1 - r0, o.threads, 1, [&](int64_t a, int64_t b) {
      std::vector<float> ref(static_cast<size_t>(h)), deq(static_cast<size_t>(h));
      double l_max = 0, l_sum = 0, l_min_cos = 1, l_sum_cos = 0;
      for (int64_t i = a; i < b; ++i) {
        const int64_t r = r0 + i;
        hd.w.row(r, ref.data());
        if (hd.bits == 8) {
          const int8_t* qr = q.data() + i * h;
          for (int64_t c = 0; c < h; ++c) deq[c] = static_cast<float>(qr[c]) * scales_f32[r];
        } else {
          int4_row(hd, r, ref.data(), scales, deq.data());
        }
        const ErrorStats e = error_stats(ref.data(), deq.data(), h);
        l_max = std::max(l_max, e.max_abs);
        l_sum += e.mean_abs * static_cast<double>(h);
        l_min_cos = std::min(l_min_cos, e.cosine);
        l_sum_cos += e.cosine;
        for (int s = 0; s < samples; ++s) {
          const float* xs = x.data() + s * h;
          ref_logits[s * v + r] = dot(ref.data(), xs, h);
          q_logits[s * v + r] = dot(deq.data(), xs, h);
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      max_abs = std::max(max_abs, l_max);
      sum_abs += l_sum;
      min_cos = std::min(min_cos, l_min_cos);
      sum_cos += l_sum_cos;
    });
    hd.release(r0, r1);
    if (progress) progress->done.fetch_add(static_cast<uint64_t>(r1 - r0) * row_bytes);
  }
  rep.max_abs_error = max_abs;
  rep.mean_abs_error = sum_abs / (static_cast<double>(v) * static_cast<double>(h));
  rep.min_row_cosine = min_cos;
  rep.mean_row_cosine = sum_cos / static_cast<double>(v);
  rep.samples = samples;
  double top1 = 0, top5 = 0;
  for (int s = 0; s < samples; ++s) {
    const TopKAgreement a = topk_agreement(ref_logits.data() + s * v, q_logits.data() + s * v, v,
                                           static_cast<int>(std::min<int64_t>(5, v)));
    top1 += a.top1_equal ? 1 : 0;
    top5 += a.overlap;
  }
  rep.top1_agreement = samples ? top1 / samples : 0;
  rep.top5_overlap = samples ? top5 / samples : 0;
}

// Row r's codes for columns [c0, c0 + n), packed into words strip[j * V + r]; q holds n codes.
void pack_row(const Head& hd, int64_t r, const float* x, int64_t c0, int64_t n,
              const std::vector<uint16_t>& scales, int32_t* q, uint32_t* strip) {
  const int64_t v = hd.v;
  if (hd.bits == 8) {
    int8_codes(x, n, f16_to_f32(scales[static_cast<size_t>(r)]), q);
    for (int64_t j = 0; j < n / kInt8PerWord; ++j) {
      const int32_t* c = q + j * kInt8PerWord;
      strip[j * v + r] = int8_pack4(c[0], c[1], c[2], c[3]);
    }
    return;
  }
  uint8_t* q4 = reinterpret_cast<uint8_t*>(q);  // n bytes of the n words
  for (int64_t c = c0; c < c0 + n;) {  // a group (or the part of one in the strip) at a time
    const int64_t g = c / hd.group, end = std::min(c0 + n, (g + 1) * hd.group);
    int4_sym_codes(x + (c - c0), end - c, scales[static_cast<size_t>(g * v + r)], q4 + (c - c0));
    c = end;
  }
  for (int64_t j = 0; j < n / kInt4PerWord; ++j) {
    uint32_t word = 0;
    for (int b = 0; b < kInt4PerWord; ++b) word |= uint32_t{q4[j * kInt4PerWord + b]} << (4 * b);
    strip[j * v + r] = word;
  }
}

// Pass 2: lm_head.qweight [H / per word, V], a strip of qweight rows at a time, so the write is
// sequential and memory holds one strip plus one chunk of weight rows.
void write_qweight(const Head& hd, const std::vector<uint16_t>& scales, int threads,
                   ckpt::SafetensorsWriter& w, ckpt::Progress* progress) {
  const int64_t v = hd.v, words = hd.h / hd.per_word();
  const int64_t per_strip =
      std::clamp<int64_t>(static_cast<int64_t>(kStripBytes) / (v * 4), 1, words);
  std::vector<uint32_t> strip(static_cast<size_t>(per_strip * v));
  const uint64_t head_bytes = hd.info->n_bytes();
  for (int64_t j0 = 0; j0 < words; j0 += per_strip) {
    const int64_t nw = std::min(words, j0 + per_strip) - j0, nk = nw * hd.per_word();
    for (int64_t r0 = 0; r0 < v; r0 += hd.chunk_rows) {
      const int64_t r1 = std::min(v, r0 + hd.chunk_rows);
      parallel_for(r1 - r0, threads, 1, [&](int64_t a, int64_t b) {
        std::vector<float> x(static_cast<size_t>(nk));
        std::vector<int32_t> q(static_cast<size_t>(nk));
        for (int64_t r = r0 + a; r < r0 + b; ++r) {
          hd.w.row_range(r, j0 * hd.per_word(), nk, x.data());
          pack_row(hd, r, x.data(), j0 * hd.per_word(), nk, scales, q.data(), strip.data());
        }
      });
      hd.release(r0, r1);
    }
    w.write(strip.data(), static_cast<size_t>(nw * v) * 4);
    if (progress) progress->done.fetch_add(head_bytes * nw / words);
  }
}

// Every entry of `dir` except `skip`, into `stage`: hard links where allowed (in place: the
// originals never change, the directory is swapped), else reflinks or copies.
void carry_files(const fs::path& dir, const fs::path& stage, const std::set<std::string>& skip,
                 bool hardlink, ckpt::Progress* progress) {
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (skip.count(name)) continue;
    std::error_code ec;
    if (e.is_symlink(ec)) {
      fs::copy_symlink(e.path(), stage / name, ec);
    } else if (e.is_directory(ec)) {
      fs::copy(e.path(), stage / name,
               fs::copy_options::recursive |
                   (hardlink ? fs::copy_options::create_hard_links : fs::copy_options::none),
               ec);
    } else {
      ckpt::copy_file_atomic(e.path(), stage / name, hardlink, true);
      if (progress) progress->done.fetch_add(e.file_size(ec));
      continue;
    }
    if (ec) throw_io("cannot copy", e.path().string(), ec.value());
  }
}

ordered_json quantization_entry(const LmHeadReport& r) {
  return {{"bits", r.bits}, {"group_size", r.group}, {"sym", true}, {"data_type", "int"}};
}

ordered_json report_json(const LmHeadReport& r) {
  return {{"format", r.bits == 8 ? "gptq-int8" : "gptq-int4"},
          {"group_size", r.group},
          {"sym", true},
          {"scale_dtype", "F16"},
          {"zero_point", r.bits == 8 ? "v1 (qzeros 0x7F7F7F7F)" : "v1 (qzeros 0x77777777)"},
          {"source_dtype", r.source_dtype},
          {"max_abs_error", r.max_abs_error},
          {"mean_abs_error", r.mean_abs_error},
          {"min_row_cosine", r.min_row_cosine},
          {"mean_row_cosine", r.mean_row_cosine},
          {"samples", r.samples},
          {"top1_agreement", r.top1_agreement},
          {"top5_overlap", r.top5_overlap}};
}

}  // namespace

LmHeadReport quantize_lm_head(const fs::path& dir_arg, const LmHeadOptions& o,
                              ckpt::Progress* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.in_place == !o.out.empty()) {
    throw Error(Errc::kUsage, "give exactly one of --out DIR and --in-place");
  }
  if (o.bits != 8 && o.bits != 4) {
    throw Error(Errc::kUsage, "--bits must be 8 or 4, not " + std::to_string(o.bits));
  }
  const fs::path dir = normalized(dir_arg);
  const fs::path out = o.in_place ? dir : normalized(o.out);
  std::error_code ec;
  if (!o.in_place && out == dir) throw Error(Errc::kUsage, "--out is the input; use --in-place");
  if (!o.in_place && !o.force && !o.dry_run && fs::exists(out, ec)) {
    throw Error(Errc::kExists, "'" + out.string() + "' exists (use --force to overwrite)");
  }
  if (!fs::is_directory(dir, ec)) {
    throw Error(Errc::kIo, "'" + dir.string() + "': no such checkpoint directory");
  }
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(dir);
  const fs::path cfg_path = dir / "config.json";
  if (!fs::exists(cfg_path, ec)) throw Error(Errc::kConfigInvalid, cfg_path.string() + ": missing");
  ordered_json config = read_json(cfg_path);
  if (!config.contains("quantization_config") ||
      !is_inc_config(nlohmann::json(config["quantization_config"]))) {
    throw Error(Errc::kUnsupported, cfg_path.string() +
                                        ": no AutoRound (INC) quantization_config to declare the " +
                                        (o.bits == 8 ? "INT8" : "INT4") + " head in");
  }
  const Head hd = find_head(c, config, o.bits);
  const std::string shard = c.file_name(*hd.file);

  LmHeadReport rep;
  rep.bits = hd.bits;
  rep.group = hd.bits == 8 ? -1 : hd.group;
  rep.rows = hd.v;
  rep.cols = hd.h;
  rep.shard = shard;
  rep.source_dtype = std::string(ckpt::dtype_name(hd.info->dtype));
  rep.bytes_before = hd.info->n_bytes();
  const uint64_t groups = static_cast<uint64_t>(hd.groups()), v = static_cast<uint64_t>(hd.v);
  const uint64_t qweight_bytes =
      v * static_cast<uint64_t>(hd.h) * static_cast<uint64_t>(hd.bits) / 8;
  const uint64_t qzeros_bytes = groups * v * static_cast<uint64_t>(hd.bits) / 8,
                 scales_bytes = groups * v * 2;
  rep.bytes_after = qweight_bytes + qzeros_bytes + scales_bytes;

  if (progress) progress->total = rep.bytes_before * (o.dry_run ? 1 : 2);
  std::vector<uint16_t> scales;
  measure(hd, o, scales, rep, progress);
  if (o.dry_run) {
    rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return rep;
  }

  // Everything else first: a bad quantization_config.json fails before any write.
  const fs::path qcfg_path = dir / "quantization_config.json";
  const bool has_qcfg = fs::exists(qcfg_path, ec);
  ordered_json qcfg_file;
  if (has_qcfg) qcfg_file = read_json(qcfg_path);
  config["quantization_config"]["extra_config"]["lm_head"] = quantization_entry(rep);
  if (has_qcfg) qcfg_file["extra_config"]["lm_head"] = quantization_entry(rep);
  const fs::path manifest_path = dir / ckpt::kManifestFileName;
  const bool has_manifest = fs::exists(manifest_path, ec);
  std::optional<ckpt::Manifest> manifest;
  if (has_manifest) manifest = ckpt::parse_manifest(ckpt::read_text_file(manifest_path));

  fs::path stage = out;
  stage += ".tmp";
  fs::remove_all(stage, ec);  // leftovers of an interrupted run
  if (!fs::create_directories(stage, ec) && ec)
    throw_io("cannot create", stage.string(), ec.value());
  try {
    const std::set<std::string> regenerated = {shard, std::string(ckpt::kIndexFileName),
                                               "config.json", "quantization_config.json",
                                               std::string(ckpt::kManifestFileName)};
    carry_files(dir, stage, regenerated, o.in_place, nullptr);

    // The shard: its tensors but lm_head.weight in their data order, then the GPTQ triplet; the
    // kept tensors can share the source's blocks (build-hybrid does the same).
    const ckpt::Header& src_header = hd.file->header();
    std::vector<const ckpt::TensorInfo*> kept;
    for (const ckpt::TensorInfo& t : hd.file->tensors()) {
      if (t.name != "lm_head.weight") kept.push_back(&t);
    }
    std::stable_sort(kept.begin(), kept.end(),
                     [](const auto* a, const auto* b) { return a->begin < b->begin; });
    std::vector<ckpt::TensorSpec> specs;
    std::vector<std::optional<uint64_t>> at;
    for (const ckpt::TensorInfo* t : kept) {
      specs.push_back({t->name, t->dtype, t->shape});
      at.push_back(src_header.data_offset() + t->begin);
    }
    const auto u = [](int64_t x) { return static_cast<uint64_t>(x); };
    const uint64_t per_word = static_cast<uint64_t>(hd.per_word());
    specs.push_back({"lm_head.qweight", DType::kI32, {u(hd.h) / per_word, u(hd.v)}});
    specs.push_back({"lm_head.qzeros", DType::kI32, {groups, u(hd.v) / per_word}});
    specs.push_back({"lm_head.scales", DType::kF16, {groups, u(hd.v)}});
    at.resize(specs.size());
    ckpt::WriterOptions wo;
    wo.overwrite = true;
    wo.hash = has_manifest;
    wo.sparse_zeros = ckpt::is_sparse_file(hd.file->path());
    wo.clone = ckpt::can_clone(hd.file->path(), stage);
    ckpt::SafetensorsWriter w(
        stage / shard,
        ckpt::plan_safetensors_sharing(specs,
                                       src_header.has_metadata
                                           ? std::optional<ckpt::Metadata>(src_header.metadata)
                                           : std::nullopt,
                                       at),
        wo);
    for (const ckpt::TensorInfo& t : w.plan().layout) {
      if (t.name == "lm_head.qweight") {
        write_qweight(hd, scales, o.threads, w, progress);
      } else if (t.name == "lm_head.qzeros") {
        const std::vector<uint32_t> zeros(qzeros_bytes / 4,
                                          hd.bits == 8 ? kInt8SymZeroWordV1 : kInt4SymZeroWordV1);
        w.write(zeros.data(), zeros.size() * 4);
      } else if (t.name == "lm_head.scales") {
        w.write(scales.data(), scales.size() * 2);
      } else {
        const ckpt::TensorInfo* s = hd.file->find(t.name);
        w.copy_from(hd.file->map().fd(), src_header.data_offset() + s->begin, s->n_bytes(),
                    hd.file->path());
      }
    }
    w.commit();

    if (c.index()) {
      ckpt::ShardIndex index = *c.index();
      std::erase_if(index.weight_map, [](const auto& e) { return e.first == "lm_head.weight"; });
      for (const char* n : {"lm_head.qweight", "lm_head.qzeros", "lm_head.scales"})
        index.weight_map.emplace_back(n, shard);
      index.sort();
      index.total_size = c.tensor_bytes() - rep.bytes_before + rep.bytes_after;
      ckpt::write_file_atomic(stage / ckpt::kIndexFileName, ckpt::serialize_index(index), true);
    }
    config["qforge"]["lm_head"] = report_json(rep);
    ckpt::write_file_atomic(stage / "config.json", config.dump(2) + "\n", true);
    if (has_qcfg) {
      ckpt::write_file_atomic(stage / "quantization_config.json", qcfg_file.dump(2) + "\n", true);
    }
    if (manifest) {  // unchanged files keep their digests; the rewritten ones get new ones
      std::erase_if(manifest->files,
                    [&](const ckpt::FileDigest& d) { return regenerated.count(d.name) > 0; });
      manifest->files.push_back(w.digest());
      for (const std::string& f : regenerated) {
        const fs::path p = stage / f;
        if (f != shard && f != ckpt::kManifestFileName && fs::exists(p, ec)) {
          manifest->files.push_back(ckpt::digest_file({p, f, nullptr}));
        }
      }
      std::sort(
          manifest->files.begin(), manifest->files.end(),
          [](const ckpt::FileDigest& a, const ckpt::FileDigest& b) { return a.name < b.name; });
      ckpt::write_file_atomic(stage / ckpt::kManifestFileName, ckpt::serialize_manifest(*manifest),
                              true);
      rep.manifest_updated = true;
    }
    ckpt::fsync_dir(stage);
  } catch (...) {
    fs::remove_all(stage, ec);
    throw;
  }
  ckpt::publish_directory(stage, out, o.in_place || o.force);
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return rep;
}

}  // namespace qf::quant
