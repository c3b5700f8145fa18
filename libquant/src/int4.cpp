#include "qf/quant/int4.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "qf/error.h"

namespace qf::quant {
namespace {

constexpr uint16_t kMinScaleF16 = 0x00A8;  // f16(1e-5), AutoRound's q_scale_thresh

struct GroupParams {
  uint16_t scale;  // F16 bits
  float scale_f32;
  int32_t zero;  // true zero point (8 for symmetric 4-bit)
};

// |scale| >= f16(1e-5), keeping the sign; -0 and +0 become +f16(1e-5) (torch.where(scale < 0)).
uint16_t clamp_scale(uint16_t h) {
  const bool negative = (h & 0x8000u) && h != 0x8000u;
  if ((h & 0x7FFFu) >= kMinScaleF16) return h;
  return negative ? static_cast<uint16_t>(0x8000u | kMinScaleF16) : kMinScaleF16;
}

GroupParams group_params(const float* x, int64_t len, bool sym) {
  // min(w, 0) and max(w, 0), in eight independent lanes so the loop vectorizes.
  float lmin[8] = {0, 0, 0, 0, 0, 0, 0, 0}, lmax[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    for (int j = 0; j < 8; ++j) {
      lmin[j] = x[i + j] < lmin[j] ? x[i + j] : lmin[j];
      lmax[j] = x[i + j] > lmax[j] ? x[i + j] : lmax[j];
    }
  }
  for (; i < len; ++i) {
    lmin[0] = std::min(lmin[0], x[i]);
    lmax[0] = std::max(lmax[0], x[i]);
  }
  float wmin = 0.0f, wmax = 0.0f;
  for (int j = 0; j < 8; ++j) {
    wmin = std::min(wmin, lmin[j]);
    wmax = std::max(wmax, lmax[j]);
  }
  GroupParams p;
  if (sym) {
    const float wmin_abs = -wmin, wmax_abs = wmax;
    const float max_v = wmax_abs < wmin_abs ? wmin_abs : -std::max(wmax_abs, wmin_abs);
    p.scale = clamp_scale(f32_to_f16(max_v / 8.0f));
    p.scale_f32 = f16_to_f32(p.scale);
    p.zero = 8;
  } else {
    p.scale = f32_to_f16((wmax - wmin) / 15.0f);
    if ((p.scale & 0x7FFFu) < kMinScaleF16) p.scale = kMinScaleF16;
    p.scale_f32 = f16_to_f32(p.scale);
    // AutoRound does not clamp the zero; we keep it inside the 4-bit range.
    p.zero = std::clamp(static_cast<int32_t>(std::nearbyint(-wmin / p.scale_f32)), 0, 15);
  }
  return p;
}

// clamp(round_half_even(x / scale), lo, hi) + zero, as torch.round then clamp (clamping first
// gives the same integers since the bounds are integers). NaN weights get the zero code.
uint32_t code_of(float x, float scale, float lo, float hi, float zero) {
  float d = x / scale;
  d = d != d ? 0.0f : d;
  d = d < lo ? lo : (d > hi ? hi : d);
  return static_cast<uint32_t>(round_half_even_small(d) + zero);
}

void check_shape(const MatrixView& w, const Int4Options& o) {
  if (w.cols % 8 != 0 || w.rows % 8 != 0 || o.group_size <= 0) {
    throw Error(Errc::kUnsupported,
                "INT4 GPTQ packing needs K and N divisible by 8 and a positive group: N=" +
                    std::to_string(w.rows) + " K=" + std::to_string(w.cols) +
                    " G=" + std::to_string(o.group_size));
  }
  if (!o.sym && o.zeros == ZeroPoint::kV1StoredMinusOne) {
    throw Error(Errc::kUnsupported, "asymmetric INT4 needs v2 zero points (v1 cannot store 0)");
  }
}

}  // namespace

Int4Tensors quantize_int4(const MatrixView& w, const Int4Options& o, int threads) {
  check_shape(w, o);
  Int4Tensors t;
  t.n = w.rows;
  t.k = w.cols;
  t.group = o.group_size;
  t.zeros = o.zeros;
  const int64_t n = t.n, k = t.k, g_count = int4_groups(k, o.group_size);
  t.qweight.assign(static_cast<size_t>(k / 8 * n), 0);
  t.qzeros.assign(static_cast<size_t>(g_count * (n / 8)), 0);
  t.scales.assign(static_cast<size_t>(g_count * n), 0);
  // Threads own disjoint outputs: whole 8-output spans, so qzeros words are never shared.
  parallel_for(n, threads, 8, [&](int64_t n0, int64_t n1) {
    const size_t kk = static_cast<size_t>(k);
    std::vector<float> row(kk), scale(kk), lo(kk), hi(kk), zero(kk);  // per element of a row
    std::vector<uint32_t> codes(kk);
    for (int64_t r = n0; r < n1; ++r) {
      w.row(r, row.data());
      for (int64_t g = 0; g < g_count; ++g) {
        const int64_t k0 = g * o.group_size, k1 = std::min(k, k0 + o.group_size);
        const GroupParams p = group_params(row.data() + k0, k1 - k0, o.sym);
        t.scales[g * n + r] = p.scale;
        const uint32_t stored = o.zeros == ZeroPoint::kV1StoredMinusOne ? p.zero - 1 : p.zero;
        t.qzeros[g * (n / 8) + r / 8] |= (stored & 0xFu) << (4 * (r % 8));
        // sym: q in [-8, 7], code q + 8; asym: q in [-zero, 15 - zero], code q + zero.
        const float z = static_cast<float>(p.zero);
        std::fill(scale.begin() + k0, scale.begin() + k1, p.scale_f32);
        std::fill(lo.begin() + k0, lo.begin() + k1, o.sym ? -8.0f : -z);
        std::fill(hi.begin() + k0, hi.begin() + k1, o.sym ? 7.0f : 15.0f - z);
        std::fill(zero.begin() + k0, zero.begin() + k1, z);
      }
      // Codes for the whole row (vectorizes), then eight per word, lowest nibble = lowest k.
      const float *x = row.data(), *sc = scale.data(), *lv = lo.data(), *hv = hi.data(),
                  *zv = zero.data();
      uint32_t* cv = codes.data();
      for (int64_t c = 0; c < k; ++c) cv[c] = code_of(x[c], sc[c], lv[c], hv[c], zv[c]);
      for (int64_t b = 0; b < k / 8; ++b) {
        const uint32_t* p8 = cv + 8 * b;
        t.qweight[b * n + r] = p8[0] | p8[1] << 4 | p8[2] << 8 | p8[3] << 12 | p8[4] << 16 |
                               p8[5] << 20 | p8[6] << 24 | p8[7] << 28;
      }
    }
  });
  return t;
}

std::vector<uint16_t> int4_scales(const MatrixView& w, const Int4Options& o, int threads) {
  check_shape(w, o);
  const int64_t n = w.rows, k = w.cols, g_count = int4_groups(k, o.group_size);
  std::vector<uint16_t> scales(static_cast<size_t>(g_count * n));
  parallel_for(n, threads, 1, [&](int64_t n0, int64_t n1) {
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t r = n0; r < n1; ++r) {
      w.row(r, row.data());
      for (int64_t g = 0; g < g_count; ++g) {
        const int64_t k0 = g * o.group_size, k1 = std::min(k, k0 + o.group_size);
        scales[g * n + r] = group_params(row.data() + k0, k1 - k0, o.sym).scale;
      }
    }
  });
  return scales;
}

uint16_t int4_sym_scale(const float* x, int64_t len) {
  return group_params(x, len, true).scale;
}

void int4_sym_codes(const float* x, int64_t len, uint16_t scale, uint8_t* codes) {
  const float s = f16_to_f32(scale);
  for (int64_t c = 0; c < len; ++c) codes[c] = static_cast<uint8_t>(code_of(x[c], s, -8, 7, 8));
}

Int4View view_of(const Int4Tensors& t) {
  return {t.qweight.data(), t.qzeros.data(), t.scales.data(), t.n, t.k, t.group, t.zeros};
}

void dequantize_int4(const Int4View& v, float* out, int threads) {
  parallel_for(v.n, threads, 1, [&](int64_t n0, int64_t n1) {
    for (int64_t r = n0; r < n1; ++r) {
      for (int64_t c = 0; c < v.k; ++c) {
        const int64_t g = c / v.group;
        out[r * v.k + c] =
            int4_dequant(int4_code(v.qweight, v.n, c, r), int4_zero(v.qzeros, v.n, g, r, v.zeros),
                         v.scales[g * v.n + r]);
      }
    }
  });
}

std::vector<uint8_t> unpack_int4(const uint32_t* qweight, int64_t n, int64_t k) {
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      codes[r * k + c] = static_cast<uint8_t>(int4_code(qweight, n, c, r));
    }
  }
  return codes;
}

std::vector<uint32_t> pack_int4(const uint8_t* codes, int64_t n, int64_t k) {
  std::vector<uint32_t> q(static_cast<size_t>(k / 8 * n), 0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      q[(c / 8) * n + r] |= static_cast<uint32_t>(codes[r * k + c] & 0xF) << (4 * (c % 8));
    }
  }
  return q;
}

}  // namespace qf::quant
