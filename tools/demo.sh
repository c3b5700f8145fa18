#!/usr/bin/env bash
# `make demo`: the main job on the embedded example model. For now (milestone M1): synthesize a
# tiny Qwen3.5-MoE checkpoint in each released layout, sharded with an index (and the MTP
# sidecar for intel-int4), then inspect and validate each, with checksums.
# Usage: tools/demo.sh QFORGE_BINARY WORK_DIR
set -euo pipefail
qforge=${1:?usage: demo.sh QFORGE_BINARY WORK_DIR}
work=${2:?usage: demo.sh QFORGE_BINARY WORK_DIR}
mkdir -p "$work"

for layout in bf16 intel-int4 qwen-fp8; do
  dir="$work/tiny-$layout"
  echo "== qforge synth $dir --preset tiny --layout $layout --shards 2"
  "$qforge" synth "$dir" --preset tiny --layout "$layout" --shards 2 --force
  echo "== qforge inspect $dir"
  "$qforge" inspect "$dir"
  rm -f "$dir/qforge-manifest.json"
  echo "== qforge validate $dir --checksums   (writes the manifest)"
  "$qforge" validate "$dir" --checksums
  echo "== qforge validate $dir --checksums   (verifies it)"
  "$qforge" validate "$dir" --checksums
  echo
done
echo "demo: OK (checkpoints in $work)"
