#!/usr/bin/env python3
"""Writes safetensors files with the official `safetensors` package, for qforge to read back.

Usage: py_write.py OUTDIR

Writes into OUTDIR:
  all_dtypes.safetensors   every dtype the binding can write, incl. empty and 0-dim tensors,
                           metadata {"format": "pt"} (single key: byte-identical rewrite test)
  meta.safetensors         several metadata keys with escapes and non-ASCII text
  numpy.safetensors        written through safetensors.numpy.save_file
  index.json               json.dumps(index, indent=2, sort_keys=True) + "\n" (HF's format)
  expected.json            per file: metadata, and per tensor: header dtype, shape, hex bytes
  xxh3.json                XXH3-64 of each file and tensor (python-xxhash), if installed
The header dtype strings below are written from the safetensors spec, independently of the
files, so a reader that mislabels a dtype fails.
"""
import json
import os
import sys

import numpy as np
import safetensors
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file

# binding dtype name -> (header string, bits per element)
DTYPES = {
    "bool": ("BOOL", 8),
    "uint8": ("U8", 8),
    "int8": ("I8", 8),
    "float8_e5m2": ("F8_E5M2", 8),
    "float8_e4m3fn": ("F8_E4M3", 8),
    "float8_e8m0fnu": ("F8_E8M0", 8),
    "float8_e4m3fnuz": ("F8_E4M3FNUZ", 8),
    "float8_e5m2fnuz": ("F8_E5M2FNUZ", 8),
    "int16": ("I16", 16),
    "uint16": ("U16", 16),
    "float16": ("F16", 16),
    "bfloat16": ("BF16", 16),
    "int32": ("I32", 32),
    "uint32": ("U32", 32),
    "float32": ("F32", 32),
    "complex64": ("C64", 64),
    "float64": ("F64", 64),
    "int64": ("I64", 64),
    "uint64": ("U64", 64),
}
SHAPES = [[3, 5], [1], [0], [2, 0, 3], [], [7, 1, 2]]


def write_specs(path, tensors, metadata):
    """tensors: name -> (binding dtype, shape passed to TensorSpec, bytes)."""
    keep = []
    specs = {}
    for name, (dtype, shape, data) in tensors.items():
        buf = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, np.uint8)
        keep.append(buf)
        specs[name] = TensorSpec(dtype=dtype, shape=shape, data_ptr=buf.ctypes.data,
                                 data_len=len(data))
    serialize_file(specs, path, metadata=metadata)


def main():
    out = sys.argv[1]
    rng = np.random.default_rng(1234)
    expected = {}

    tensors, exp = {}, {}
    for dtype, (header, bits) in DTYPES.items():
        for i, shape in enumerate(SHAPES):
            n = int(np.prod(shape, dtype=np.int64)) if shape else 1
            nbytes = n * bits // 8
            data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
            if dtype == "bool":
                data = bytes(b & 1 for b in data)
            name = f"model.layers.{i}.{dtype}.weight"
            tensors[name] = (dtype, shape, data)
            exp[name] = {"dtype": header, "shape": shape, "hex": data.hex()}
    # F4: the binding takes the storage shape (bytes) and doubles the last dimension.
    data = rng.integers(0, 256, 6, dtype=np.uint8).tobytes()
    tensors["fp4.packed"] = ("float4_e2m1fn_x2", [3, 2], data)
    exp["fp4.packed"] = {"dtype": "F4", "shape": [3, 4], "hex": data.hex()}
    write_specs(os.path.join(out, "all_dtypes.safetensors"), tensors, {"format": "pt"})
    expected["all_dtypes.safetensors"] = {"metadata": {"format": "pt"}, "tensors": exp}

    meta = {"format": "pt", "note": "caf\u00e9 \"quoted\"\n\ttab", "\u4e2d": "\U0001F600"}
    data = rng.integers(0, 256, 24, dtype=np.uint8).tobytes()
    write_specs(os.path.join(out, "meta.safetensors"), {"w\u00e9ight": ("float32", [2, 3], data)},
                meta)
    expected["meta.safetensors"] = {
        "metadata": meta,
        "tensors": {"w\u00e9ight": {"dtype": "F32", "shape": [2, 3], "hex": data.hex()}}}

    arrays = {
        "a": rng.standard_normal((4, 6)).astype(np.float32),
        "b": rng.integers(-2**31, 2**31, (5,), dtype=np.int64).astype(np.int32),
        "c": rng.standard_normal((3,)).astype(np.float16),
    }
    save_file(arrays, os.path.join(out, "numpy.safetensors"))
    expected["numpy.safetensors"] = {
        "metadata": None,
        "tensors": {k: {"dtype": {"float32": "F32", "int32": "I32", "float16": "F16"}[str(v.dtype)],
                        "shape": list(v.shape), "hex": v.tobytes().hex()} for k, v in arrays.items()}}

    index = {"metadata": {"total_size": 123456789012},
             "weight_map": {"model.language_model.layers.0.mlp.gate.weight": "model-00001-of-00002.safetensors",
                            "lm_head.weight": "model-00002-of-00002.safetensors",
                            "mtp.fc.weight": "model_extra_tensors.safetensors",
                            "n\u00e4me \"q\" \\ \U0001F600": "model-00001-of-00002.safetensors"}}
    with open(os.path.join(out, "index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")

    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f)

    try:
        import xxhash
    except ImportError:
        return
    hashes = {}
    for fname, spec in expected.items():
        raw = open(os.path.join(out, fname), "rb").read()
        hashes[fname] = {"file": xxhash.xxh3_64_hexdigest(raw),
                         "tensors": {k: xxhash.xxh3_64_hexdigest(bytes.fromhex(t["hex"]))
                                     for k, t in spec["tensors"].items()}}
    with open(os.path.join(out, "xxh3.json"), "w") as f:
        json.dump(hashes, f)


if __name__ == "__main__":
    main()
