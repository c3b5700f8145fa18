#!/usr/bin/env python3
"""What serving costs on top of the engine: `qforge generate` and `qforge serve` (through
OpenAI's Python client, streamed and whole) on the same prompt, greedy, the same token count,
in one run, alternating. Prints decode tok/s of each, the serving overhead per token in
microseconds, and time to first token.

  bench/serve_bench.py --qforge build/bin/qforge --model models/tiny/model [--device cuda]
                       [--tokens 256] [--rounds 5] [--speculative]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qforge", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--speculative", action="store_true")
    a = ap.parse_args()
    engine = ["--device", a.device] + (["--speculative"] if a.speculative else [])

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
