// The CudaOptions checks that hold in every build, with or without CUDA.
#include <string>

#include "qf/error.h"
#include "qf/rt/cuda_engine.h"

namespace qf::rt {

void check_cuda_options(const CudaOptions& o) {
  if (o.max_context < 1 || o.max_context > kMaxCudaContext) {
    throw Error(Errc::kUsage, "a KV cache of " + std::to_string(o.max_context) +
                                  " positions: the CUDA engine takes 1 to " +
                                  std::to_string(kMaxCudaContext) +
                                  " (generate: the prompt and --max-tokens; serve: "
                                  "--max-model-len)");
  }
}

}  // namespace qf::rt
