// The model's weights on the GPU in the kernels' layouts (qf/kern/gemv.h), built either from a
// loaded checkpoint (repacked on the host in row chunks of at most 32 MiB into two pinned staging
// buffers, each copied while the next is filled; the file's pages leave the page cache after each
// layer) or synthetically from a config (random codes of the hybrid's formats, made on the
// device: no disk). Internal to the CUDA engine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qf/ckpt/qwen35_config.h"
#include "qf/kern/device_buffer.h"
#include "qf/kern/gemv.h"
#include "qf/kern/ops.h"
#include "qf/rt/cuda_engine.h"
#include "qf/rt/model.h"

namespace qf::rt::cuda {

// Products that read the same input, written to consecutive outputs: one launch over their
// concatenated rows when their formats allow it (`fused`), else one launch per part. A stack of
// experts groups the same way per expert (gate rows, then up rows).
struct RowGroup {
  kern::DeviceLinear fused;               // fused.n == 0: not fused
  std::vector<kern::DeviceLinear> parts;  // the parts, used when not fused
  std::vector<int> offsets;               // each part's first output row
  // fused holds a gate | up pair in gemv.h's paired row order (tiles of 8 gate rows, then their
  // 8 up rows): the product runs as kern::gemv_swiglu, straight to silu(gate) * up.
  bool swiglu_pairs = false;
  int rows() const { return offsets.empty() ? 0 : offsets.back() + parts.back().n; }
};

struct DeviceMoe {
  RowGroup router;          // router [E] | shared_expert_gate [1]
  RowGroup gate_up;         // a stack of E experts: gate [I] | up [I]
  kern::DeviceLinear down;  // a stack of E experts
  RowGroup shared_gate_up;  // gate [Is] | up [Is]
  kern::DeviceLinear shared_down;
};

struct DeviceLayer {
  bool full_attention = false;
  const float *input_norm = nullptr, *post_norm = nullptr;
  RowGroup gdn_in;  // in_proj_qkv | in_proj_z | in_proj_b | in_proj_a
  kern::DeviceLinear out;
  const float *conv = nullptr, *dt_bias = nullptr, *a_log = nullptr, *gdn_norm = nullptr;
  RowGroup qkv;  // q_proj | k_proj | v_proj
  kern::DeviceLinear o;
  const float *q_norm = nullptr, *k_norm = nullptr;
  DeviceMoe moe;
};

// The MTP head (Model::mtp()): [norm(embedding) | norm(hidden)] -> fc -> one full-attention layer
// with its MoE -> norm -> the main model's LM head.
struct DeviceMtp {
  kern::DeviceLinear fc;  // [H, 2H]
  const float *pre_fc_norm_embedding = nullptr, *pre_fc_norm_hidden = nullptr, *norm = nullptr;
  DeviceLayer layer;
};

struct DeviceModel {
  ckpt::Qwen35Config config;
  kern::FloatKind embed_kind = kern::FloatKind::kBf16;
  const void* embed = nullptr;
  std::vector<DeviceLayer> layers;
  const float* final_norm = nullptr;
  kern::DeviceLinear lm_head;
  std::optional<DeviceMtp> mtp;  // where the checkpoint has one
  uint64_t device_bytes = 0;     // everything allocated
  double load_seconds = 0;
  uint64_t host_bytes_read = 0;  // from the checkpoint's files

  std::vector<kern::DeviceBuffer<uint8_t>> arena;  // owns every allocation above
  void* alloc(size_t bytes);
};

// Throws Error(kUnsupported) for an expert stack that mixes formats, kIo when the GPU is out of
// memory (naming how much was needed).
// swiglu_pairs: gate | up pairs (routed experts) in the paired row order where
// kern::gemv_swiglu_shape_ok allows it (RowGroup::swiglu_pairs says where it did). mtp: the MTP
// head too, where the checkpoint has one.
std::unique_ptr<DeviceModel> upload_model(const Model& model, bool swiglu_pairs, bool mtp);
// Random weights of `config`'s shapes in `format` (SyntheticFormat: the hybrid's INT4 (group 128)
// decoder linear modules, FP8 block-128 shared experts and INT8 LM head; Intel's INT4 release
// with BF16 shared experts and LM head; or all BF16), BF16 router / shared-expert gate /
// embeddings in each; norms near 0, gates in range. mtp: an MTP head too, BF16 but for its
// shared expert, which is the format's (the 122B hybrid's: FP8).
std::unique_ptr<DeviceModel> synthetic_model(const ckpt::Qwen35Config& config, uint64_t seed,
                                             bool swiglu_pairs, bool mtp, SyntheticFormat format);

}  // namespace qf::rt::cuda
