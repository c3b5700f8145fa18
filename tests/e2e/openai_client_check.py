#!/usr/bin/env python3
"""Checks a `qforge serve` endpoint with OpenAI's own Python client (the `openai` package),
an implementation of the protocol independent of qforge: it parses the replies, the server-sent
event streams and the errors. serve_cli_test.cpp and rt_server_test.cpp run it.

  openai_client_check.py engine BASE_URL EXPECT.json   replies equal to `qforge generate`'s
  openai_client_check.py errors BASE_URL API_KEY       status codes, error bodies and parameters
  openai_client_check.py tools BASE_URL EXPECT.json    reasoning, content and tool calls
  openai_client_check.py logprobs BASE_URL EXPECT.json each token's logprob, whole and streamed

Prints "ok: N checks" and exits 0, or prints what differed and exits 1.
"""
import json
import socket
import sys
import urllib.parse
import urllib.request

import openai

checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        print("FAILED:", what)
        sys.exit(1)


def stream_chat(client, **kw):
    """A streamed chat reply's parts, joined, with its finish reason and usage."""
    parts = {"reasoning": "", "content": "", "calls": {}, "finish": None, "usage": None, "role": None}
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.usage is not None:
            parts["usage"] = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            parts["role"] = parts["role"] or d.role
            parts["reasoning"] += (d.model_extra or {}).get("reasoning_content") or ""
            parts["content"] += d.content or ""
            for tc in d.tool_calls or []:
                c = parts["calls"].setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
            if ch.finish_reason:
                parts["finish"] = ch.finish_reason
    return parts


def stream_text(client, **kw):
    text, finish = "", None
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            text += ch.text
            finish = ch.finish_reason or finish
    return text, finish


def engine(base, expect):
    """Every case's reply, whole and streamed, against `qforge generate`'s (in EXPECT)."""
    client = openai.OpenAI(base_url=base, api_key="unused")
    models = client.models.list().data
    check([m.id for m in models] == [expect["model"]], f"models: {[m.id for m in models]}")
    for case in expect["completions"]:
        kw = dict(model=expect["model"], **case["request"])
        r = client.completions.create(**kw)
        check(r.choices[0].text == case["text"], f"completion text {r.choices[0].text!r} != {case['text']!r}")
        check(r.choices[0].finish_reason == case["finish_reason"], f"finish {r.choices[0].finish_reason}")
        check(r.usage.completion_tokens == case["completion_tokens"], f"usage {r.usage}")
        check(r.usage.prompt_tokens == case["prompt_tokens"], f"usage {r.usage}")
        if "cached_tokens" in case:
            cached = r.usage.prompt_tokens_details.cached_tokens
            check(cached == case["cached_tokens"], f"cached tokens {cached} != {case['cached_tokens']}")
        text, finish = stream_text(client, **kw)
        check(text == case["text"] and finish == case["finish_reason"], f"streamed {text!r} {finish}")
    for case in expect["chats"]:
        kw = dict(model=expect["model"], **case["request"])
        r = client.chat.completions.create(**kw)
        m = r.choices[0].message
        reasoning = (m.model_extra or {}).get("reasoning_content") or ""
        check(m.role == "assistant", f"role {m.role}")
        check(reasoning == case["reasoning"], f"reasoning {reasoning!r} != {case['reasoning']!r}")
        check((m.content or "") == case["content"], f"content {m.content!r} != {case['content']!r}")
        check(r.choices[0].finish_reason == case["finish_reason"], f"finish {r.choices[0].finish_reason}")
        check(r.usage.completion_tokens == case["completion_tokens"], f"usage {r.usage}")
        s = stream_chat(client, stream_options={"include_usage": True}, **kw)
        check(s["role"] == "assistant", "streamed role")
        check(s["reasoning"] == case["reasoning"] and s["content"] == case["content"],
              f"streamed {s['reasoning']!r} / {s['content']!r}")
        check(s["finish"] == case["finish_reason"], f"streamed finish {s['finish']}")
        check(s["usage"] is not None and s["usage"].completion_tokens == case["completion_tokens"],
              f"streamed usage {s['usage']}")


def tools(base, expect):
    """A reply with reasoning and tool calls (a scripted engine), whole and streamed; EXPECT's
    "finish_reason" defaults to "tool_calls"."""
    client = openai.OpenAI(base_url=base, api_key="unused")
    kw = dict(model=expect["model"], **expect["request"])
    want = expect["message"]
    r = client.chat.completions.create(**kw)
    m = r.choices[0].message
    check((m.model_extra or {}).get("reasoning_content") == want["reasoning_content"], f"reasoning {m}")
    check(m.content == want["content"], f"content {m.content!r}")  # null beside forced calls
    got = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)} for c in m.tool_calls]
    check(got == want["tool_calls"], f"tool calls {got}")
    check(all(c.type == "function" and c.id.startswith("call_") for c in m.tool_calls), "call ids")
    check(len({c.id for c in m.tool_calls}) == len(m.tool_calls), "distinct call ids")
    finish = expect.get("finish_reason", "tool_calls")  # "stop" when tool_choice forced them
    check(r.choices[0].finish_reason == finish, f"finish {r.choices[0].finish_reason}")
    s = stream_chat(client, **kw)
    check(s["reasoning"] == want["reasoning_content"] and s["content"] == (want["content"] or ""),
          f"streamed {s['reasoning']!r} / {s['content']!r}")
    calls = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for _, c in sorted(s["calls"].items())]
    check(calls == want["tool_calls"], f"streamed calls {calls}")
    check(s["finish"] == finish, f"streamed finish {s['finish']}")


def logprobs(base, expect):
    """Logprobs (a scripted engine's, in EXPECT with each token's bytes) read by the client from
    chat and completion replies, whole and streamed, with and without a stop string."""
    client = openai.OpenAI(base_url=base, api_key="unused")
    want, want_bytes, top = expect["logprobs"], expect["bytes"], expect["top"]
    n = len(want)
    kw = dict(model=expect["model"], messages=expect["messages"], max_tokens=n)
    r = client.chat.completions.create(**kw)
    check(r.choices[0].logprobs is None, "logprobs without asking")
    r = client.chat.completions.create(logprobs=True, top_logprobs=top, **kw)
    content = r.choices[0].logprobs.content
    check(len(content) == n == r.usage.completion_tokens, f"{len(content)} entries for {n} tokens")
    for i, e in enumerate(content):
        check(e.logprob == want[i], f"token {i}: logprob {e.logprob} != {want[i]}")
        check(e.bytes == want_bytes[i], f"token {i}: bytes {e.bytes} != {want_bytes[i]}")
        check(e.token == bytes(e.bytes).decode("utf-8", "replace"), f"token {i}: {e.token!r}")
        check(len(e.top_logprobs) == top and e.top_logprobs[0].logprob == want[i],
              f"token {i}: top {e.top_logprobs}")
    streamed = []
    for chunk in client.chat.completions.create(stream=True, logprobs=True, top_logprobs=top, **kw):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                streamed += ch.logprobs.content
    check([(e.token, e.logprob, e.bytes) for e in streamed] ==
          [(e.token, e.logprob, e.bytes) for e in content], "streamed chat logprobs")
    # A stop string ends the reply inside the text: one entry per generated token still.
    r = client.chat.completions.create(logprobs=True, stop=[expect["stop"]], **kw)
    check(r.choices[0].finish_reason == "stop", f"stop: finish {r.choices[0].finish_reason}")
    check(len(r.choices[0].logprobs.content) == r.usage.completion_tokens < n,
          f"stop: {len(r.choices[0].logprobs.content)} entries, {r.usage.completion_tokens} tokens")
    # Completions: parallel lists, the offsets advancing by each token's characters.
    kw = dict(model=expect["model"], prompt="x", max_tokens=n, logprobs=top)
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    check(lp.token_logprobs == want, f"completion logprobs {lp.token_logprobs}")
    check(lp.tokens == [e.token for e in content], "completion tokens")
    offsets = [0]
    for t in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(t))
    check(lp.text_offset == offsets, f"text offsets {lp.text_offset}")
    check(all(len(d) >= top and d[t] == v for d, t, v in zip(lp.top_logprobs, lp.tokens, want)),
          "completion top logprobs")
    streamed = []
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                streamed += list(zip(ch.logprobs.tokens, ch.logprobs.token_logprobs,
                                     ch.logprobs.text_offset))
    check(streamed == list(zip(lp.tokens, lp.token_logprobs, lp.text_offset)),
          "streamed completion logprobs")


def expect_error(fn, cls, status, param, what):
    try:
        fn()
    except cls as e:
        check(e.status_code == status, f"{what}: status {e.status_code}")
        body = e.body if isinstance(e.body, dict) else {}
        body = body.get("error", body)  # the client hands over the "error" object
        check(body.get("param") == param, f"{what}: param {body.get('param')!r} != {param!r}")
        check(bool(body.get("message")), f"{what}: no message")
        return
    except Exception as e:  # noqa: BLE001 - report any other outcome as a failure
        check(False, f"{what}: {type(e).__name__}: {e}")
    check(False, f"{what}: no error")


def raw(base, method, path, body=None, headers=None):
    req = urllib.request.Request(base.rsplit("/v1", 1)[0] + path, data=body, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def errors(base, key):
    good = openai.OpenAI(base_url=base, api_key=key, max_retries=0)
    bad_key = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
    model = good.models.list().data[0].id
    msgs = [{"role": "user", "content": "hi"}]
    chat = good.chat.completions.create
    expect_error(lambda: bad_key.models.list(), openai.AuthenticationError, 401, None, "wrong key")
    expect_error(lambda: chat(model="other", messages=msgs), openai.NotFoundError, 404, "model", "model")
    expect_error(lambda: chat(model=model, messages=msgs, temperature=-1), openai.BadRequestError, 400,
                 "temperature", "temperature")
    expect_error(lambda: chat(model=model, messages=msgs, n=0), openai.BadRequestError, 400, "n", "n")
    expect_error(lambda: chat(model=model, messages=msgs, presence_penalty=3), openai.BadRequestError,
                 400, "presence_penalty", "presence_penalty")
    expect_error(lambda: chat(model=model, messages=msgs, logit_bias={"99999999": 1}),
                 openai.BadRequestError, 400, "logit_bias", "logit_bias past the vocabulary")
    expect_error(lambda: chat(model=model, messages=msgs, logprobs=True, top_logprobs=21),
                 openai.BadRequestError, 400, "top_logprobs", "top_logprobs")
    expect_error(lambda: chat(model=model, messages=[{"role": "robot", "content": "x"}]),
                 openai.BadRequestError, 400, "messages", "role")
    expect_error(lambda: chat(model=model, messages=msgs, max_tokens=10**6), openai.BadRequestError, 400,
                 "max_tokens", "context")
    expect_error(lambda: good.completions.create(model=model, prompt=[10**8]), openai.BadRequestError,
                 400, "prompt", "token id")
    auth = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    status, body = raw(base, "POST", "/v1/chat/completions", b"{not json", auth)
    check(status == 400 and b"not valid JSON" in body, f"bad JSON: {status} {body[:200]}")
    status, body = raw(base, "GET", "/v1/nothing", None, auth)
    check(status == 404 and json.loads(body)["error"]["type"] == "not_found_error", f"404: {body}")
    status, body = raw(base, "POST", "/v1/completions", b"x" * (33 << 20), auth)
    check(status == 413 and "error" in json.loads(body), f"413: {status} {body[:200]}")
    status, _ = raw(base, "GET", "/health")
    check(status == 200, "health without a key")
    # A client that leaves mid-stream: the server stops that reply and serves the next request.
    u = urllib.parse.urlparse(base)
    body = json.dumps({"model": model, "prompt": "import", "max_tokens": 200, "stream": True,
                       "ignore_eos": True}).encode()
    with socket.create_connection((u.hostname, u.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(4096)
        check(b"text_completion" in got, "stream started")
    r = good.completions.create(model=model, prompt="def", max_tokens=2)
    check(r.usage.completion_tokens >= 1, "served after a client left")


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("engine", "errors", "tools", "logprobs"):
        print(__doc__)
        sys.exit(2)
    mode, base, arg = sys.argv[1:]
    if mode == "errors":
        errors(base, arg)
    else:
        with open(arg) as f:
            {"engine": engine, "tools": tools, "logprobs": logprobs}[mode](base, json.load(f))
    print(f"ok: {checks} checks")


if __name__ == "__main__":
    main()
