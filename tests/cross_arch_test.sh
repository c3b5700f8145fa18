#!/usr/bin/env bash
# The x86-64 and the aarch64 builds turn the same inputs into the same bytes. On every engine
# fixture: INT4 and FP8 checkpoints (synth --from), the hybrid with its INT8 LM head where the
# vocabulary allows it (build-hybrid, quantize-lm-head), and the CPU engine's logits and MTP
# logits on the model and on each of the three. `make aarch64` runs it after the aarch64 tests.
# Usage: cross_arch_test.sh QFORGE_X86 QFORGE_AARCH64 FIXTURES_DIR
# (QFORGE_AARCH64 may be a script that runs the binary under qemu-user.)
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 QFORGE_X86 QFORGE_AARCH64 FIXTURES_DIR" >&2; exit 2; }
x86=$1 arm=$2 fixtures=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Runs a command quietly; on failure, says which and shows its output.
run() {
  "$@" >"$work/log" 2>&1 || { echo "cross-arch: failed: $*" >&2; cat "$work/log" >&2; exit 1; }
}

tokens=$(seq -s, 3 7 340)  # 49 ids, inside every fixture's vocabulary
fail=0
for model in "$fixtures"/*/model; do
  fx=$(basename "$(dirname "$model")")
  vocab=$(grep -o '"vocab_size": *[0-9]*' "$model/config.json" | head -1 | grep -o '[0-9]*$')
  for arch in x86 arm; do
    q=${!arch} d=$work/$fx-$arch
    run "$q" synth "$d/int4" --from "$model" --layout intel-int4 --no-vision
    run "$q" synth "$d/fp8" --from "$model" --layout qwen-fp8 --no-vision
    run "$q" build-hybrid --int4 "$d/int4" --fp8 "$d/fp8" --out "$d/hybrid" --no-check
    if [ $((vocab % 4)) = 0 ]; then  # GPTQ 8-bit packs rows by 4
      run "$q" quantize-lm-head "$d/hybrid" --in-place
    fi
    for m in int4 fp8 hybrid; do
      run "$q" logits --model "$d/$m" --tokens "$tokens" --mtp --out "$d/logits-$m.safetensors"
    done
    run "$q" logits --model "$model" --tokens "$tokens" --mtp --out "$d/logits-model.safetensors"
  done
  for what in int4 fp8 hybrid logits-model.safetensors logits-int4.safetensors \
              logits-fp8.safetensors logits-hybrid.safetensors; do
    if diff -r "$work/$fx-x86/$what" "$work/$fx-arm/$what" >/dev/null; then
      echo "$fx $what: identical"
    else
      echo "$fx $what: DIFFERS between x86-64 and aarch64"
      fail=1
    fi
  done
done
[ "$fail" = 0 ] && echo "cross-arch: every output identical"
exit "$fail"
