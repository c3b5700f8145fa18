#!/usr/bin/env bash
# `make demo`: the main job on the embedded example model (the tiny preset). One BF16 model is
# quantized into the two released sources (Intel's INT4, Qwen's FP8), which the 122B Spark
# recipe turns into the deployable hybrid (FP8 shared experts, MTP listed, INT8 LM head,
# validated with checksums); then the steps one by one, and the result back to BF16.
# Usage: tools/demo.sh QFORGE_BINARY WORK_DIR [RECIPE_DIR]
set -euo pipefail
qforge=${1:?usage: demo.sh QFORGE_BINARY WORK_DIR [RECIPE_DIR]}
work=${2:?usage: demo.sh QFORGE_BINARY WORK_DIR [RECIPE_DIR]}
recipes=${3:-"$(dirname "$0")/../recipes"}
fixture="$(dirname "$0")/../tests/golden/data/models/r1-hd64-e4k2/model"
rm -rf "$work"
mkdir -p "$work"
run() {
  echo "== qforge $*"
  "$qforge" "$@"
  echo
}

run synth "$work/bf16" --preset tiny --layout bf16
run synth "$work/int4" --from "$work/bf16" --layout intel-int4 --shards 2
run synth "$work/fp8" --from "$work/bf16" --layout qwen-fp8 --shards 2
run inspect "$work/int4"

run recipe run "$recipes/qwen3.5-122b-a10b-spark.json" --any-size \
  --int4 "$work/int4" --fp8 "$work/fp8" --out "$work/hybrid"

# The same, step by step.
run build-hybrid --int4 "$work/int4" --fp8 "$work/fp8" --out "$work/steps"
run add-mtp --source "$work/int4" --target "$work/steps"
run quantize-lm-head "$work/steps" --in-place
run validate "$work/steps" --checksums
run inspect "$work/steps"

run dequantize "$work/hybrid" --out "$work/hybrid-bf16"
run validate "$work/hybrid-bf16" --checksums

# The CPU reference engine reads the hybrid as it is (INT4, FP8 shared experts, INT8 head, MTP)...
run logits --model "$work/hybrid" --tokens 1,2,3,4,5,6,7,8 --mtp --out "$work/logits.safetensors"
# ...and generates with a tiny transformers-made fixture that has a tokenizer (random weights:
# the text is gibberish, but every token went through the real forward pass and chat template).
run generate --model "$fixture" --chat "What is a mixture of experts?" --max-tokens 32 --seed 1
echo "demo: OK (checkpoints in $work)"
