"""Access control, malformed input, overload, cancellation and shutdown of `splash serve`."""

import json
import signal
import subprocess
import threading
import time

import httpx
import openai
import pytest

from conftest import BIN, Server, wait_until

CHAT = "/v1/chat/completions"
HELLO = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def error_of(r):
    body = r.json()
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_api_key_required_with_either_header(keyed_server):
    h = keyed_server.client()
    assert h.get("/health").status_code == 200
    assert h.get("/ready").status_code == 200
    assert h.get("/").status_code == 200
    r = h.get("/v1/models")
    assert r.status_code == 401 and "API key" in error_of(r)["message"]
    r = h.get("/v1/models", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and "wrong" in error_of(r)["message"]
    assert h.get("/v1/models", headers={"x-api-key": "sekret-key"}).status_code == 200
    assert h.get("/status", headers={"x-api-key": "nope"}).status_code == 401
    ok = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="sekret-key", max_retries=0)
    assert ok.chat.completions.create(model="demo", messages=HELLO["messages"], max_tokens=2).choices
    bad = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="guess", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_host_and_origin_guard(server, keyed_server):
    h = server.client()
    r = h.get("/v1/models", headers={"Host": "attacker.example"})
    assert r.status_code == 403 and "--allowed-host" in error_of(r)["message"]
    assert h.get("/v1/models", headers={"Host": f"localhost:{server.port}"}).status_code == 200
    r = h.get("/v1/models", headers={"Origin": "http://attacker.example"})
    assert r.status_code == 403 and "--allowed-origin" in error_of(r)["message"]
    same = h.get("/v1/models", headers={"Origin": server.url})
    assert same.status_code == 200 and same.headers["access-control-allow-origin"] == server.url
    k = keyed_server.client()
    allowed = {"Origin": "http://app.example:3000"}
    pre = k.options("/v1/chat/completions", headers={**allowed, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "http://app.example:3000"
    assert k.get("/v1/models", headers={**allowed, "x-api-key": "sekret-key"}).status_code == 200


def malformed_requests():
    """(method, path, raw body or None, headers) that must all be refused with a 4xx."""
    out = []
    raw = [
        b"", b"{", b"}", b"[]", b"null", b"42", b'"text"', b"{'single': 'quotes'}", b'{"messages": [}',
        b'{"messages": [{"role": "user", "content": "hi"}]', b"\xff\xfe\xfd", b'{"messages": "\xff"}',
        b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', b"{" * 5000, b'{"a":1}{"b":2}',
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e999}',
    ]
    out += [("POST", CHAT, b, {"content-type": "application/json"}) for b in raw]
    bad_fields = [
        {"messages": "hi"}, {"messages": []}, {"messages": [1, 2]}, {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "wizard", "content": "hi"}]}, {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    ]
    base = {"messages": [{"role": "user", "content": "hi"}]}
    for field, value in [
        ("max_tokens", "ten"), ("max_tokens", -1), ("max_tokens", 0), ("max_tokens", 1.5), ("max_tokens", 10**30),
        ("max_completion_tokens", [1]), ("temperature", "hot"), ("temperature", -1), ("temperature", 1e300),
        ("top_p", 0), ("top_p", 7), ("top_k", "all"), ("min_p", 2), ("presence_penalty", 99),
        ("frequency_penalty", -99), ("repetition_penalty", 0), ("seed", "abc"), ("stop", 5), ("stop", [1, 2]),
        ("stream", "yes"), ("stream_options", 3), ("n", 3), ("n", "one"), ("logprobs", True), ("logit_bias", {"1": 1}),
        ("model", 7), ("model", "no-such-model"), ("reasoning_effort", 3), ("chat_template_kwargs", "x"),
        ("tools", {"not": "a list"}),
    ]:
        bad_fields.append({**base, field: value})
    out += [("POST", CHAT, json.dumps(b).encode(), {"content-type": "application/json"}) for b in bad_fields]
    comp = [{"prompt": None}, {"prompt": [-1]}, {"prompt": [999999999]}, {"prompt": ["a", "b"]}, {"prompt": "x", "echo": True},
            {"prompt": "x", "suffix": "y"}, {"prompt": [[1], [2]]}, {}]
    out += [("POST", "/v1/completions", json.dumps(b).encode(), {"content-type": "application/json"}) for b in comp]
    out += [
        ("POST", "/tokenize", b'{"content": 5}', {}), ("POST", "/tokenize", b"{}", {}),
        ("POST", "/detokenize", b'{"tokens": ["a"]}', {}), ("POST", "/detokenize", b'{"tokens": [4294967295]}', {}),
        ("POST", "/apply-template", b'{"messages": 1}', {}), ("GET", "/v1/nothing", None, {}),
        ("DELETE", "/v1/models", None, {}), ("GET", CHAT, None, {}), ("PUT", "/health", None, {}),
    ]
    return out


def test_malformed_requests_get_clear_errors_and_the_server_keeps_serving(server):
    cases = malformed_requests()
    assert len(cases) >= 50
    with server.client() as h:
        for method, path, body, headers in cases:
            r = h.request(method, path, content=body, headers=headers)
            assert 400 <= r.status_code < 500, (method, path, body[:80] if body else None, r.status_code, r.text)
            e = error_of(r)
            assert e["message"], r.text
        # A body above the limit: 413, in the same error shape.
        big = {"messages": [{"role": "user", "content": "x" * (129 << 20)}]}
        r = h.post(CHAT, content=json.dumps(big).encode())
        assert r.status_code == 413 and "--max-request-size" in error_of(r)["message"]
        # A body cut short: the declared length is never sent.
        import socket
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n{\"messages\"")
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        reply = sock.recv(4096)
        sock.close()
        assert not reply or reply.startswith(b"HTTP/1.1 4"), reply[:200]
        assert h.get("/health").status_code == 200
        assert h.post(CHAT, json=HELLO).status_code == 200


def test_client_disconnect_cancels_generation(server):
    h = server.client()
    body = {**HELLO, "max_tokens": 60000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=30) as c:
        with c.stream("POST", CHAT, json=body) as r:
            lines = r.iter_lines()
            got = [next(lines) for _ in range(6)]
            assert any(l.startswith("data: ") for l in got)
    # The stream is closed: the sequence is cancelled and its lane freed.
    assert wait_until(lambda: h.get("/status").json()["queue"]["in_flight"] == 0), h.get("/status").json()
    generated = h.get("/status").json()["metrics"]["generated_tokens_total"]
    assert generated < 60000


def test_full_queue_answers_503_with_retry_after(busy_server):
    small_server = busy_server
    # 4 lanes, no queue: the 5th concurrent request is refused.
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60000, "stream": True, "ignore_eos": True}
    streams, clients, readers = [], [], []
    try:
        for _ in range(4):
            c = httpx.Client(base_url=small_server.url, timeout=30)
            clients.append(c)
            s = c.stream("POST", CHAT, json=body)
            lines = s.__enter__().iter_lines()
            next(lines)  # admitted and streaming
            streams.append(s)
            readers.append(lines)  # a dropped line iterator would close its stream
        h = small_server.client()
        # The first streamed line is sent on acceptance; the engine takes a request into a lane
        # at its next step boundary, so the count may lag by a step.
        assert wait_until(lambda: h.get("/status").json()["queue"]["running"] == 4)
        r = h.post(CHAT, json={**body, "stream": False, "max_tokens": 4})
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == "1"
        assert "busy" in error_of(r)["message"]
    finally:
        for s in streams:
            s.__exit__(None, None, None)
        for c in clients:
            c.close()
    h = small_server.client()
    assert wait_until(lambda: h.get("/status").json()["queue"]["in_flight"] == 0)
    assert h.post(CHAT, json={**HELLO, "max_tokens": 2}).status_code == 200


def test_ctrl_c_ends_open_streams_with_an_error_event():
    s = Server()
    try:
        body = {**HELLO, "max_tokens": 60000, "stream": True, "ignore_eos": True}
        with httpx.Client(base_url=s.url, timeout=30) as c, c.stream("POST", CHAT, json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            s.proc.send_signal(signal.SIGINT)
            rest = [l for l in lines if l.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        err = json.loads(rest[-2][len("data: "):])
        assert err["error"]["code"] == "shutting_down"
        assert s.proc.wait(20) == 0
    finally:
        s.stop()


def test_port_in_use_is_refused_with_a_message(server):
    p = subprocess.run([BIN, "serve", "--model", "demo", "--port", str(server.port)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "already in use" in p.stderr and "--port" in p.stderr


def test_memory_plan_refuses_what_cannot_fit_with_the_breakdown():
    p = subprocess.run([BIN, "serve", "--model", "demo", "--port", "0", "--max-memory", "200M"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    for part in ("does not fit", "capped by --max-memory", "weights", "safety reserve", "one sequence",
                 "raise --max-memory"):
        assert part in p.stderr, (part, p.stderr)


def test_memory_plan_lowers_the_context_and_preempts_the_newest_request_past_the_kv_budget():
    # ~330 MB: weights, draft, activations and the 256 MiB reserve leave KV for a few thousand tokens.
    s = Server("--max-memory", "330M")
    try:
        h = s.client()
        status = h.get("/status").json()
        plan = status["memory"]["plan"]
        assert plan["budget_bytes"] == 330 << 20 and plan["lanes"] == 4
        assert status["maximum_context_tokens"] == plan["context_tokens"] == plan["kv_tokens"] < 262144
        assert "memory plan:" in s.log and "lowered to what fits" in s.log
        # Two requests that each grow to 60% of the KV budget: both start (their prompts fit),
        # and when they no longer fit together the newer one is preempted. When the first is
        # cancelled, the second resumes and runs to its end with every token.
        n = int(plan["kv_tokens"] * 0.6)
        second = []

        def post():
            with httpx.Client(base_url=s.url, timeout=300) as c:
                second.append(c.post(CHAT, json={**HELLO, "max_tokens": n, "ignore_eos": True, "temperature": 0}).json())

        batching = lambda: h.get("/status").json()["metrics"]["batching"]  # noqa: E731
        long = {**HELLO, "max_tokens": n, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=s.url, timeout=60) as c, c.stream("POST", CHAT, json=long) as r:
            lines = r.iter_lines()  # kept: a dropped iterator closes the stream
            assert next(lines).startswith("data: ")
            t = threading.Thread(target=post)
            t.start()
            assert wait_until(lambda: batching()["preempted_now"] == 1, timeout=240), batching()
            queue = h.get("/status").json()["queue"]
            assert queue["running"] == 2 and queue["waiting"] == 0, queue
        t.join(300)
        assert second and second[0]["choices"][0]["finish_reason"] == "length", second
        assert second[0]["usage"]["completion_tokens"] == n, second[0]["usage"]
        b = batching()
        assert b["preemptions_total"] >= 1 and b["preempted_now"] == 0, b
        assert b["resumed_from_cache_total"] + b["resumed_by_recompute_total"] >= 1, b
        assert "splash_preemptions_total" in h.get("/metrics").text
    finally:
        s.stop()


# --- Engine: tiny temperatures, idle gauges (issue 30, items 11 and 12) ---


def test_tiny_temperatures_give_the_greedy_text(server):
    h = server.client()
    body = {"messages": [{"role": "user", "content": "Tell me about the sea"}], "max_tokens": 24}

    def text(t):
        r = h.post(CHAT, json={**body, "temperature": t})
        assert r.status_code == 200, r.text
        m = r.json()["choices"][0]["message"]
        return (m.get("reasoning_content"), m.get("content"))

    greedy = text(0)
    # Below 1e-5 is greedy (as vLLM); dividing logits by these used to overflow into noise.
    for t in (5e-6, 1e-30, 1e-38, 1e-40, 1e-45):
        assert text(t) == greedy, t


def test_running_gauge_is_zero_once_requests_end(server):
    h = server.client()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        # A stream the client drops...
        body = {**HELLO, "max_tokens": 30000, "stream": True, "ignore_eos": True}
        with c.stream("POST", CHAT, json=body) as r:
            lines = r.iter_lines()
            assert [next(lines) for _ in range(3)]
        # ...then streams and a plain request that run to their end.
        for _ in range(2):
            with c.stream("POST", CHAT, json={**HELLO, "stream": True}) as r:
                assert [l for l in r.iter_lines() if l][-1] == "data: [DONE]"
        assert c.post(CHAT, json=HELLO).status_code == 200

    def idle():
        queue = h.get("/status").json()["queue"]
        gauges = h.get("/metrics").text.splitlines()
        return (queue["in_flight"], queue["running"], queue["waiting"]) == (0, 0, 0) and {
            "splash_running_requests 0",
            "splash_queue_depth 0",
            "splash_prefill_pending_tokens 0",
        } <= set(gauges)

    assert wait_until(idle, timeout=10), (h.get("/status").json()["queue"], h.get("/metrics").text)


# ---- HTTP hardening: read timeouts, declared sizes, origins (helper "http") ----

import socket  # noqa: E402


def raw_exchange(port, data, wait=20.0, dribble=None):
    """Sends `data` on a fresh connection (a byte every `dribble` seconds if given), then reads
    until the server closes. Returns (seconds until the close or the first reply, reply)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(wait)
    t0 = time.time()
    reply = b""
    try:
        if dribble is None:
            sock.sendall(data)
        else:
            for b in data:
                sock.sendall(bytes([b]))
                time.sleep(dribble)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    return time.time() - t0, reply


@pytest.fixture(scope="module")
def impatient_server():
    s = Server("--header-read-timeout", "1", "--body-read-timeout", "2", "--max-request-size", "1M")
    yield s
    s.stop()


def test_slow_headers_and_unfinished_bodies_are_cut_off(impatient_server):
    port = impatient_server.port
    # Headers dribbled a byte every 0.2 s (never finished within the 1 s header timeout).
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100 + b"\r\n\r\n"
    took, reply = raw_exchange(port, head, dribble=0.2)
    assert took < 8 and b"200 OK" not in reply, (took, reply[:200])
    # A connection that sends nothing is closed too.
    took, reply = raw_exchange(port, b"")
    assert took < 8 and reply == b"", (took, reply)
    # A body shorter than its Content-Length, and a chunked body never finished: 408.
    for body in [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 500\r\n\r\n{\"messages\"",
        b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"mes\r\n",
    ]:
        took, reply = raw_exchange(port, body)
        assert took < 12 and reply.startswith(b"HTTP/1.1 408"), (took, reply[:300])
        assert b"--body-read-timeout" in reply, reply
    assert b'"type":"error"' in reply  # the Messages API's own error shape
    # A declared length over --max-request-size: 413 at once, before any body byte is sent.
    for path, shape in [(b"/v1/chat/completions", b'"code":"request_too_large"'),
                        (b"/v1/messages", b'"type":"request_too_large"')]:
        head = b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2000000\r\n\r\n"
        took, reply = raw_exchange(port, head)
        assert took < 5 and reply.startswith(b"HTTP/1.1 413"), (took, reply[:300])
        assert shape in reply and b"--max-request-size" in reply, reply
    # The server is unharmed, and an ordinary request on a kept-alive connection still works.
    with impatient_server.client() as h:
        assert h.get("/health").status_code == 200
        assert h.post(CHAT, json=HELLO).status_code == 200


def test_same_origin_needs_the_same_scheme(server):
    h = server.client()
    host = f"127.0.0.1:{server.port}"
    for other in [f"https://{host}", f"evil://{host}", host, f"http://127.0.0.1:{server.port + 1}"]:
        r = h.get("/v1/models", headers={"Origin": other})
        assert r.status_code == 403, (other, r.status_code)
        assert "access-control-allow-origin" not in r.headers
        assert "--allowed-origin" in error_of(r)["message"]
    ok = h.get("/v1/models", headers={"Origin": f"http://{host}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == f"http://{host}"


def test_schemas_that_admit_nothing_are_refused_with_400(server):
    h = server.client()
    me = {"$ref": "#"}
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (CHAT, {"messages": msgs, "max_tokens": 8, "reasoning_effort": "none",
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": me}}}, "response_format"),
        (CHAT, {"messages": msgs, "max_tokens": 8, "stream": True,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": me}}}, "response_format"),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 8,
                           "text": {"format": {"type": "json_schema", "name": "x", "schema": me}}}, "text.format"),
        ("/v1/messages", {"model": "demo", "max_tokens": 8, "messages": msgs,
                          "output_config": {"format": {"type": "json_schema", "schema": me}}}, "output_config.format"),
    ]
    for path, body, field in cases:
        r = h.post(path, json=body)
        assert r.status_code == 400, (path, r.status_code, r.text[:500])
        if path == "/v1/messages":
            err = r.json()
            assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
            message = err["error"]["message"]
        else:
            e = error_of(r)
            assert e["type"] == "invalid_request_error" and e["param"] == field, e
            message = e["message"]
        assert field in message and "$ref" in message and "<state>" not in message and len(message) < 400, message
    # A schema llguidance cannot compile: 400 with the reason, without the grammar's text.
    r = h.post(CHAT, json={"messages": msgs, "max_tokens": 8, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}})
    assert r.status_code == 400 and "not" in error_of(r)["message"] and "document:" not in error_of(r)["message"]
    # A forced tool call whose parameters refer to themselves is never a 500.
    for params in [me, {"type": "object", "properties": {"x": me}, "required": ["x"]}]:
        r = h.post(CHAT, json={"messages": msgs, "max_tokens": 40, "reasoning_effort": "none", "tool_choice": "required",
                               "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}]})
        assert r.status_code in (200, 400), (r.status_code, r.text[:500])


def peak_rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmHWM"))


def test_huge_prompts_are_refused_without_stalling_the_server_or_its_memory():
    s = Server()
    try:
        h = s.client()
        limit = h.get("/status").json()["maximum_context_tokens"]
        text = "Lorem ipsum dolor sit amet, consectetur adipiscing elit.\n" * ((16 << 20) // 57)
        chat = json.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()
        messages = json.dumps({"model": "demo", "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()
        answers = []

        def post(path, body):
            with httpx.Client(base_url=s.url, timeout=300) as c:
                answers.append(c.post(path, content=body, headers={"content-type": "application/json"}))

        # Two 16 MiB chat bodies at once: /health keeps answering while they are tokenized.
        posts = [threading.Thread(target=post, args=a) for a in ((CHAT, chat), ("/v1/messages", messages))]
        for t in posts:
            t.start()
        slowest = 0.0
        while any(t.is_alive() for t in posts):
            t0 = time.time()
            assert h.get("/health").status_code == 200
            slowest = max(slowest, time.time() - t0)
            time.sleep(0.02)
        assert slowest < 1.0, slowest
        for r in answers:
            assert r.status_code == 400, r.text[:300]
            message = r.json()["error"]["message"]
            assert f"context limit is {limit} tokens" in message, message
        openai_answer, anthropic_answer = sorted(answers, key=lambda r: r.url.path)
        assert error_of(openai_answer)["code"] == "context_length_exceeded"
        assert anthropic_answer.json()["error"]["type"] == "invalid_request_error"
        # /tokenize of a 100 MiB text: refused past the context, without gigabytes of memory
        # (it peaked at 10.9 GB for 127 MiB when every token was kept with its bookkeeping).
        big = json.dumps({"content": text * 6}).encode()
        r = h.post("/tokenize", content=big, headers={"content-type": "application/json"}, timeout=300)
        assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded", r.text[:300]
        assert "/tokenize" in error_of(r)["message"]
        assert peak_rss_mib(s.proc.pid) < 2048, peak_rss_mib(s.proc.pid)
        # Texts within the limit are tokenized as before.
        ids = h.post("/tokenize", json={"content": "hello\nworld"}).json()["tokens"]
        assert ids and h.post("/detokenize", json={"tokens": ids}).json()["content"] == "hello\nworld"
        assert h.post(CHAT, json=HELLO).status_code == 200
    finally:
        s.stop()
