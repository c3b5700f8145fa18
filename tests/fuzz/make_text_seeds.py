#!/usr/bin/env python3
"""Writes the hand-made seeds of the text fuzz targets (tests/fuzz/seeds/{request,schema,regex,
chat_output,tokenizer,config,model_load}); make_seeds.py writes the header target's. The config seeds are
the example model's files and the recipes (its tokenizer.json cut to 300 ids). Inputs a fuzzing run found
(crashes, broken properties) are added beside them by hand, named for what they caught.

Usage: python3 tests/fuzz/make_text_seeds.py tests/fuzz/seeds
"""
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "seeds")
SEP = b"\xff"  # between a JSON part and the choices or text that follow (never in JSON text)


def write(target, name, data):
    os.makedirs(os.path.join(OUT, target), exist_ok=True)
    with open(os.path.join(OUT, target, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "minLength": 1},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "units": {"enum": ["c", "f"]}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {
            "x": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "o": {"type": "object"}, "b": {"type": "boolean"}, "n": {"type": "null"}}}}},
]
OBJECT = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "exclusiveMaximum": 150},
        "email": {"type": "string", "format": "date"},
        "kind": {"enum": ["a", "b", 1, None]},
        "score": {"type": "number", "minimum": -1.5, "maximum": 2.25},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
        "extra": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
    "required": ["name", "tags"],
    "additionalProperties": False,
    "$defs": {"tag": {"type": "string", "minLength": 1, "maxLength": 4}},
}
TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
    "required": ["v"]}}, "$ref": "#/$defs/node"}
ONE_OF = {"oneOf": [
    {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "string"}}, "required": ["t"]},
    {"type": "object", "properties": {"t": {"const": "b"}, "y": {"type": "number"}}, "required": ["t"]}]}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def schema_format(name, schema):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def main():
    req = {
        "chat.json": {"messages": [{"role": "system", "content": "Be brief."}] + USER, "max_tokens": 8,
                      "stop": ["\n", "Par"], "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3,
                      "logprobs": True, "top_logprobs": 2},
        "chat_schema.json": {"messages": USER, "response_format": schema_format("x", OBJECT)},
        "chat_tree.json": {"messages": USER, "chat_template_kwargs": {"enable_thinking": False},
                           "response_format": schema_format("t", TREE)},
        "chat_one_of.json": {"messages": USER, "response_format": schema_format("o", ONE_OF)},
        "chat_required.json": {"messages": USER, "tools": TOOLS, "tool_choice": "required",
                               "chat_template_kwargs": {"enable_thinking": False}},
        "chat_named.json": {"messages": USER + [
            {"role": "assistant", "content": "", "reasoning_content": "hmm", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "content": "sunny"}],
            "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        "chat_json_object.json": {"messages": USER, "response_format": {"type": "json_object"}, "stream": True,
                                  "stream_options": {"include_usage": True}, "n": 2, "logit_bias": {"5": -100},
                                  "presence_penalty": 0.5, "repetition_penalty": 1.1},
        "completion.json": {"prompt": "Once upon a time", "max_tokens": 16, "stop": "time", "echo": True,
                            "logprobs": 2, "min_p": 0.1},
        "completion_ids.json": {"prompt": [[1, 2, 3, 400]], "max_tokens": 0, "echo": True, "logprobs": 1,
                                "best_of": 1},
        "completion_schema.json": {"prompt": "x", "ignore_eos": True, "response_format": schema_format(
            "s", {"type": "array", "items": {"type": ["integer", "boolean"]}, "minItems": 2})},
        "completion_batch.json": {"prompt": ["Once", "upon a"], "n": 2, "echo": True, "max_tokens": 2,
                                  "logprobs": 1},
        "completion_batch_ids.json": {"prompt": [[1, 2], [3]], "max_tokens": 4},
        # /tokenize and /detokenize bodies (every body goes to those parsers too).
        "tokenize_chat.json": {"messages": USER, "tools": TOOLS, "add_generation_prompt": False,
                               "return_token_strs": True, "model": "m"},
        "detokenize.json": {"tokens": [1, 2, 3, 400], "model": "m"},
    }
    for name, body in req.items():
        write("request", name, json.dumps(body))

    schemas = [("object", OBJECT), ("tree", TREE), ("one_of", ONE_OF), ("any", {}),
               ("numbers", {"type": "number", "minimum": 0.1, "maximum": 99}),
               ("formats", {"type": "array", "items": {"type": "string", "format": "date-time"}}),
               ("strings", {"type": "string", "pattern": "^(ab|c)+x?$", "minLength": 2, "maxLength": 6})]
    for i, (name, schema) in enumerate(schemas):
        write("schema", name + ".bin", json.dumps(schema).encode() + SEP +
              bytes((i * 37 + k * 11) % 256 for k in range(64)))

    patterns = {"anchors": (0, 0, "^(ab|b)+$"), "classes": (1, 10, "[\\w-]{2,4}\\d?"),
                "alternation": (0, 16, "a|^b|c$"), "unicode": (0, 3, "^[\\u03b1-\\u03c9]+$"),
                "counts": (2, 9, "^(a{1,2}){2}x*$"), "dot": (0, 0, "a.c")}
    for name, (lo, hi, p) in patterns.items():  # bytes 0 and 1: the lengths (see fuzz_regex.cpp)
        write("regex", name + ".bin", bytes([lo, hi]) + p.encode() + b"\n" + bytes(range(0, 64, 3)))

    write("chat_output", "think_call.bin", b"\x03" + json.dumps(TOOLS).encode() + SEP + (
        "Let me think.\n</think>\n\nSure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=f>\n"
        "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=n>\nNone\n</parameter>\n</function>\n"
        "</tool_call>").encode())
    write("chat_output", "forced.bin", b"\x04null" + SEP +
          b'[{"name": "f", "parameters": {"x": 1.5}}, {"name": "g", "parameters": {}}]')
    write("chat_output", "named.bin", b'\x00[1, {"function": 2}]' + SEP +
          b'{"city": "Par\\"is", "o": {"a": [1, {"b": "}"}]}} trailing <tool_call>\n<function=x>\n</function>')

    write("tokenizer", "ascii.txt", "Hello, world! 123 4567  tabs\tand\nnewlines   ")
    write("tokenizer", "unicode.txt", "caf\u00e9 cafe\u0301 \u4f60\u597d \U0001F600 \u00c5\u212b")
    write("tokenizer", "special.txt", "<|im_start|>user\nhi<|im_end|>\n<think>\n</think><tool_call><|endoftext|><|im_start")
    write("tokenizer", "bytes.bin", b"\xff\xfe abc \xc3 \xe2\x82 ok")

    # config: byte 0 picks the parser (see fuzz_config.cpp).
    def read(*path):
        with open(os.path.join(ROOT, *path), "rb") as f:
            return f.read()
    write("config", "config.bin", b"\x00" + read("models", "tiny", "model", "config.json"))
    index = {"metadata": {"total_size": 1234}, "weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.language_model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "mtp.fc.weight": "model-00002-of-00002.safetensors"}}
    write("config", "index.bin", b"\x01" + json.dumps(index, indent=2).encode())
    for name in sorted(os.listdir(os.path.join(ROOT, "recipes"))):
        write("config", "recipe-" + name.replace(".json", ".bin"), b"\x02" + read("recipes", name))
    write("config", "generation_config.bin",
          b"\x03" + read("models", "tiny", "model", "generation_config.json"))
    tok = json.loads(read("models", "tiny", "model", "tokenizer.json"))
    vocab = {k: v for k, v in tok["model"]["vocab"].items() if v < 300}
    merges = []
    for m in tok["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b])
    tok["model"]["vocab"], tok["model"]["merges"] = vocab, merges
    tok["added_tokens"] = [dict(t, id=300 + i) for i, t in enumerate(tok["added_tokens"])]
    write("config", "tokenizer.bin", b"\x04" + json.dumps(tok, ensure_ascii=False).encode())

    # model_load: the r1 engine fixture's safetensors header, as its file holds it.
    model = read("tests", "golden", "data", "models", "r1-hd64-e4k2", "model", "model.safetensors")
    n = int.from_bytes(model[:8], "little")
    write("model_load", "r1-header.json", model[8:8 + n])


if __name__ == "__main__":
    main()
