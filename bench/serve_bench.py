#!/usr/bin/env python3
"""What serving costs on top of the engine: `qforge generate` and `qforge serve` (through
OpenAI's Python client, streamed and whole) on the same prompt, greedy, the same token count,
in one run, alternating. Prints decode tok/s of each, the serving overhead per token in
microseconds, and time to first token.

  bench/serve_bench.py --qforge build/bin/qforge --model models/tiny/model [--device cuda]
                       [--tokens 256] [--rounds 5] [--speculative]

With --turns N it times a conversation instead: N chat turns, each adding the reply and a
~250-token user message, sent to a server with prefix reuse and one with --no-prefix-cache,
alternating; per turn the prompt tokens, those reused, and each server's wall time.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import openai

PROMPT = "import os\n\n\ndef read_config(path):\n"


def start(cmd):
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in server.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            return server, openai.OpenAI(base_url=f"http://127.0.0.1:{m.group(1)}/v1", api_key="x")
    sys.exit("serve did not start")


def conversation(a, engine):
    servers = [start([a.qforge, "serve", "--model", a.model, "--port", "0"] + engine + extra)
               for extra in ([], ["--no-prefix-cache"])]
    try:
        talk(a, servers)
    finally:
        for server, _ in servers:
            server.kill()
            server.wait()


def talk(a, servers):
    model = servers[0][1].models.list().data[0].id
    with open(__file__) as f:
        source = f.read()
    messages = []
    print(f"{a.model} on {a.device}: a conversation of {a.turns} turns, 32 tokens a reply")
    print("turn  prompt tokens  reused  reuse (s)  afresh (s)")
    for turn in range(a.turns):
        chunk = source[(turn * 900) % len(source):][:900]
        messages.append({"role": "user", "content": "Explain this code:\n" + chunk})
        times, replies, cached, prompt = [], [], 0, 0
        for i, (_, client) in enumerate(servers):
            t0 = time.perf_counter()
            r = client.chat.completions.create(
                model=model, messages=messages, max_tokens=32, temperature=0,
                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
            times.append(time.perf_counter() - t0)
            replies.append(r.choices[0].message.content or "")
            if i == 0:
                cached = r.usage.prompt_tokens_details.cached_tokens
                prompt = r.usage.prompt_tokens
        if replies[0] != replies[1]:
            sys.exit(f"turn {turn}: the replies differ")
        messages.append({"role": "assistant", "content": replies[0]})
        print(f"{turn + 1:4d}  {prompt:13d}  {cached:6d}  {times[0]:9.3f}  {times[1]:10.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qforge", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--speculative", action="store_true")
    ap.add_argument("--turns", type=int, default=0)
    a = ap.parse_args()
    engine = ["--device", a.device] + (["--speculative"] if a.speculative else [])
    if a.turns:
        conversation(a, engine)
        return

    server = subprocess.Popen([a.qforge, "serve", "--model", a.model, "--port", "0"] + engine,
                              stderr=subprocess.PIPE, text=True)
    port = None
    for line in server.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("serve did not start")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
    model = client.models.list().data[0].id
    kw = dict(model=model, prompt=PROMPT, max_tokens=a.tokens, temperature=0,
              extra_body={"ignore_eos": True})

    gen, whole, streamed, ttft = [], [], [], []
    for _ in range(a.rounds):
        g = subprocess.run([a.qforge, "generate", "--model", a.model, "--prompt", PROMPT, "--json",
                            "--temperature", "0", "--ignore-eos", "--max-tokens", str(a.tokens)] + engine,
                           capture_output=True, text=True, check=True)
        j = json.loads(g.stdout)
        gen.append(j["decode_tokens_per_s"])
        # Whole: wall time of the request (prefill included; the prompt is 8 tokens).
        t0 = time.perf_counter()
        r = client.completions.create(**kw)
        whole.append(r.usage.completion_tokens / (time.perf_counter() - t0))
        # Streamed: tokens after the first over the time after the first event.
        t0 = time.perf_counter()
        first, n = None, 0
        for chunk in client.completions.create(stream=True, **kw):
            if chunk.choices and chunk.choices[0].text:
                n += 1
                if first is None:
                    first = time.perf_counter()
        end = time.perf_counter()
        ttft.append((first - t0) * 1e3)
        streamed.append((a.tokens - 1) / (end - first))
    server.terminate()
    server.wait()

    med = statistics.median
    g, w, s = med(gen), med(whole), med(streamed)
    print(f"{a.model} on {a.device}{' (speculative)' if a.speculative else ''}, {a.tokens} tokens, "
          f"median of {a.rounds} rounds, alternating")
    print(f"  qforge generate (decode):        {g:9.1f} tok/s")
    print(f"  serve, whole reply (wall):       {w:9.1f} tok/s   {1e6 / w - 1e6 / g:+8.1f} us/token vs generate")
    print(f"  serve, streamed (after 1st):     {s:9.1f} tok/s   {1e6 / s - 1e6 / g:+8.1f} us/token vs generate")
    print(f"  time to first streamed token:    {med(ttft):9.2f} ms")


if __name__ == "__main__":
    main()
