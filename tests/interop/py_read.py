#!/usr/bin/env python3
"""Checks that the official `safetensors` package reads a qforge-written file bit-exactly.

Usage: py_read.py FILE EXPECTED_JSON
EXPECTED_JSON: {"metadata": {...} | null, "tensors": {name: {"dtype", "shape", "hex"}}}
Exits 0 when every tensor matches in dtype, shape and bytes (through the raw `deserialize`
API for every dtype, and through `safe_open(framework="np")` for the dtypes numpy has),
1 with a list of mismatches otherwise.
"""
import json
import sys

import numpy as np
from safetensors import deserialize, safe_open

NUMPY_DTYPES = {"F64", "F32", "F16", "I64", "U64", "I32", "U32", "I16", "U16", "I8", "U8",
                "BOOL", "C64"}


def main():
    path, expected_path = sys.argv[1], sys.argv[2]
    expected = json.load(open(expected_path))
    want = expected["tensors"]
    errors = []

    raw = open(path, "rb").read()
    got = {name: info for name, info in deserialize(raw)}
    if set(got) != set(want):
        errors.append(f"names differ: missing {sorted(set(want) - set(got))}, "
                      f"extra {sorted(set(got) - set(want))}")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        if g["dtype"] != w["dtype"]:
            errors.append(f"{name}: dtype {g['dtype']} != {w['dtype']}")
        if list(g["shape"]) != w["shape"]:
            errors.append(f"{name}: shape {g['shape']} != {w['shape']}")
        if bytes(g["data"]) != bytes.fromhex(w["hex"]):
            errors.append(f"{name}: bytes differ")

    with safe_open(path, framework="np") as f:
        if f.metadata() != expected["metadata"]:
            errors.append(f"metadata {f.metadata()} != {expected['metadata']}")
        for name, w in want.items():
            if w["dtype"] not in NUMPY_DTYPES:
                continue
            arr = f.get_tensor(name)
            if list(arr.shape) != w["shape"] or arr.tobytes() != bytes.fromhex(w["hex"]):
                errors.append(f"{name}: numpy view differs")

    for e in errors:
        print("mismatch:", e)
    print(f"checked {len(want)} tensors: {'OK' if not errors else 'FAILED'}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
