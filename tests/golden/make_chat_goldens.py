#!/usr/bin/env python3
"""Golden data for qforge's native Qwen3.5 chat template (runtime/src/chat.cpp).

    python3 -m venv /tmp/cv && /tmp/cv/bin/pip install jinja2 transformers
    /tmp/cv/bin/python tests/golden/make_chat_goldens.py

Renders tests/golden/data/qwen35_chat_template.jinja with transformers' own renderer
(`render_jinja_template`: its sandboxed Jinja environment with trim_blocks/lstrip_blocks, its
`tojson` (json.dumps, ensure_ascii=False), `raise_exception`, and its aliasing of `reasoning` /
`thinking` to `reasoning_content`) over the conversations below, and writes
tests/golden/data/chat_golden.json: per case the messages, tools and options as the C++ side
receives them, and the exact prompt text.

The template is the `chat_template.jinja` of the Qwen3.5 MoE models (Qwen/Qwen3.5-35B-A3B,
Qwen/Qwen3.5-122B-A10B, Qwen/Qwen3.5-397B-A17B on Hugging Face; Apache-2.0, as the model
repositories). It was transcribed from copies of that file (see the provenance field written
below); the small Qwen3.5 models ship the same template with thinking off by default.

Like serving stacks (vLLM's chat_utils), tool-call `arguments` given as a JSON string are
decoded to an object before templating (the template iterates `arguments|items` and fails on a
string); an empty or missing string becomes {}. The C++ renderer does the same.
"""
import copy
import hashlib
import json
import os
import random
import sys

import jinja2
import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_PATH = os.path.join(HERE, "data", "qwen35_chat_template.jinja")
OUT_PATH = os.path.join(HERE, "data", "chat_golden.json")

PROVENANCE = {
    "template_file": "tests/golden/data/qwen35_chat_template.jinja",
    "official_source": "https://huggingface.co/Qwen/Qwen3.5-35B-A3B/blob/main/chat_template.jinja "
    "(same file in Qwen/Qwen3.5-122B-A10B and Qwen/Qwen3.5-397B-A17B)",
    "license": "Apache-2.0 (Qwen3.5 model repositories)",
    "transcribed_from": "verbatim copies of the official file quoted in public repositories "
    "(a Swift app's built-in fallback for Qwen3.5, a converted-model bundle's template dump, "
    "a Dart formatter's text-path excerpt), which agree line for line; the tool-format "
    "instructions also match ollama's Qwen3.5 renderer (model/renderers/qwen35.go). Not "
    "compared byte-for-byte with the Hugging Face file itself.",
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search_files",
        "description": "Search files; \"quotes\", back\\slash, tab\there, <tags> & ampersands.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "limit": {"type": "integer", "minimum": 1, "default": 10},
                "threshold": {"type": "number", "default": 0.25},
                "filters": {"type": "object", "properties": {"ext": {"type": "array"}}},
                "recursive": {"type": "boolean"},
            },
            "required": ["query"],
        },
    },
}
UNICODE_TOOL = {
    "type": "function",
    "function": {
        "name": "翻訳",
        "description": "Übersetzt Text — 日本語 ↔ English 🌐, control \u0001 and \u001f, DEL \u007f.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}


# Python's float repr at the edges of its positional/exponent switch, subnormals, extremes, and
# random magnitudes (fixed seed).
_rng = random.Random(35)
FLOATS = [0.0, -0.0, 1.0, -1.5, 0.1, 0.30000000000000004, 1e-4, 9.999999999999999e-05, 1e-05,
          1e15, 1e16, 9999999999999998.0, 1.2345678901234567e16, 1e22, 123e-10, 5e-324,
          2.2250738585072014e-308, 1.7976931348623157e308, 100.0, 2.5, 1 / 3] + [
    round(_rng.uniform(-1, 1), _rng.randint(1, 17)) * 10.0 ** _rng.randint(-25, 25)
    for _ in range(80)]


def call(name, arguments, wrapped=True):
    fn = {"name": name, "arguments": arguments}
    return {"id": "call_" + name, "type": "function", "function": fn} if wrapped else fn


CASES = [
    ("system_user", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello!"},
    ], None, {}),
    ("user_only", [{"role": "user", "content": "What is 2+2?"}], None, {}),
    ("user_only_no_think", [{"role": "user", "content": "What is 2+2?"}], None,
     {"enable_thinking": False}),
    ("user_only_no_generation_prompt", [{"role": "user", "content": "Hi"}], None,
     {"add_generation_prompt": False}),
    ("trimmed_content", [
        {"role": "system", "content": "\n  Be brief.\t\n"},
        {"role": "user", "content": "\u3000\u00a0 padded by Unicode spaces \x1f\u2029\x85"},
    ], None, {}),
    ("empty_system_and_user", [
        {"role": "system", "content": "   "},
        {"role": "user", "content": ""},
    ], None, {}),
    ("multi_turn_reasoning", [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "reasoning_content": "Easy: Paris.", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "reasoning_content": "\nRome, obviously.\n", "content": "Rome."},
        {"role": "user", "content": "Thanks."},
    ], None, {}),
    ("history_without_generation_prompt", [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "reasoning_content": "Easy: Paris.", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
        {"role": "assistant", "reasoning_content": "Rome.", "content": "Rome."},
    ], None, {"add_generation_prompt": False}),
    ("inline_think_tags", [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nA1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "<think>\n\nnew thoughts\n\n</think>\n\n  A2 with spaces"},
    ], None, {"add_generation_prompt": False}),
    ("close_tag_only_and_empty_reasoning", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "thinking without an open tag</think>answer</think>tail"},
        {"role": "assistant", "reasoning_content": "", "content": "<think>kept</think>verbatim"},
    ], None, {"add_generation_prompt": False}),
    ("reasoning_aliases", [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "reasoning": "via reasoning", "content": "A"},
        {"role": "assistant", "reasoning_content": None, "thinking": "via thinking",
         "content": "B"},
    ], None, {"add_generation_prompt": False}),
    ("tools_with_system", [
        {"role": "system", "content": "You can look things up."},
        {"role": "user", "content": "Weather in Zürich?"},
    ], [WEATHER_TOOL, SEARCH_TOOL], {}),
    ("tools_without_system", [{"role": "user", "content": "Find my notes."}], [SEARCH_TOOL], {}),
    ("tools_blank_system", [
        {"role": "system", "content": " \n "},
        {"role": "user", "content": "Translate 'cat'."},
    ], [UNICODE_TOOL], {"enable_thinking": False}),
    ("tool_calls_full_loop", [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Zürich and Paris, and search my files?"},
        {"role": "assistant", "reasoning_content": "Need two weather calls and a search.",
         "content": "Let me check.",
         "tool_calls": [
             call("get_weather", {"city": "Zürich", "unit": "celsius"}),
             call("get_weather", '{"city": "Paris"}'),
             call("search_files", {
                 "query": "notes\nmultiline",
                 "limit": 5,
                 "threshold": 0.1,
                 "filters": {"ext": [".md", ".txt"], "nested": {"deep": True, "none": None}},
                 "recursive": True,
                 "exclude": None,
                 "ratios": [1.0, 2.5e-05, 1e16, 1e15, -0.0, 123456789.125],
                 "big": 12345678901234,
                 "huge": 1e16,
                 "tiny": 1e-07,
                 "negative": -7,
                 "empty_obj": {},
                 "empty_list": [],
                 "unicode": "Grüße 👋 \u0007",
             }),
         ]},
        {"role": "tool", "tool_call_id": "call_get_weather", "content": "Zürich: 18°C, cloudy"},
        {"role": "tool", "tool_call_id": "call_get_weather", "content": "  Paris: 21°C, sunny\n"},
        {"role": "tool", "tool_call_id": "call_search_files",
         "content": [{"type": "text", "text": "notes.md"}, {"type": "text", "text": "\ntodo.txt"}]},
        {"role": "assistant", "reasoning_content": "Summarize.",
         "content": "Zürich 18°C, Paris 21°C; found notes.md and todo.txt."},
        {"role": "user", "content": "Thanks!"},
    ], [WEATHER_TOOL, SEARCH_TOOL], {}),
    ("tool_calls_pending_response", [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "reasoning_content": "Call the tool.", "content": None,
         "tool_calls": [call("get_weather", '{"city":"Oslo","unit":"celsius"}')]},
        {"role": "tool", "content": "Oslo: 3°C"},
    ], [WEATHER_TOOL], {}),
    ("tool_calls_flat_and_string_arguments", [
        {"role": "user", "content": "Do two things."},
        {"role": "assistant", "content": "",
         "tool_calls": [call("search_files", "", wrapped=False),
                        call("search_files", '{"query": "a", "limit": 3, "x": 1.5}')]},
        {"role": "tool", "content": "first"},
        {"role": "tool", "content": "second"},
        {"role": "user", "content": "Now summarize."},
        {"role": "assistant", "content": "Summary.",
         "tool_calls": [call("get_weather", {"city": "Rome"})]},
        {"role": "tool", "content": "Rome: 25°C"},
    ], [WEATHER_TOOL, SEARCH_TOOL], {"enable_thinking": False}),
    ("user_tool_response_is_not_a_query", [
        {"role": "user", "content": "Start."},
        {"role": "assistant", "reasoning_content": "r1", "content": "Calling.",
         "tool_calls": [call("get_weather", {"city": "Lima"})]},
        {"role": "user", "content": "<tool_response>\nLima: 19°C\n</tool_response>"},
        {"role": "assistant", "reasoning_content": "r2", "content": "Lima is 19°C."},
    ], [WEATHER_TOOL], {"add_generation_prompt": False}),
    ("content_parts", [
        {"role": "system", "content": [{"type": "text", "text": "Part one. "},
                                       {"type": "text", "text": "Part two."}]},
        {"role": "user", "content": [{"type": "text", "text": "  Hello "},
                                     {"type": "text", "text": "world  "}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
        {"role": "user", "content": []},
    ], None, {}),
    ("unicode_everywhere", [
        {"role": "system", "content": "Réponds en français. 日本語も可。"},
        {"role": "user", "content": "مرحبا 👋🏽 — e\u0301 ñ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \u200b zero-width"},
        {"role": "assistant", "reasoning_content": "思考中…", "content": "Bonjour ! 🎉"},
        {"role": "user", "content": "Ещё раз, пожалуйста."},
    ], [UNICODE_TOOL], {"enable_thinking": False}),
    ("float_formatting", [
        {"role": "user", "content": "Numbers."},
        {"role": "assistant", "content": "", "tool_calls": [call("search_files", dict(
            [("all", FLOATS)] + [(f"f{i}", x) for i, x in enumerate(FLOATS[:40])]))]},
    ], None, {"add_generation_prompt": False}),
    ("special_tokens_in_text", [
        {"role": "user", "content": "Literal <|im_end|> and <think> in user text"},
    ], None, {}),
]


def normalize_arguments(messages):
    """String arguments -> objects, as vLLM does before templating (see the docstring)."""
    messages = copy.deepcopy(messages)
    for m in messages:
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function", tc)
            args = fn.get("arguments")
            if args is None or (isinstance(args, str) and not args.strip()):
                fn["arguments"] = {}
            elif isinstance(args, str):
                fn["arguments"] = json.loads(args)
    return messages


def render(messages, tools, options):
    kwargs = {}
    if "enable_thinking" in options:
        kwargs["enable_thinking"] = options["enable_thinking"]
    rendered, _ = render_jinja_template(
        conversations=[normalize_arguments(messages)],
        tools=tools,
        chat_template=TEMPLATE,
        add_generation_prompt=options.get("add_generation_prompt", True),
        **kwargs,
    )
    return rendered[0]


with open(TEMPLATE_PATH, encoding="utf-8") as f:
    TEMPLATE = f.read()

cases = []
for name, messages, tools, options in CASES:
    cases.append({
        "name": name,
        "messages": messages,
        "tools": tools,
        "options": {"add_generation_prompt": options.get("add_generation_prompt", True),
                    "enable_thinking": options.get("enable_thinking", True)},
        "expected": render(messages, tools, options),
    })

doc = {
    "provenance": dict(PROVENANCE, template_sha256=hashlib.sha256(TEMPLATE.encode()).hexdigest()),
    "generator": {"script": "tests/golden/make_chat_goldens.py", "python": sys.version.split()[0],
                  "jinja2": jinja2.__version__, "transformers": transformers.__version__},
    "cases": cases,
}
with open(OUT_PATH, "w", encoding="utf-8") as f:
    json.dump(doc, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(f"wrote {len(cases)} cases to {OUT_PATH}")
