// synthetic_model: random weights of a config's shapes in a checkpoint's formats (the hybrid's,
// Intel's INT4 release, BF16), made on the GPU.
#include "device_model.h"
#include "qf/error.h"

namespace qf::rt::cuda {
namespace {

using kern::DeviceLinear;
using kern::WeightKind;

constexpr uint32_t kSmall = 0x3C000000u;  // f32 about 0.0078 (norm offsets, biases)

struct Maker {
  DeviceModel& m;
  uint64_t seed;

  void fill(void* p, size_t bytes, uint32_t mask, uint32_t bits) {
    const cudaError_t e =
        kern::fill_random_words(static_cast<uint32_t*>(p), bytes / 4, seed++, mask, bits, nullptr);
    if (e != cudaSuccess)
      throw Error(Errc::kIo, std::string("filling weights: ") + cudaGetErrorString(e));
  }

  // f16 scale 2^-10 in both halves of a word: 0x1400.
  DeviceLinear int_stack(WeightKind kind, int n, int k, int count) {
    DeviceLinear d;
    d.kind = kind;
    d.n = n;
    d.k = k;
    d.group = 128;
    const int per = kind == WeightKind::kInt4 ? 8 : 4, groups = (k + 127) / 128;
    d.w_stride = static_cast<size_t>(n) * (k / per);
    d.scale_stride = d.zero_stride = static_cast<size_t>(n) * groups;
    void* w = m.alloc(d.w_stride * 4 * count);
    fill(w, d.w_stride * 4 * count, 0xFFFFFFFFu, 0);
    void* s = m.alloc(d.scale_stride * 2 * count + 4);
    fill(s, (d.scale_stride * 2 * count + 3) / 4 * 4, 0x03FF03FFu, 0x14001400u);
    void* z = m.alloc(d.zero_stride * count + 4);
    const uint32_t zero = kind == WeightKind::kInt4 ? 0x09090909u : 0x81818181u;  // v1 zero + 1
    fill(z, (d.zero_stride * count + 3) / 4 * 4, 0, zero);
    d.w = w;
    d.scales = static_cast<const __half*>(s);
    d.zeros = static_cast<const uint8_t*>(z);
    return d;
  }

  DeviceLinear fp8(int n, int k) {
    DeviceLinear d;
    d.kind = WeightKind::kFp8;
    d.n = n;
    d.k = k;
    d.block = 128;
    void* w = m.alloc(static_cast<size_t>(n) * k);
    fill(w, static_cast<size_t>(n) * k / 4 * 4, 0x77777777u, 0);  // finite E4M3 codes
    const size_t scales = static_cast<size_t>((n + 127) / 128) * ((k + 127) / 128);
    void* s = m.alloc(scales * 4);
    fill(s, scales * 4, 0x000FFFFFu, 0x3C000000u);  // about 2^-7
    d.w = w;
    d.block_scale = static_cast<const float*>(s);
    return d;
  }

  DeviceLinear bf16(int n, int k, int count = 1) {
    DeviceLinear d;
    d.kind = WeightKind::kBf16;
    d.n = n;
    d.k = k;
    d.w_stride = static_cast<size_t>(n) * k;
    const size_t bytes = d.w_stride * 2 * count;
    void* w = m.alloc(bytes + 4);
    fill(w, (bytes + 3) / 4 * 4, 0x807F807Fu, 0x3C003C00u);  // about +-2^-7
    d.w = w;
    return d;
  }

  // A fused group of parts with `rows` output rows each.
  RowGroup group(kern::DeviceLinear fused, const std::vector<int>& rows) {
    RowGroup g;
    g.fused = fused;
    int offset = 0;
    for (int r : rows) {
      kern::DeviceLinear part = fused;
      part.n = r;
      g.parts.push_back(part);
      g.offsets.push_back(offset);
      offset += r;
    }
    return g;
  }

  const float* vec(size_t n, uint32_t bits) {
    void* p = m.alloc(n * 4);
    fill(p, n * 4, 0x0000FFFFu, bits);
    return static_cast<const float*>(p);
  }

  // A decoder layer: its linear modules in `kind` (INT4 or BF16), router BF16, shared expert in
  // `shared` (FP8 or BF16).
  DeviceLayer layer(const ckpt::Qwen35Config& c, bool full_attention, WeightKind kind,
                    WeightKind shared, bool swiglu_pairs) {
    const int h = static_cast<int>(c.hidden_size), e = static_cast<int>(c.num_experts),
              im = static_cast<int>(c.moe_intermediate_size),
              is = static_cast<int>(c.shared_expert_intermediate_size);
    const auto linear = [&](int n, int k, int count) {
      return kind == WeightKind::kBf16 ? bf16(n, k, count) : int_stack(kind, n, k, count);
    };
    DeviceLayer d;
    d.full_attention = full_attention;
    d.input_norm = vec(h, kSmall);
    d.post_norm = vec(h, kSmall);
    if (d.full_attention) {
      const int q = static_cast<int>(c.q_proj_rows()), kv = static_cast<int>(c.kv_rows());
      d.qkv = group(linear(q + 2 * kv, h, 1), {q, kv, kv});
      d.o = linear(h, static_cast<int>(c.num_attention_heads * c.head_dim), 1);
      d.q_norm = vec(c.head_dim, kSmall);
      d.k_norm = vec(c.head_dim, kSmall);
    } else {
      const int nv = static_cast<int>(c.linear_num_value_heads);
      const int cd = static_cast<int>(c.conv_dim()), vd = static_cast<int>(c.value_dim());
      d.gdn_in = group(linear(cd + vd + 2 * nv, h, 1), {cd, vd, nv, nv});
      d.out = linear(h, static_cast<int>(c.value_dim()), 1);
      d.conv = vec(static_cast<size_t>(c.conv_dim() * c.linear_conv_kernel_dim), 0x3E000000u);
      d.dt_bias = vec(nv, kSmall);
      d.a_log = vec(nv, kSmall);
      d.gdn_norm = vec(c.linear_value_head_dim, 0x3F800000u);
    }
    d.moe.router = group(bf16(e + 1, h), {e, 1});
    d.moe.gate_up = group(linear(2 * im, h, e), {im, im});
    // Random codes: the paired row order is only a reading of them.
    d.moe.gate_up.swiglu_pairs =
        swiglu_pairs && kern::gemv_swiglu_shape_ok(kind, im, h, d.moe.gate_up.fused.group);
    d.moe.down = linear(h, im, e);
    const bool f8 = shared == WeightKind::kFp8;
    d.moe.shared_gate_up = group(f8 ? fp8(2 * is, h) : bf16(2 * is, h), {is, is});
    d.moe.shared_down = f8 ? fp8(h, is) : bf16(h, is);
    return d;
  }
};

}  // namespace

std::unique_ptr<DeviceModel> synthetic_model(const ckpt::Qwen35Config& c, uint64_t seed,
                                             bool swiglu_pairs, bool mtp, SyntheticFormat format) {
  auto m = std::make_unique<DeviceModel>();
  m->config = c;
  Maker mk{*m, seed};
  const int h = static_cast<int>(c.hidden_size), vocab = static_cast<int>(c.vocab_size);
  const WeightKind kind = format == SyntheticFormat::kBf16 ? WeightKind::kBf16 : WeightKind::kInt4;
  const bool hybrid =
      format == SyntheticFormat::kHybrid || format == SyntheticFormat::kHybridInt4Head;
  const WeightKind shared = hybrid ? WeightKind::kFp8 : WeightKind::kBf16;
  m->embed = mk.bf16(vocab, h).w;
  for (int64_t i = 0; i < c.num_layers(); ++i) {
    m->layers.push_back(mk.layer(c, c.full_attention[i], kind, shared, swiglu_pairs));
  }
  m->final_norm = mk.vec(h, kSmall);
  m->lm_head = !hybrid ? mk.bf16(vocab, h)
                       : mk.int_stack(format == SyntheticFormat::kHybrid ? WeightKind::kInt8
                                                                         : WeightKind::kInt4,
                                      vocab, h, 1);
  if (mtp) {  // BF16 but for the shared expert (the 122B hybrid's: FP8)
    DeviceMtp t;
    t.fc = mk.bf16(h, 2 * h);
    t.pre_fc_norm_embedding = mk.vec(h, kSmall);
    t.pre_fc_norm_hidden = mk.vec(h, kSmall);
    t.norm = mk.vec(h, kSmall);
    t.layer = mk.layer(c, true, WeightKind::kBf16, shared, swiglu_pairs);
    m->mtp = t;
  }
  return m;
}

}  // namespace qf::rt::cuda
