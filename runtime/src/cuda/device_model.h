// The model's weights on the GPU in the kernels' layouts (qf/kern/gemv.h), built either from a
// loaded checkpoint (repacked on the host one module at a time, so host memory stays bounded by
// the largest module) or synthetically from a config (random codes of the hybrid's formats,
// made on the device: no disk). Internal to the CUDA engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qf/ckpt/qwen35_config.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/gemv.h"
#include "qf/kern/ops.h"
#include "qf/rt/model.h"

namespace qf::rt::cuda {

struct DeviceMoe {
  kern::DeviceLinear router, gate, up, down;  // gate/up/down: stacks of E experts
  kern::DeviceLinear shared_gate, shared_up, shared_down, shared_expert_gate;
};

struct DeviceLayer {
  bool full_attention = false;
  const float *input_norm = nullptr, *post_norm = nullptr;
  kern::DeviceLinear in_qkv, in_z, in_b, in_a, out;  // GDN
  const float *conv = nullptr, *dt_bias = nullptr, *a_log = nullptr, *gdn_norm = nullptr;
  kern::DeviceLinear q, k, v, o;  // attention
  const float *q_norm = nullptr, *k_norm = nullptr;
  DeviceMoe moe;
};

struct DeviceModel {
  ckpt::Qwen35Config config;
  kern::FloatKind embed_kind = kern::FloatKind::kBf16;
  const void* embed = nullptr;
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;
  kern::DeviceLinear lm_head;
  uint64_t device_bytes = 0;  // everything allocated
  double load_seconds = 0;
  uint64_t host_bytes_read = 0;  // from the checkpoint's files

  std::vector<kern::DeviceBuffer<uint8_t>> arena;  // owns every allocation above
  void* alloc(size_t bytes);
};

// Throws Error(kUnsupported) for an expert stack that mixes formats, kIo when the GPU is out of
// memory (naming how much was needed).
std::unique_ptr<DeviceModel> upload_model(const Model& model);
// Random weights of `config`'s shapes in the hybrid's formats: INT4 (group 128) for every
// decoder linear module, FP8 block-128 shared experts, BF16 router / shared-expert gate /
// embeddings, INT8 LM head; norms near 0, gates in range.
std::unique_ptr<DeviceModel> synthetic_model(const ckpt::Qwen35Config& config, uint64_t seed);

}  // namespace qf::rt::cuda
