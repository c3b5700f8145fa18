#!/usr/bin/env python3
"""Tokenizer encode throughput, side by side in one run on the same documents:
    qforge (bench/tokenizer_bench.cpp: qf::rt::Tokenizer::encode)   vs   Hugging Face tokenizers
both on one thread (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false), with the ids of every
document checked to be identical.

    tokenizer_bench.py --bench build/bin/qforge-bench-tokenizer [--tokenizer tokenizer.json]
                       [--mb 4] [--runs 5] [--seed 1] [--json]

Run it with a Python that has `tokenizers` (pip install tokenizers). The tokenizer defaults to
the Qwen3.5 one in tests/golden/data/qwen35_tokenizer.tar.xz. The documents (a few KB each,
--mb in all, fixed seed) are half multilingual text, recombined from the words and sentences of
tests/golden/data/tokenizer_corpus.json with random numbers and punctuation, and half source
code: the .py files of this Python's standard library (so that part depends on the Python
version, which is printed). Each side encodes every document on its own; HF is timed with
encode_batch(docs, add_special_tokens=False) and with encode_batch_fast (no offsets, where this
tokenizers has it), qforge as a loop of encode(doc) after load; each reports the best of
--runs. Prints a table (stdout); --json for machines.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import tokenizers  # noqa: E402  (after the thread settings)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "golden", "data")


def multilingual_doc(rng, corpus, size):
    words = [w for s in corpus for w in s.split(" ") if w]
    parts = []
    n = 0
    while n < size:
        r = rng.random()
        if r < 0.35:
            piece = rng.choice(corpus)
        elif r < 0.55:  # a run of Chinese/Japanese/Thai text has no spaces: cut one anywhere
            s = rng.choice(corpus)
            a = rng.randrange(len(s))
            piece = s[a:a + rng.randrange(1, 40)]
        elif r < 0.9:
            piece = " ".join(rng.choice(words) for _ in range(rng.randrange(3, 15)))
        else:
            unit = rng.choice([".", ",", "%", " kg", ""])
            piece = f"{rng.randrange(10**rng.randrange(1, 9))}{unit}"
        parts.append(piece)
        parts.append(rng.choice([" ", " ", " ", "\n", "\n\n", ". ", ", "]))
        n += len(piece.encode())
    return "".join(parts)


def code_docs(rng, size_bytes):
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(stdlib) for f in fs
                   if f.endswith(".py") and "test" not in d)
    rng.shuffle(files)
    docs, n = [], 0
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for b in range(0, len(text), 6000):  # documents of at most 6000 characters
            chunk = text[b:b + 6000]
            if "\0" in chunk or not chunk:
                continue
            docs.append(chunk)
            n += len(chunk.encode())
            if n >= size_bytes:
                return docs
    return docs


def make_docs(mb, seed):
    rng = random.Random(seed)
    with open(os.path.join(DATA, "tokenizer_corpus.json"), encoding="utf-8") as f:
        corpus = [s for s in json.load(f) if s]
    half = int(mb * 1e6 / 2)
    docs, n = [], 0
    while n < half:
        d = multilingual_doc(rng, corpus, rng.randrange(500, 8000))
        docs.append(d)
        n += len(d.encode())
    docs += code_docs(rng, half)
    rng.shuffle(docs)
    return docs


def best_of(runs, fn):
    """The shortest of `runs` timings of fn(), and its result."""
    best, out = None, None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        t = time.perf_counter() - t0
        best = t if best is None else min(best, t)
    return best, out


def read_ids(path, n_docs):
    import array
    a = array.array("i")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    out, cur = [], []
    for x in a:
        if x == -1:
            out.append(cur)
            cur = []
        else:
            cur.append(x)
    if len(out) != n_docs:
        sys.exit(f"qforge wrote ids for {len(out)} documents, expected {n_docs}")
    return out


def first_difference(docs, hf_ids, qf_ids):
    for i, (a, b) in enumerate(zip(hf_ids, qf_ids)):
        if a != b:
            k = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
            return i, k, a[max(0, k - 3):k + 5], b[max(0, k - 3):k + 5]
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, help="the qforge-bench-tokenizer binary")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: the Qwen3.5 one in the tests)")
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="qf-tok-bench-") as tmp:
        path = a.tokenizer
        if not path:
            with tarfile.open(os.path.join(DATA, "qwen35_tokenizer.tar.xz")) as tar:
                tar.extract("tokenizer.json", tmp)
            path = os.path.join(tmp, "tokenizer.json")
        docs = make_docs(a.mb, a.seed)
        docs_path = os.path.join(tmp, "docs.bin")
        with open(docs_path, "wb") as f:
            f.write(b"\0".join(d.encode() for d in docs))
        n_bytes = sum(len(d.encode()) for d in docs)

        hf = tokenizers.Tokenizer.from_file(path)
        hf_s, hf_ids = best_of(a.runs, lambda: hf.encode_batch(docs, add_special_tokens=False))
        hf_ids = [e.ids for e in hf_ids]
        hf_fast_s = None
        if hasattr(hf, "encode_batch_fast"):
            hf_fast_s, fast = best_of(a.runs,
                                      lambda: hf.encode_batch_fast(docs, add_special_tokens=False))
            if [e.ids for e in fast] != hf_ids:
                sys.exit("encode_batch_fast and encode_batch disagree")

        ids_path = os.path.join(tmp, "ids.bin")
        out = subprocess.run([a.bench, path, docs_path, "--runs", str(a.runs), "--ids-out",
                              ids_path, "--json"], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{a.bench} failed:\n{out.stderr}")
        q = json.loads(out.stdout)
        qf_ids = read_ids(ids_path, len(docs))

    n_tokens = sum(len(x) for x in hf_ids)
    diff = first_difference(docs, hf_ids, qf_ids)
    qf_s = q["best_s"]

    def figures(s):
        return {"best_s": s, "mb_per_s": n_bytes / s / 1e6, "tokens_per_s": n_tokens / s}

    result = {
        "python": sys.version.split()[0], "tokenizers": tokenizers.__version__,
        "docs": len(docs), "bytes": n_bytes, "tokens": n_tokens, "runs": a.runs,
        "hf": figures(hf_s), "qforge": dict(figures(qf_s), load_s=q["load_s"]),
        "speedup": hf_s / qf_s, "ids_identical": diff is None,
    }
    if hf_fast_s is not None:
        result["hf_fast"] = figures(hf_fast_s)
        result["speedup_vs_fast"] = hf_fast_s / qf_s
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{len(docs)} documents, {n_bytes / 1e6:.2f} MB ({a.mb / 2:g} MB multilingual, "
              f"the rest Python {result['python']} stdlib source), {n_tokens:,} tokens; "
              f"one thread, best of {a.runs}")
        print(f"  {'':34} {'encode s':>9} {'MB/s':>8} {'Mtokens/s':>10}")
        rows = [(f"HF {tokenizers.__version__} encode_batch", result["hf"])]
        if "hf_fast" in result:
            rows.append((f"HF {tokenizers.__version__} encode_batch_fast", result["hf_fast"]))
        rows.append(("qforge Tokenizer::encode", result["qforge"]))
        for name, r in rows:
            print(f"  {name:34} {r['best_s']:9.3f} {r['mb_per_s']:8.2f} "
                  f"{r['tokens_per_s'] / 1e6:10.3f}")
        print(f"  qforge / HF throughput: {result['speedup']:.2f}x"
              + (f" (vs encode_batch_fast {result['speedup_vs_fast']:.2f}x)"
                 if "hf_fast" in result else ""))
    if diff is not None:
        i, k, want, got = diff
        print(f"ids differ: document {i} at token {k}: HF {want}, qforge {got}\n"
              f"document text: {docs[i]!r}", file=sys.stderr)
        return 2
    if not a.json:
        print(f"  ids identical on all {len(docs)} documents")
    return 0


if __name__ == "__main__":
    sys.exit(main())
