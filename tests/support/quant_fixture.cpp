#include "quant_fixture.h"

#include "qf/quant/synth.h"

namespace qf::test {

void synth_tiny_sources(const std::filesystem::path& dir) {
  quant::synth_checkpoint(ckpt::qwen35_preset("tiny"), dir / "bf16", {});
  for (auto layout : {ckpt::Qwen35Layout::kIntelInt4, ckpt::Qwen35Layout::kQwenFp8}) {
    quant::SynthOptions o;
    o.layout = layout;
    o.shards = 2;
    quant::synth_from_checkpoint(dir / "bf16", dir / std::string(ckpt::layout_name(layout)), o);
  }
}

}  // namespace qf::test
