#!/usr/bin/env python3
"""The baseline for `qforge build-hybrid`: what the public builder does, in plain Python
(checkpoint-formats.md §4.2), with safetensors' load_file/save_file per shard.

    hybrid_baseline.py INT4_DIR FP8_DIR OUT_DIR

1. From the FP8 index, every name without ".experts." is a candidate.
2. Copy every non-.safetensors file of the INT4 directory to OUT_DIR.
3. For each INT4 shard (model-*-of-*.safetensors; the MTP sidecar is never read): load it
   whole, replace each tensor whose name the FP8 candidates hold (same shape) by the FP8
   tensor, add its weight_scale_inv beside it, save the whole shard.
4. Rebuild the index from the output shards (total_size = sum of tensor bytes).
Needs torch (BF16) and safetensors.
"""
import glob
import json
import os
import shutil
import sys

from safetensors import safe_open
from safetensors.torch import load_file, save_file


def main():
    int4, fp8, out = sys.argv[1:4]
    os.makedirs(out)
    fp8_map = json.load(open(os.path.join(fp8, "model.safetensors.index.json")))["weight_map"]
    wanted = {k: v for k, v in fp8_map.items() if ".experts." not in k}
    handles = {}

    def fp8_tensor(name):
        f = wanted[name]
        if f not in handles:
            handles[f] = safe_open(os.path.join(fp8, f), framework="pt")
        return handles[f].get_tensor(name)

    for f in os.listdir(int4):
        if not f.endswith(".safetensors"):
            shutil.copy(os.path.join(int4, f), os.path.join(out, f))
    replaced = 0
    for path in sorted(glob.glob(os.path.join(int4, "model-*-of-*.safetensors"))):
        tensors = load_file(path)
        for name in list(tensors):
            if name in wanted:
                new = fp8_tensor(name)
                if new.shape != tensors[name].shape:
                    sys.exit(f"shape mismatch for {name}")
                tensors[name] = new
                scale = name[: -len(".weight")] + ".weight_scale_inv" if name.endswith(".weight") else None
                if scale and scale in wanted:
                    tensors[scale] = fp8_tensor(scale)
                replaced += 1
        save_file(tensors, os.path.join(out, os.path.basename(path)), metadata={"format": "pt"})
        del tensors
    weight_map, total = {}, 0
    for path in sorted(glob.glob(os.path.join(out, "model-*-of-*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                weight_map[name] = os.path.basename(path)
                sl = f.get_slice(name)
                n = 1
                for d in sl.get_shape():
                    n *= d
                total += n * {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "F8_E4M3": 1}[sl.get_dtype()]
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                  f, indent=2)
    print(f"replaced {replaced} tensors", file=sys.stderr)


if __name__ == "__main__":
    main()
