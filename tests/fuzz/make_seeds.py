#!/usr/bin/env python3
"""Writes the fuzz seed corpus (tests/fuzz/seeds/) with the official safetensors package.

Usage: python3 tests/fuzz/make_seeds.py tests/fuzz/seeds/header
Small valid files covering metadata, several dtypes, empty and 0-dim tensors, sub-byte F4.
"""
import os
import sys

import numpy as np
from safetensors import TensorSpec, serialize


def spec(dtype, shape, data):
    buf = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, np.uint8)
    return buf, TensorSpec(dtype=dtype, shape=shape, data_ptr=buf.ctypes.data, data_len=len(data))


def write(path, tensors, metadata=None):
    keep, specs = [], {}
    for name, (dtype, shape, data) in tensors.items():
        buf, s = spec(dtype, shape, data)
        keep.append(buf)
        specs[name] = s
    with open(path, "wb") as f:
        f.write(bytes(serialize(specs, metadata=metadata)))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "empty.safetensors"), {})
    write(os.path.join(out, "meta.safetensors"), {"w": ("float32", [2], bytes(8))},
          {"format": "pt", "k\u00e9y": "v\n"})
    write(os.path.join(out, "mixed.safetensors"), {
        "a.qweight": ("int32", [2, 2], bytes(range(16))),
        "a.scales": ("float16", [1, 2], bytes(4)),
        "b.weight": ("float8_e4m3fn", [3], b"\x38\x7e\x80"),
        "b.weight_scale_inv": ("bfloat16", [], b"\x80\x3f"),
        "e": ("bfloat16", [2, 0], b""),
        "f4": ("float4_e2m1fn_x2", [2, 1], b"\x12\x34"),
    }, {"format": "pt"})


if __name__ == "__main__":
    main()
