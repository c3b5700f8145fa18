// decode_to_f32 on the GPU against its CPU twin: every code of every format, bit for bit,
// at awkward offsets and lengths. Skips (and says why) where no CUDA device is present.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpu_test.h"
#include "qf/kern/decode.h"
#include "qf/kern/device_buffer.h"

namespace qf::kern {
namespace {

void check_all_codes(CodeFormat fmt, size_t code_bytes) {
  QF_REQUIRE_GPU();
  const size_t n_codes = size_t{1} << (8 * code_bytes);
  std::vector<uint8_t> codes(n_codes * code_bytes);
  for (size_t i = 0; i < n_codes; ++i) std::memcpy(&codes[i * code_bytes], &i, code_bytes);
  std::vector<float> want(n_codes);
  decode_to_f32_ref(fmt, codes.data(), n_codes, want.data());

  DeviceBuffer<uint8_t> d_codes(codes.size());
  DeviceBuffer<float> d_out(n_codes);
  QF_CUDA_CHECK(cudaMemcpy(d_codes.data(), codes.data(), codes.size(), cudaMemcpyHostToDevice));
  for (size_t first : {size_t{0}, size_t{1}, size_t{3}, size_t{33}}) {
    for (size_t n : {size_t{1}, size_t{3}, size_t{31}, size_t{129}, n_codes - first}) {
      if (first + n > n_codes) continue;
      QF_CUDA_CHECK(cudaMemset(d_out.data(), 0xFF, d_out.bytes()));
      QF_CUDA_CHECK(
          decode_to_f32(fmt, d_codes.data() + first * code_bytes, n, d_out.data(), nullptr));
      std::vector<float> got(n);
      QF_CUDA_CHECK(
          cudaMemcpy(got.data(), d_out.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
      EXPECT_EQ(std::memcmp(got.data(), want.data() + first, n * sizeof(float)), 0)
          << "first " << first << " n " << n;
    }
  }
}

TEST(DecodeKernel, Bf16AllCodes) {
  check_all_codes(CodeFormat::kBf16, 2);
}
TEST(DecodeKernel, F16AllCodes) {
  check_all_codes(CodeFormat::kF16, 2);
}
TEST(DecodeKernel, E4M3fnAllCodes) {
  check_all_codes(CodeFormat::kE4M3fn, 1);
}
TEST(DecodeKernel, E5M2AllCodes) {
  check_all_codes(CodeFormat::kE5M2, 1);
}

}  // namespace
}  // namespace qf::kern
