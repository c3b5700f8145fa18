// synth --from: quantize a bf16-layout Qwen3.5-MoE checkpoint into intel-int4 or qwen-fp8.
#include <atomic>
#include <cstring>
#include <map>
#include <regex>
#include <thread>

#include "planned_writer.h"
#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/quant/formats.h"
#include "qf/quant/fp8_block.h"
#include "qf/quant/int4.h"
#include "qf/quant/synth.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;
using ckpt::TensorDecl;
using ckpt::TensorRole;

// A [rows, cols] slab of a source tensor: a whole 2-D tensor, or one expert of a fused 3-D one.
struct Slab {
  const ckpt::SafetensorsFile* file = nullptr;
  const ckpt::TensorInfo* info = nullptr;
  uint64_t offset = 0;  // bytes into the tensor
  int64_t rows = 0, cols = 0;

  uint64_t bytes() const {
    return static_cast<uint64_t>(rows * cols) * ckpt::dtype_size(info->dtype);
  }
  const std::byte* data() const {
    return file->map().data() + file->header().data_offset() + info->begin + offset;
  }
  MatrixView matrix() const { return MatrixView(data(), info->dtype, rows, cols); }
  void release() const { file->release(info->begin + offset, bytes()); }
};

std::string shape_str(const ckpt::TensorInfo& t) {
  return std::string(ckpt::dtype_name(t.dtype)) + " " + ckpt::shape_to_string(t.shape);
}

bool is_float(DType d) {
  return d == DType::kBF16 || d == DType::kF16 || d == DType::kF32;
}

void check_aligned(const Slab& s) {
  if (reinterpret_cast<uintptr_t>(s.data()) % ckpt::dtype_size(s.info->dtype) != 0) {
    throw Error(Errc::kUnsupported, "source tensor '" + s.info->name +
                                        "' is not aligned to its element size in its file");
  }
}

// Source of a quantized module's weight [n, k]: "<module>.weight", or expert e of the fused
// "experts.gate_up_proj" [E, 2I, H] (gate rows first) / "experts.down_proj" [E, H, I].
Slab module_source(const ckpt::Checkpoint& src, const TensorDecl& d) {
  const uint64_t n = static_cast<uint64_t>(d.n), k = static_cast<uint64_t>(d.k);
  if (const ckpt::TensorRef* r = src.find(d.module + ".weight")) {
    if (r->info->shape != ckpt::Shape{n, k} || !is_float(r->info->dtype)) {
      throw Error(Errc::kUnsupported, "source '" + r->info->name + "' is " + shape_str(*r->info) +
                                          ", expected a float [" + std::to_string(n) + ", " +
                                          std::to_string(k) + "]");
    }
    Slab s{r->file, r->info, 0, d.n, d.k};
    check_aligned(s);
    return s;
  }
  static const std::regex kExpert(R"((.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj))");
  std::smatch m;
  if (!std::regex_match(d.module, m, kExpert)) {
    throw Error(Errc::kTensorNotFound, "the source has no tensor '" + d.module + ".weight'");
  }
  const uint64_t e = std::stoull(m[2]);
  const bool down = m[3] == "down_proj";
  const std::string fused = m[1].str() + (down ? ".down_proj" : ".gate_up_proj");
  const ckpt::TensorRef* r = src.find(fused);
  if (!r) {
    throw Error(Errc::kTensorNotFound,
                "the source has neither '" + d.module + ".weight' nor the fused '" + fused + "'");
  }
  const ckpt::Shape& sh = r->info->shape;
  const ckpt::Shape want_tail = down ? ckpt::Shape{n, k} : ckpt::Shape{2 * n, k};
  if (sh.size() != 3 || e >= sh[0] || ckpt::Shape{sh[1], sh[2]} != want_tail ||
      !is_float(r->info->dtype)) {
    throw Error(Errc::kUnsupported, "source '" + fused + "' is " + shape_str(*r->info) +
                                        ", expected a float [E > " + std::to_string(e) + ", " +
                                        std::to_string(want_tail[0]) + ", " +
                                        std::to_string(want_tail[1]) + "]");
  }
  const uint64_t es = ckpt::dtype_size(r->info->dtype);
  uint64_t offset = e * sh[1] * sh[2] * es;
  if (m[3] == "up_proj") offset += n * k * es;
  Slab s{r->file, r->info, offset, d.n, d.k};
  check_aligned(s);
  return s;
}

// Source of a tensor stored as is (same name, same element count; float dtypes may convert).
Slab plain_source(const ckpt::Checkpoint& src, const TensorDecl& d) {
  const ckpt::TensorRef* r = src.find(d.name);
  if (!r) throw Error(Errc::kTensorNotFound, "the source has no tensor '" + d.name + "'");
  const bool convertible =
      r->info->dtype == d.dtype || (is_float(r->info->dtype) && is_float(d.dtype));
  if (r->info->shape != d.shape || !convertible) {
    throw Error(Errc::kUnsupported, "source '" + d.name + "' is " + shape_str(*r->info) +
                                        ", expected " + std::string(ckpt::dtype_name(d.dtype)) +
                                        " " + ckpt::shape_to_string(d.shape));
  }
  const int64_t numel = static_cast<int64_t>(ckpt::shape_numel(d.shape));
  Slab s{r->file, r->info, 0, 1, numel};
  if (r->info->dtype != d.dtype) check_aligned(s);
  return s;
}

template <class T>
void write_vec(ckpt::SafetensorsWriter& w, const std::vector<T>& v) {
  w.write(v.data(), v.size() * sizeof(T));
}

void copy_other_files(const ckpt::Checkpoint& src, const fs::path& stage) {
  for (const ckpt::CheckpointFile& f : src.listing()) {
    if (f.role != ckpt::FileRole::kTokenizer && f.role != ckpt::FileRole::kOther) continue;
    if (f.name.size() > 4 && f.name.substr(f.name.size() - 4) == ".tmp") continue;
    fs::copy_file(src.root() / f.name, stage / f.name, fs::copy_options::overwrite_existing);
  }
}

}  // namespace

SynthPlan synth_from_checkpoint(const fs::path& source_dir, const fs::path& out_dir,
                                const SynthOptions& o, ckpt::Progress* progress) {
  if (o.layout == ckpt::Qwen35Layout::kBf16) {
    throw Error(Errc::kUsage, "--from quantizes into intel-int4 or qwen-fp8, not bf16");
  }
  const ckpt::Checkpoint src = ckpt::Checkpoint::open(source_dir);
  const fs::path config_path = src.root() / "config.json";
  const ckpt::Qwen35Config cfg = effective_config(
      ckpt::qwen35_config_from_json(ckpt::read_text_file(config_path), config_path.string()), o);
  SynthPlan plan = plan_synth(cfg, o);

  // Resolve every source before writing anything: a missing or misshapen tensor fails fast.
  std::vector<Slab> sources(plan.tensors.size());
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    const TensorDecl& d = plan.tensors[i];
    sources[i] =
        d.format == ckpt::LinearFormat::kBf16 ? plain_source(src, d) : module_source(src, d);
  }
  std::map<const TensorDecl*, const Slab*> source_of;
  for (size_t i = 0; i < plan.tensors.size(); ++i) source_of[&plan.tensors[i]] = &sources[i];
  if (progress) progress->total = plan.tensor_bytes;

  // Quantization threads inside a file only when there are fewer files than cores.
  const int cores = o.threads > 0
                        ? o.threads
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int inner = std::max(1, cores / static_cast<int>(std::max<size_t>(1, plan.files.size())));
  Int4Options int4;
  int4.group_size = o.schema.group_size;
  Fp8BlockOptions fp8;
  fp8.block_n = fp8.block_k = o.schema.fp8_block;
  fp8.scale_dtype = o.schema.fp8_scale_dtype;

  static std::atomic<uint64_t> runs{0};
  const uint64_t run = ++runs;
  auto produce = [&](const TensorDecl& d, ckpt::SafetensorsWriter& w) {
    const Slab& s = *source_of.at(&d);
    // The writer emits a module's qweight and qzeros back to back (same dtype, adjacent names):
    // quantize once per module and keep it for the second. Keyed by run, so a later conversion
    // in the same process never sees this one's modules.
    thread_local uint64_t cached_run = 0;
    thread_local std::string cached_module;
    thread_local Int4Tensors cached;
    switch (d.role) {
      case TensorRole::kQWeight:
      case TensorRole::kQZeros:
        if (cached_run != run || cached_module != d.module) {
          cached = quantize_int4(s.matrix(), int4, inner);
          cached_module = d.module;
          cached_run = run;
        }
        write_vec(w, d.role == TensorRole::kQWeight ? cached.qweight : cached.qzeros);
        break;
      case TensorRole::kQScales:
        write_vec(w, int4_scales(s.matrix(), int4, inner));
        break;
      case TensorRole::kFp8Weight:
        write_vec(w, quantize_fp8_block(s.matrix(), fp8, inner).codes);
        break;
      case TensorRole::kFp8ScaleInv:
        write_vec(w, fp8_block_scales(s.matrix(), fp8, inner));
        break;
      default:
        if (s.info->dtype == d.dtype) {
          w.copy_from(s.file->map().fd(), s.file->header().data_offset() + s.info->begin + s.offset,
                      s.bytes(), s.file->path());
        } else {
          detail::write_converted(s.matrix(), d.dtype, w);
        }
    }
    s.release();
    if (progress) {
      progress->done.fetch_add(ckpt::tensor_bytes({d.name, d.dtype, d.shape}),
                               std::memory_order_relaxed);
    }
  };
  detail::PlannedWrite pw;
  pw.overwrite = o.overwrite;
  pw.threads = o.threads;
  detail::write_planned_checkpoint(plan, out_dir, pw, produce, [&](const fs::path& stage) {
    write_configs(stage, cfg, o);
    copy_other_files(src, stage);
  });
  return plan;
}

}  // namespace qf::quant
