// quantize-lm-head against outside references (tests/golden/make_goldens.py): INT8 (part
// int8_lm_head), the codes and F16 scales torch computes from the spec, and the GPTQ 8-bit
// triplet AutoRound's own packer (qlinear_torch_zp, bits 8, group -1) writes for them; INT4
// (part int4_lm_head), the triplet AutoRound's own export writes with quant_lm_head.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "qf/ckpt/checkpoint.h"
#include "qf/ckpt/file_io.h"
#include "qf/ckpt/index.h"
#include "qf/ckpt/writer.h"
#include "qf/quant/formats.h"
#include "qf/quant/lm_head.h"
#include "test_support.h"

namespace qf::quant {
namespace {

namespace fs = std::filesystem;
using ckpt::DType;

const std::string kGolden = std::string(QF_GOLDEN_DIR) + "/int8_lm_head.safetensors";
const std::string kGoldenInt4 = std::string(QF_GOLDEN_DIR) + "/int4_lm_head.safetensors";

// A two-shard AutoRound-style checkpoint holding the golden LM head (shard 1, beside a norm)
// and one more tensor (shard 2).
void write_input(const fs::path& dir, const ckpt::SafetensorsFile& g) {
  fs::create_directories(dir);
  const auto head = g.view("lm_head.weight");
  const std::string norm = qf::test::pattern_bytes(512, 1),
                    other = qf::test::pattern_bytes(1024, 2);
  auto write = [&](const std::string& file, std::vector<ckpt::TensorSpec> specs,
                   std::vector<std::span<const std::byte>> data) {
    ckpt::SafetensorsWriter w(dir / file,
                              ckpt::plan_safetensors(specs, ckpt::Metadata{{"format", "pt"}}), {});
    for (const ckpt::TensorInfo& t : w.plan().layout) {
      for (size_t i = 0; i < specs.size(); ++i) {
        if (specs[i].name == t.name) w.write(data[i]);
      }
    }
    w.commit();
  };
  auto bytes = [](const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); };
  write("model-00001-of-00002.safetensors",
        {{"lm_head.weight", DType::kBF16, head.info->shape},
         {"model.norm.weight", DType::kBF16, {256}}},
        {head.bytes, bytes(norm)});
  write("model-00002-of-00002.safetensors", {{"model.other", DType::kI32, {256}}}, {bytes(other)});
  ckpt::ShardIndex index;
  index.weight_map = {{"lm_head.weight", "model-00001-of-00002.safetensors"},
                      {"model.norm.weight", "model-00001-of-00002.safetensors"},
                      {"model.other", "model-00002-of-00002.safetensors"}};
  index.sort();
  index.total_size = head.bytes.size() + 512 + 1024;
  qf::test::write_file(dir / ckpt::kIndexFileName, ckpt::serialize_index(index));
  const nlohmann::json q = {{"quant_method", "auto-round"},
                            {"bits", 4},
                            {"group_size", 128},
                            {"sym", true},
                            {"packing_format", "auto_round:auto_gptq"}};
  qf::test::write_file(dir / "config.json",
                       nlohmann::json({{"model_type", "test"}, {"quantization_config", q}}).dump());
  qf::test::write_file(dir / "quantization_config.json", q.dump());
  qf::test::write_file(dir / "tokenizer.json", "{}");
}

std::string bytes_of(const ckpt::Checkpoint& c, const std::string& name) {
  const auto v = c.view(name).bytes;
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}
std::string bytes_of(const ckpt::SafetensorsFile& f, const std::string& name) {
  const auto v = f.view(name).bytes;
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// The triplet in `c` equals the golden file's, name, shape, dtype and bytes.
void expect_triplet(const ckpt::Checkpoint& c, const ckpt::SafetensorsFile& g, const char* whose) {
  EXPECT_EQ(c.find("lm_head.weight"), nullptr);
  for (const char* n : {"lm_head.qweight", "lm_head.qzeros", "lm_head.scales"}) {
    ASSERT_NE(c.find(n), nullptr) << n;
    EXPECT_EQ(c.find(n)->info->shape, g.find(n)->shape) << n;
    EXPECT_EQ(c.find(n)->info->dtype, g.find(n)->dtype) << n;
    EXPECT_TRUE(bytes_of(c, n) == bytes_of(g, n)) << n << " differs from " << whose;
  }
  ASSERT_TRUE(c.index());
  EXPECT_EQ(*c.index()->total_size, c.tensor_bytes());
}

// The report's weight error against the golden BF16 head [512, 256] and deq(n, k), the
// reference's dequantized weights, in double.
template <class Deq>
void expect_weight_error(const LmHeadReport& r, const ckpt::SafetensorsFile& g, Deq deq) {
  const auto w = g.view("lm_head.weight").as<uint16_t>();
  double max_err = 0, sum_err = 0, min_cos = 1;
  for (int64_t n = 0; n < 512; ++n) {
    double dot = 0, ww = 0, dd = 0;
    for (int64_t k = 0; k < 256; ++k) {
      const double ref = bf16_to_f32(w[n * 256 + k]), d = deq(n, k);
      max_err = std::max(max_err, std::fabs(d - ref));
      sum_err += std::fabs(d - ref);
      dot += ref * d, ww += ref * ref, dd += d * d;
    }
    const double cos =
        ww == 0 && dd == 0 ? 1.0 : (ww == 0 || dd == 0 ? 0.0 : dot / std::sqrt(ww * dd));
    min_cos = std::min(min_cos, cos);
  }
  EXPECT_EQ(r.max_abs_error, max_err);
  EXPECT_NEAR(r.mean_abs_error, sum_err / (512 * 256), 1e-12);
  EXPECT_NEAR(r.min_row_cosine, min_cos, 1e-9);
}

// The INC entry in both config files, the report's format in config.json.
void expect_configs(const fs::path& out, const nlohmann::json& want, const std::string& format) {
  const auto cfg = nlohmann::json::parse(qf::test::read_file(out / "config.json"));
  EXPECT_EQ(cfg["quantization_config"]["extra_config"]["lm_head"], want);
  EXPECT_EQ(cfg["qforge"]["lm_head"]["format"], format);
  const auto qcfg = nlohmann::json::parse(qf::test::read_file(out / "quantization_config.json"));
  EXPECT_EQ(qcfg["extra_config"]["lm_head"], want);
}

TEST(GoldenLmHead, TripletEqualsAutoRoundsPackerByteForByte) {
  const ckpt::SafetensorsFile g = ckpt::SafetensorsFile::open(kGolden);
  qf::test::TempDir tmp;
  write_input(tmp / "in", g);
  LmHeadOptions o;
  o.out = tmp / "out";
  const LmHeadReport r = quantize_lm_head(tmp / "in", o);
  EXPECT_EQ(r.rows, 512);
  EXPECT_EQ(r.cols, 256);
  EXPECT_EQ(r.shard, "model-00001-of-00002.safetensors");

  const ckpt::Checkpoint c = ckpt::Checkpoint::open(tmp / "out");
  expect_triplet(c, g, "AutoRound's packing");
  // And the packed codes are torch's codes (the layout contract in formats.h).
  const auto qw = c.view("lm_head.qweight").as<uint32_t>();
  const auto q = g.view("q").as<int8_t>();
  int bad = 0;
  for (int64_t n = 0; n < 512; ++n) {
    for (int64_t k = 0; k < 256; ++k) {
      bad += static_cast<int32_t>(int8_code(qw.data(), 512, k, n)) - 128 != q[n * 256 + k];
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(bytes_of(c, "model.norm.weight"), qf::test::pattern_bytes(512, 1));
  EXPECT_EQ(bytes_of(c, "model.other"), qf::test::pattern_bytes(1024, 2));
  EXPECT_EQ(qf::test::read_file(tmp / "out" / "model-00002-of-00002.safetensors"),
            qf::test::read_file(tmp / "in" / "model-00002-of-00002.safetensors"));
  EXPECT_EQ(qf::test::read_file(tmp / "out" / "tokenizer.json"), "{}");

  // The weight error, from torch's codes and scales.
  const auto s = g.view("scales_f16").as<uint16_t>();
  expect_weight_error(r, g, [&](int64_t n, int64_t k) {
    return static_cast<double>(q[n * 256 + k]) * f16_to_f32(s[n]);
  });
  EXPECT_GT(r.mean_row_cosine, 0.999);
  EXPECT_EQ(r.samples, 16);
  EXPECT_GE(r.top1_agreement, 0.9);
  expect_configs(tmp / "out",
                 {{"bits", 8}, {"group_size", -1}, {"sym", true}, {"data_type", "int"}},
                 "gptq-int8");
}

TEST(GoldenLmHead, Int4TripletEqualsAutoRoundsQuantLmHeadExport) {
  const ckpt::SafetensorsFile g = ckpt::SafetensorsFile::open(kGoldenInt4);
  qf::test::TempDir tmp;
  write_input(tmp / "in", g);
  LmHeadOptions o;
  o.out = tmp / "out";
  o.bits = 4;
  const LmHeadReport r = quantize_lm_head(tmp / "in", o);
  EXPECT_EQ(r.bits, 4);
  EXPECT_EQ(r.group, 128);
  EXPECT_EQ(r.bytes_after, 512u * 256 / 2 + 2 * 512 / 2 + 2 * 512 * 2);
  expect_triplet(ckpt::Checkpoint::open(tmp / "out"), g, "AutoRound's export");

  // The weight error, from AutoRound's triplet dequantized.
  const auto qw = g.view("lm_head.qweight").as<uint32_t>();
  const auto qz = g.view("lm_head.qzeros").as<uint32_t>();
  const auto sc = g.view("lm_head.scales").as<uint16_t>();
  expect_weight_error(r, g, [&](int64_t n, int64_t k) {
    return (static_cast<double>(int4_code(qw.data(), 512, k, n)) -
            int4_zero(qz.data(), 512, k / 128, n, ZeroPoint::kV1StoredMinusOne)) *
           f16_to_f32(sc[(k / 128) * 512 + n]);
  });
  expect_configs(tmp / "out",
                 {{"bits", 4}, {"group_size", 128}, {"sym", true}, {"data_type", "int"}},
                 "gptq-int4");
  const auto cfg = nlohmann::json::parse(qf::test::read_file(tmp / "out" / "config.json"));
  EXPECT_EQ(cfg["qforge"]["lm_head"]["zero_point"], "v1 (qzeros 0x77777777)");
}

}  // namespace
}  // namespace qf::quant
