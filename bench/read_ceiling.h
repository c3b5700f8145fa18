// The read ceiling of one launch (read_ceiling.cu): a kernel that only streams bytes.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace qf::bench {

struct ReadShape {
  int per_sm;  // blocks of 256 threads per SM (fewer if the bytes do not fill them)
  int loads;   // 16-byte loads in flight per thread: 4 or 8
  // Waits for the previous launch (griddepcontrol.wait) before its first load, as a launch
  // whose addresses the previous one writes must (the routed gate | up reads its expert ids);
  // false: every load before the wait, overlapping the previous launch's tail.
  bool wait_first = false;
};

// One launch reading `bytes` (a multiple of 16, 16-byte aligned) from `data`; `sink` (one
// unsigned) is written only if the XOR of all words hits a fixed value, which keeps the loads.
cudaError_t read_launch(const ReadShape& s, const void* data, size_t bytes, unsigned* sink,
                        cudaStream_t stream);

}  // namespace qf::bench
