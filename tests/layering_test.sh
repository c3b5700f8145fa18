#!/usr/bin/env bash
# House rule: no CUDA header outside kernels/ and runtime/ (host libraries and tools must build
# and run without CUDA). Fails listing the offending files.
set -u
root=${1:?usage: layering_test.sh SOURCE_DIR}
bad=$(grep -rlE '#include *[<"](cuda|cublas|cuda_runtime|cuda_fp16|cuda_bf16|curand|nvrtc)[^>"]*[>"]' \
        "$root/libckpt" "$root/libquant" "$root/tools" 2>/dev/null)
if [ -n "$bad" ]; then
  echo "CUDA headers outside kernels/ and runtime/:"
  echo "$bad"
  exit 1
fi
echo "layering OK"
