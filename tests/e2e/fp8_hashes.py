#!/usr/bin/env python3
"""Compares a qwen-fp8 checkpoint's FP8 tensors with SHA-256s of transformers' own quantization.

    fp8_hashes.py CHECKPOINT_DIR REFERENCE.json

REFERENCE maps a weight name to the SHA-256 of transformers' e4m3 codes, and NAME_scale_inv to
that of its F32 weight_scale_inv (models/tiny/train.py writes it). Every F8_E4M3 tensor of the
checkpoint and its scale (which must be F32) are hashed straight from the files' bytes, with no
library: 8-byte header length, JSON header, data. Prints one JSON object: compared, equal,
mismatched, unreferenced (tensors the reference lacks), bad_scales (scales not F32).
"""
import hashlib
import json
import os
import struct
import sys


def tensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            yield name, info["dtype"], f.read(end - begin)


def main():
    ckpt, ref_path = sys.argv[1], sys.argv[2]
    with open(ref_path) as f:
        ref = json.load(f)
    found = {}
    for name in sorted(os.listdir(ckpt)):
        if name.endswith(".safetensors"):
            for t, dtype, data in tensors(os.path.join(ckpt, name)):
                found[t] = (dtype, data)
    out = {"compared": 0, "equal": 0, "mismatched": [], "unreferenced": [], "bad_scales": []}
    for name, (dtype, data) in sorted(found.items()):
        if dtype != "F8_E4M3":
            continue
        scale = name + "_scale_inv"
        if name not in ref or scale not in ref:
            out["unreferenced"].append(name)
            continue
        sdtype, sdata = found.get(scale, (None, b""))
        if sdtype != "F32":
            out["bad_scales"].append(scale)
            continue
        for key, blob in ((name, data), (scale, sdata)):
            out["compared"] += 1
            if hashlib.sha256(blob).hexdigest() == ref[key]:
                out["equal"] += 1
            else:
                out["mismatched"].append(key)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
