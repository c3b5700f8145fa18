// Quantizer throughput on this machine's cores, each next to a memcpy of the same bytes in the
// same run (prints figures; asserts nothing).
//
//   INT8 per row   of a 248320 x 3072 BF16 matrix (the Qwen3.5 LM head), F32 scales
//   INT4 RTN       over 1 GiB of BF16 weights in 122B expert shapes ([1024, 3072] modules)
//   FP8 block      over the same 1 GiB
//
// Usage: qforge-bench-quant [--threads N] [--runs N] [--gib G]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "qf/quant/formats.h"
#include "qf/quant/fp8_block.h"
#include "qf/quant/int4.h"
#include "qf/quant/int8_row.h"

namespace {

using qf::ckpt::DType;
using qf::quant::MatrixView;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> v(n);
  uint64_t z = seed;
  for (size_t i = 0; i < n; ++i) {  // N(0, ~0.02)-ish via the sum of two uniforms
    z = z * 6364136223846793005ull + 1442695040888963407ull;
    const float u = static_cast<float>((z >> 40) & 0xFFFF) + static_cast<float>((z >> 16) & 0xFFFF);
    v[i] = qf::quant::f32_to_bf16((u - 65535.0f) * (0.02f / 26755.0f));
  }
  return v;
}

// memcpy of `bytes` on `threads` threads (the same split as the quantizers).
double memcpy_seconds(const void* src, void* dst, size_t bytes, int threads) {
  const double t0 = now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const size_t b = bytes * t / threads, e = bytes * (t + 1) / threads;
    pool.emplace_back([=] {
      std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, e - b);
    });
  }
  for (auto& th : pool) th.join();
  return now() - t0;
}

void line(const char* what, double bytes, double tq, double tm) {
  std::printf(
      "  %-34s %7.3f s  %6.2f GB/s of BF16 input   memcpy %6.3f s  %6.2f GB/s   "
      "quantizer/memcpy throughput %.3f\n",
      what, tq, bytes / tq / 1e9, tm, bytes / tm / 1e9, tm / tq);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int runs = 3;
  double gib = 1.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--threads")
      threads = std::stoi(argv[i + 1]);
    else if (f == "--runs")
      runs = std::stoi(argv[i + 1]);
    else if (f == "--gib")
      gib = std::stod(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: qforge-bench-quant [--threads N] [--runs N] [--gib G]\n");
      return 1;
    }
  }
  std::printf("qforge-bench-quant: %d threads\n", threads);

  {  // INT8 per-row LM head
    const int64_t n = 248320, k = 3072;
    const auto w = random_bf16(static_cast<size_t>(n * k), 1);
    std::vector<uint16_t> dst(w.size());
    const double bytes = static_cast<double>(w.size()) * 2;
    std::printf("[int8-rows] %lld x %lld BF16 (%.2f GiB)\n", static_cast<long long>(n),
                static_cast<long long>(k), bytes / 1073741824.0);
    for (int r = 0; r < runs; ++r) {
      const double tm = memcpy_seconds(w.data(), dst.data(), w.size() * 2, threads);
      // Streaming, as quantize-lm-head writes it: 4096 rows at a time into reused buffers.
      const int64_t chunk = 4096;
      std::vector<int8_t> q(static_cast<size_t>(chunk * k));
      std::vector<uint8_t> s(static_cast<size_t>(chunk) * 4);
      std::vector<float> sf(static_cast<size_t>(chunk));
      const MatrixView mv(w.data(), DType::kBF16, n, k);
      const double t0 = now();
      for (int64_t row = 0; row < n; row += chunk) {
        qf::quant::quantize_int8_rows_into(mv, row, std::min(chunk, n - row), DType::kF32, q.data(),
                                           s.data(), sf.data(), threads);
      }
      line("quantize_int8_rows (F32 scales)", bytes, now() - t0, tm);
    }
  }
  {  // INT4 RTN and FP8 block over 1 GiB in [1024, 3072] modules
    const int64_t n = 1024, k = 3072;
    const size_t module = static_cast<size_t>(n * k);
    const size_t n_modules =
        static_cast<size_t>(gib * 1073741824.0 / 2 / static_cast<double>(module));
    const auto w = random_bf16(module * n_modules, 2);
    std::vector<uint16_t> dst(w.size());
    const double bytes = static_cast<double>(w.size()) * 2;
    std::printf("[int4-rtn, fp8-block] %zu modules of [%lld, %lld] BF16 (%.2f GiB)\n", n_modules,
                static_cast<long long>(n), static_cast<long long>(k), bytes / 1073741824.0);
    for (int r = 0; r < runs; ++r) {
      const double tm = memcpy_seconds(w.data(), dst.data(), w.size() * 2, threads);
      double t0 = now();
      for (size_t m = 0; m < n_modules; ++m) {
        qf::quant::quantize_int4(MatrixView(w.data() + m * module, DType::kBF16, n, k), {},
                                 threads);
      }
      line("quantize_int4 (RTN, G128, sym)", bytes, now() - t0, tm);
      t0 = now();
      qf::quant::Fp8BlockOptions fo;
      fo.scale_dtype = DType::kBF16;
      for (size_t m = 0; m < n_modules; ++m) {
        qf::quant::quantize_fp8_block(MatrixView(w.data() + m * module, DType::kBF16, n, k), fo,
                                      threads);
      }
      line("quantize_fp8_block (128x128, BF16)", bytes, now() - t0, tm);
    }
  }
  return 0;
}
