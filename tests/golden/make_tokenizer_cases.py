#!/usr/bin/env python3
"""Reference outputs of Hugging Face `tokenizers` for qforge's tokenizer tests:

  tokenizer_cases.json          small hand-made tokenizer.json documents (merge priority and
                                ties, added tokens with every option, NFC, Split behaviors,
                                ByteLevel options, ignore_merges, unknown bytes) and, for each,
                                texts with HF's ids and decode, and id lists with HF's decode
                                (with and without special tokens); used by rt_tokenizer_test.
  tokenizer_stress_golden.json  the real Qwen3.5 tokenizer (qwen35_tokenizer.tar.xz) on
                                adversarial strings: Unicode spaces, marks in every combining
                                class, characters of Unicode 10-16, Hangul jamo, decomposable
                                and excluded characters, special tokens in odd places, random
                                code points; used by rt_tokenizer_golden_test.

    pip install tokenizers==0.23.3
    python3 tests/golden/make_tokenizer_cases.py tests/golden/data

Deterministic: fixed seeds, documents written with sorted keys.
"""
import json
import os
import random
import sys
import tarfile
import unicodedata

import tokenizers

OUT = sys.argv[1]
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


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


ALPHA = byte_alphabet()


def bl(text):
    """Text (str) or raw bytes in the byte-level alphabet, as vocabulary entries are written."""
    return "".join(ALPHA[b] for b in (text if isinstance(text, bytes) else text.encode()))


def added(id_, content, special=False, normalized=None, lstrip=False, rstrip=False,
          single_word=False):
    return {"id": id_, "content": content, "special": special,
            "normalized": (not special) if normalized is None else normalized,
            "lstrip": lstrip, "rstrip": rstrip, "single_word": single_word}


def byte_level(add_prefix_space=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": False,
            "use_regex": use_regex}


def split(pattern, behavior="Isolated", literal=False):
    return {"type": "Split", "pattern": {"String" if literal else "Regex": pattern},
            "behavior": behavior, "invert": False}


def tokenizer(tokens=(), merges=(), added_tokens=(), nfc=False, pre=None, skip_bytes=(),
              **model):
    """Vocabulary: every byte (id = byte value, except `skip_bytes`), then `tokens` (raw
    text) from id 256; merges as raw text pairs."""
    vocab = {ALPHA[b]: b for b in range(256) if b not in skip_bytes}
    for i, t in enumerate(tokens):
        vocab[bl(t)] = 256 + i
    opts = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": False, "vocab": vocab, "merges": [[bl(a), bl(b)] for a, b in merges]}
    opts.update(model)
    steps = pre if pre is not None else [split(QWEN_PATTERN), byte_level()]
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": list(added_tokens),
            "normalizer": {"type": "NFC"} if nfc else None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
            "post_processor": None, "decoder": byte_level(), "model": opts}


def configs():
    yield "merge_priority", tokenizer(
        ["ab", "bc", "abc", "cd", "bcd"],
        [("b", "c"), ("a", "b"), ("a", "bc"), ("c", "d"), ("b", "cd")]), [
        "abc", "ab", "bc", "abcd", "cab", "abab", "bcbc", "dabcd"]
    yield "leftmost_ties", tokenizer(["aa", "aaa", "aaaa"],
                                     [("a", "a"), ("aa", "a"), ("aa", "aa")]), [
        "a", "aa", "aaa", "aaaa", "aaaaa", "aaaaaaa", "aaaaaaaaaaa"]
    yield "equal_rank_chain", tokenizer(["ab", "ba", "aba", "bab"],
                                        [("a", "b"), ("b", "a"), ("ab", "a"), ("b", "ab")]), [
        "aba", "bab", "abab", "baba", "ababa", "abba"]
    yield "merge_listed_twice", tokenizer(["ab", "bc"], [("a", "b"), ("b", "c"), ("a", "b")]), [
        "abc", "ab", "bc", "cabc"]
    yield "added_tokens", tokenizer(
        ["ab", "é", " word"], [("a", "b"), (b"\xc3", b"\xa9")],
        [added(259, "<s>", special=True),
         added(260, "<sx>", special=True),
         added(261, "[X]"),
         added(262, "<L>", special=True, lstrip=True),
         added(263, "<R>", special=True, rstrip=True),
         added(264, "<LR>", special=True, lstrip=True, rstrip=True),
         added(265, "word", single_word=True),
         added(266, "Caf\u00e9", normalized=False),
         added(267, "ne\u0301e", normalized=True),
         added(256, "ab"),
         added(268, "hello world", special=False),
         added(269, "\u00e9t\u00e9", special=True, normalized=False)],
        nfc=True), [
        "<s>", "a<s>b", "<sx>", "<s><s>x", "<<s>>", "[X][X]", "x [X] y",
        "a  <L>  b", "a  <R>  b", "a  <LR>  b", "\u3000<L>\u3000", "<R>\u2028\n<L>",
        "<R> <L>", "<LR><LR>", " <L>", "<R> ",
        "word", "a word here", "swordfish", "words", "word,word", "_word", "word_", "1word",
        "\u00e9word", "word\u0301", "(word)", "sword word",
        "Caf\u00e9", "Cafe\u0301", "n\u00e9e", "ne\u0301e", "ab", "aab", "hello world",
        "hello  world", "\u00e9t\u00e9", "e\u0301te\u0301"]
    for behavior in ("Isolated", "Removed", "MergedWithPrevious", "MergedWithNext"):
        yield f"split_{behavior}", tokenizer(
            ["-a", "a-", "--", "-b", "b-"],
            [("-", "a"), ("a", "-"), ("-", "-"), ("-", "b"), ("b", "-")],
            pre=[split("-", behavior), byte_level()]), [
            "a-b", "-a", "a-", "--a-", "-", "a--b-", "ab", "-a-b-", "a---b"]
    yield "split_literal", tokenizer(["a.", ".b"], [("a", "."), (".", "b")],
                                     pre=[split("a.b", literal=True), byte_level()]), [
        "a.b", "axb", "a.ba.b", "xa.bx", "a.b.b"]
    yield "byte_level_regex_prefix", tokenizer(
        [" h", " he", " hello", "ll", "llo", "'s", " 1", "12"],
        [(" ", "h"), (" h", "e"), ("l", "l"), ("ll", "o"), (" he", "llo"), ("'", "s"), (" ", "1"),
         ("1", "2")],
        pre=[byte_level(add_prefix_space=True, use_regex=True)]), [
        "hello", " hello", "hello hello", "it's 12", "  hello\n\nhello", "123 1 12", ""]
    yield "byte_level_only", tokenizer([" h", "h "], [(" ", "h"), ("h", " ")],
                                       pre=[byte_level(add_prefix_space=True)]), [
        "h h", " h", "hh ", "\th"]
    yield "ignore_merges", tokenizer(["ab", "abc", "bc"], [("a", "b"), ("b", "c")],
                                     ignore_merges=True), ["abc", "abcabc", "ab", "xabc"]
    yield "no_ignore_merges", tokenizer(["ab", "abc", "bc"], [("a", "b"), ("b", "c")]), [
        "abc", "abcabc"]
    yield "unknown_bytes", tokenizer(["<unk>"], [], skip_bytes=[ord("x"), ord("y")],
                                     unk_token="<unk>"), ["axyb", "x", "xx y", "yxa"]
    yield "unknown_bytes_fused", tokenizer(["<unk>"], [], skip_bytes=[ord("x"), ord("y")],
                                           unk_token="<unk>", fuse_unk=True), [
        "axyb", "x", "xx y", "yxa", "xxxyyy"]
    yield "unknown_bytes_dropped", tokenizer([], [], skip_bytes=[ord("x")]), ["axb", "xx"]


DECODE_IDS = {  # config -> id lists to decode (with ids no token has, specials, partial UTF-8)
    "added_tokens": [[259, 97, 259], [268, 266, 269], [195, 169, 259, 195], [0, 999, 258, 195],
                     [263, 264, 262, 32], [269, 269, 261]],
    "merge_priority": [[256, 257, 258], [228, 184], [228, 184, 173, 97], [128, 255, 194]],
}


def stress_strings(seed):
    rng = random.Random(seed)
    marks = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000
             and unicodedata.combining(chr(c))]
    marks += [chr(c) for c in (0x0897, 0x1ACF, 0x1AE0, 0x10EFD, 0x10EFF, 0x11F00, 0x11F41,
                               0x16D40, 0x113B8, 0x113CE, 0x16121, 0x1612F)]
    decomposable = [chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000
                    and unicodedata.decomposition(chr(c))
                    and not unicodedata.decomposition(chr(c)).startswith("<")]
    pools = [
        " \t\n\r\x0b\x0c\x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000\u200b"
        "\u180e\ufeff",
        "aAzZ'sStTlLdDmMvVrReE\u017f\u212a\u0130\u0131",
        "0123456789\u0660\u0969\uff10\u00bd\u2163\u2460\U0001d7ce\U0001e4f0\U0001fbf5",
        "!?.,;:-_()[]{}<>|/\\\"'`~@#$%^&*+=",
        "中文日本語한국어ไทยالعربيةहिन्दीΕλληνικάРусский",
        "\U0001f600\U0001f44d\U0001f3fd\U0001f1f9\U0001f1f7\u2764\u2728",
        "\U00031350\U0002ebf0\U00011f04\U0001e4d0\U000105c0\U00016100\U00016d43\U00013460"
        "\U0001e5d0\U00011380",  # letters of Unicode 15 and 16
        "\u1100\u1161\u11a8\uac00\uac01\u1112\u1175",
    ]
    specials = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>",
                "<|im_start", "im_end|>", "<tool_call>"]
    out = []
    for _ in range(500):
        parts = []
        for _ in range(rng.randrange(1, 40)):
            r = rng.random()
            if r < 0.15:
                parts.append(rng.choice(marks))
            elif r < 0.25:
                parts.append(rng.choice(decomposable))
            elif r < 0.3:
                parts.append(rng.choice(specials))
            else:
                parts.append(rng.choice(rng.choice(pools)))
        out.append("".join(parts))
    for _ in range(200):
        cps = []
        while len(cps) < rng.randrange(1, 30):
            c = rng.choice([rng.randrange(0x20, 0x80), rng.randrange(0x80, 0x800),
                            rng.randrange(0x800, 0x10000), rng.randrange(0x10000, 0x32000)])
            if not 0xD800 <= c < 0xE000:
                cps.append(chr(c))
        out.append("".join(cps))
    out += [" " * 5000 + "x", "\n" * 3000, "a" * 3000, "\u4e2d" * 2000, "12" * 1000 + " "]
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = {}
    for name, doc, texts in configs():
        hf = tokenizers.Tokenizer.from_str(json.dumps(doc))
        for a in doc["added_tokens"]:  # the ids written are the ones tokenizers gives
            assert hf.token_to_id(a["content"]) == a["id"], (name, a)
        entry = {"tokenizer": doc, "encode": [], "decode": []}
        for t in texts:
            ids = hf.encode(t, add_special_tokens=False).ids
            entry["encode"].append({"text": t, "ids": ids,
                                    "decoded": hf.decode(ids, skip_special_tokens=False)})
        for ids in DECODE_IDS.get(name, []):
            entry["decode"].append({"ids": ids, "text": hf.decode(ids, skip_special_tokens=False),
                                    "text_skip_special": hf.decode(ids, skip_special_tokens=True)})
        cases[name] = entry
    with open(os.path.join(OUT, "tokenizer_cases.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False,
                  sort_keys=True, indent=1)

    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    with tarfile.open(os.path.join(data, "qwen35_tokenizer.tar.xz")) as tar:
        qwen = tar.extractfile("tokenizer.json").read().decode()
    hf = tokenizers.Tokenizer.from_str(qwen)
    stress = []
    for s in stress_strings(1):
        ids = hf.encode(s, add_special_tokens=False).ids
        stress.append({"text": s, "ids": ids, "decoded": hf.decode(ids, skip_special_tokens=False)})
    with open(os.path.join(OUT, "tokenizer_stress_golden.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "cases": stress}, f, ensure_ascii=False,
                  sort_keys=True, indent=0)
    print(f"{len(cases)} small tokenizers; {len(stress)} stress strings, "
          f"{sum(len(c['ids']) for c in stress)} tokens")


if __name__ == "__main__":
    main()
