#!/usr/bin/env python3
"""Independent reference for `qforge dequantize`, in numpy from the format specs
(checkpoint-formats.md §2 AutoRound GPTQ v1, §3 Qwen FP8 block, §4.5 INT8 GPTQ head, §5).

    dequant_reference.py INPUT_DIR DEQUANTIZED_DIR

For every tensor of DEQUANTIZED_DIR it computes the expected bytes from INPUT_DIR's stored
tensors: a quantized module is reconstructed in float32 (scale * (code - zero) with zero =
stored + 1; e4m3(code) * weight_scale_inv) and rounded to BF16 to nearest even; fused
experts.gate_up_proj / down_proj are stacked per expert (gate rows first); float tensors are
converted (BF16 -> F32 exactly, F32 -> BF16 to nearest even) or copied. It also checks that
every input tensor is used by some output tensor. Prints a JSON summary; exit 0 iff every
tensor matches byte for byte.
"""
import glob
import json
import os
import re
import struct
import sys

import numpy as np

NP = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32, "I32": np.int32,
      "F8_E4M3": np.uint8, "I8": np.int8, "U8": np.uint8, "I64": np.int64}


def read_dir(d):
    """name -> (dtype, shape, raw bytes) over every .safetensors file in d."""
    out = {}
    for path in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        with open(path, "rb") as f:
            blob = f.read()
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            out[name] = (info["dtype"], info["shape"], blob[8 + n + b:8 + n + e])
    return out


def array(t):
    dtype, shape, raw = t
    return np.frombuffer(raw, dtype=NP[dtype]).reshape(shape)


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(f):
    u = np.ascontiguousarray(f, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f), np.uint16(0x7FFF), r)


def as_f32(t):
    a = array(t)
    if t[0] == "BF16":
        return bf16_to_f32(a)
    return a.astype(np.float32)


def e4m3_table():
    vals = np.zeros(256, dtype=np.float32)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            v = np.nan
        elif e == 0:
            v = (m / 8.0) * 2.0 ** -6
        else:
            v = (1 + m / 8.0) * 2.0 ** (e - 7)
        vals[c] = -v if s else v
    return vals


E4M3 = e4m3_table()


class Reference:
    def __init__(self, src_dir):
        self.t = read_dir(src_dir)
        self.used = set()
        cfg = json.load(open(os.path.join(src_dir, "config.json")))
        self.q = cfg.get("quantization_config") or {}
        block = self.q.get("weight_block_size") or [128, 128]
        block = (cfg.get("qforge", {}).get("hybrid", {}).get("weight_block_size") or block)
        self.bn, self.bk = block
        extra = self.q.get("extra_config") or {}
        self.exact = extra
        self.regex = [(re.compile(k), v) for k, v in extra.items() if re.search(r"[*+?^$()\[\]{}|\\]", k)]

    def get(self, name):
        self.used.add(name)
        return self.t[name]

    def group(self, module, k):
        entry = self.exact.get(module)
        if entry is None:
            entry = next((v for r, v in self.regex if r.search(module)), {})
        g = entry.get("group_size", self.q.get("group_size", 128))
        return k if g is None or g <= 0 else g

    def module(self, m):
        """The module's weight [N, K] in float32, from whatever format it is stored in."""
        if m + ".qweight" in self.t:
            qw = array(self.get(m + ".qweight")).view(np.uint32)
            qz = array(self.get(m + ".qzeros")).view(np.uint32)
            sc = array(self.get(m + ".scales")).astype(np.float32)
            n = qw.shape[1]
            groups = sc.shape[0]
            per = 8 if qz.shape[1] * 8 == n else 4
            bits = 32 // per
            k = qw.shape[0] * per
            mask = np.uint32((1 << bits) - 1)
            shifts = (np.arange(per, dtype=np.uint32) * bits)
            codes = ((qw[:, None, :] >> shifts[None, :, None]) & mask).reshape(k, n).astype(np.int64)
            zeros = ((qz[:, :, None] >> shifts[None, None, :]) & mask).reshape(groups, n).astype(np.int64) + 1
            g = self.group(m, k)
            gk = np.arange(k) // g
            w = sc[gk] * (codes - zeros[gk]).astype(np.float32)
            return w.T.astype(np.float32)
        t = self.get(m + ".weight")
        if t[0] == "F8_E4M3":
            codes = array(t)
            s = as_f32(self.get(m + ".weight_scale_inv"))
            n, k = codes.shape
            rows = np.arange(n) // self.bn
            cols = np.arange(k) // self.bk
            return E4M3[codes] * s[rows][:, cols]
        return as_f32(t)

    def expected(self, name, dtype, shape):
        """Expected raw bytes of output tensor `name`."""
        fused = re.match(r"(.*\.experts)\.(gate_up_proj|down_proj)$", name)
        if fused and name not in self.t:
            prefix, kind = fused.groups()
            parts = []
            for e in range(shape[0]):
                if kind == "gate_up_proj":
                    parts.append(np.concatenate([self.module(f"{prefix}.{e}.gate_proj"),
                                                 self.module(f"{prefix}.{e}.up_proj")]))
                else:
                    parts.append(self.module(f"{prefix}.{e}.down_proj"))
            f = np.stack(parts)
        elif name.endswith(".weight") and name not in self.t or (
                name in self.t and self.t[name][0] == "F8_E4M3"):
            f = self.module(name[: -len(".weight")])
        else:
            src = self.get(name)
            if src[0] == dtype:
                return src[2]
            f = as_f32(src)
        if dtype == "BF16":
            return f32_to_bf16(f).tobytes()
        if dtype == "F32":
            return np.ascontiguousarray(f, dtype=np.float32).tobytes()
        raise ValueError(f"{name}: unexpected output dtype {dtype}")


def main():
    ref = Reference(sys.argv[1])
    out = read_dir(sys.argv[2])
    bad = []
    for name in sorted(out):
        dtype, shape, raw = out[name]
        try:
            want = ref.expected(name, dtype, shape)
        except KeyError as e:
            bad.append(f"{name}: input lacks {e}")
            continue
        if want != raw:
            bad.append(f"{name}: bytes differ")
    unused = sorted(set(ref.t) - ref.used)
    print(json.dumps({"tensors": len(out), "mismatched": len(bad), "examples": bad[:10],
                      "input_tensors_unused": unused[:10], "n_unused": len(unused)}))
    sys.exit(0 if not bad and not unused else 1)


if __name__ == "__main__":
    main()
