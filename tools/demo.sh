#!/usr/bin/env bash
# `make demo`: the main job on the embedded example model, models/tiny: a small Qwen3.5-MoE with
# an MTP head, trained on Python sources (models/tiny/train.py). Its BF16 weights are quantized
# into the two released source layouts (Intel's INT4 by AutoRound's RTN, Qwen's FP8 by
# transformers' block-128 quantizer; both byte for byte, see the tests), the Spark recipe's steps
# turn them into the deployable hybrid (FP8 shared experts, MTP listed, INT8 LM head, validated
# with checksums), every stage is scored on held-out text, and the hybrid writes some Python.
# Usage: tools/demo.sh QFORGE_BINARY WORK_DIR [RECIPE_DIR]
set -euo pipefail
qforge=${1:?usage: demo.sh QFORGE_BINARY WORK_DIR [RECIPE_DIR]}
work=${2:?usage: demo.sh QFORGE_BINARY WORK_DIR [RECIPE_DIR]}
recipes=${3:-"$(dirname "$0")/../recipes"}
tiny=$(realpath --relative-to="$PWD" "$(dirname "$0")/../models/tiny")
rm -rf "$work"
mkdir -p "$work"
run() {
  echo "== qforge $*"
  "$qforge" "$@"
  echo
}

# The two sources the public recipe starts from, made from the trained BF16 model.
run synth "$work/int4" --from "$tiny/model" --layout intel-int4 --no-vision --shards 2
run synth "$work/fp8" --from "$tiny/model" --layout qwen-fp8 --no-vision --fp8-scale-dtype f32
run inspect "$work/int4"

# The Spark recipe, step by step...
run build-hybrid --int4 "$work/int4" --fp8 "$work/fp8" --out "$work/hybrid"
run add-mtp --source "$work/fp8" --target "$work/hybrid"
run quantize-lm-head "$work/hybrid" --out "$work/hybrid-int8"
run validate "$work/hybrid-int8" --checksums
# ...and in one command.
run recipe run "$recipes/qwen3.5-122b-a10b-spark.json" --any-size \
  --int4 "$work/int4" --fp8 "$work/fp8" --out "$work/recipe"

# Quality at every stage: perplexity on held-out Python (stdlib files the model never saw) and
# the MTP head's top-1 accuracy (it predicts the token after next; chance is 1 in 8192).
run eval-ppl --text "$tiny/heldout.txt" --max-tokens 4096 --model "$tiny/model" \
  --model "$work/int4" --model "$work/hybrid" --model "$work/hybrid-int8"

# The deployable checkpoint writes code: on the GPU when there is one, else on the CPU.
device=cpu
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then device=cuda; fi
prompt=$'import os\n\n\ndef read_config(path):\n    """Read a JSON config file and return it as a dict."""\n'
run generate --model "$work/hybrid-int8" --prompt "$prompt" --max-tokens 96 --temperature 1 --seed 1 \
  --device "$device"
echo "demo: OK (checkpoints in $work)"
