"""`splash serve-multi`: one port, two checkpoints (the demo and the tiny dense fixture), one
engine at a time. Concurrent requests for both models are all answered, with what single-model
servers answer; streams are not cut by a switch; unknown models, switch timeouts and failed
loads get clear errors."""

import json
import threading

import httpx
import pytest

from splash_server import ROOT, Server

DEMO = str(ROOT / "models" / "demo")
DENSE = str(ROOT / "tests" / "fixtures" / "qwen35-dense")
CHAT = [{"role": "user", "content": c} for c in ["What is 2 + 3?", "What is the capital of France?", "hello"]]
PROMPTS = ["Hello", "The quick brown", "1 2 3"]


def config(tmp_path, models):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": models}))
    return str(path)


def multi(tmp_path, models, *args):
    return Server(*args, argv=["serve-multi", "--config", config(tmp_path, models)])


def chat(h, model, message, **kw):
    named = {"model": model} if model else {}
    r = h.post("/v1/chat/completions", json={**named, "messages": [message], "max_tokens": 24,
                                              "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def complete(h, model, prompt):
    named = {"model": model} if model else {}
    r = h.post("/v1/completions", json={**named, "prompt": prompt, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def expected():
    """What single-model servers answer."""
    out = {}
    for model, ask, inputs in [(DEMO, chat, CHAT), (DENSE, complete, PROMPTS)]:
        s = Server(model=model)
        try:
            with s.client() as h:
                out[model] = [ask(h, None, x) for x in inputs]
        finally:
            s.stop()
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    s = multi(tmp_path_factory.mktemp("multi"), [
        {"model": DEMO, "aliases": ["small"]},
        {"model": DENSE, "aliases": ["dense"], "max_context": 512},
    ])
    yield s
    s.stop()


def test_models_are_listed_with_the_loaded_one(two):
    with two.client() as h:
        chat(h, "small", CHAT[0])
        data = h.get("/v1/models").json()
        ids = [m["id"] for m in data["data"]]
        assert ids == [DEMO, "small", DENSE, "dense"]
        assert [m["loaded"] for m in data["data"]] == [True, True, False, False]
        assert [m["name"] for m in data["models"]] == ids
        st = h.get("/status").json()
        assert st["loaded"] == DEMO and st["models"][0]["state"] == "loaded"
        assert st["engine"]["model_ids"][0] == "demo"
        r = h.post("/v1/chat/completions", json={"model": "gpt-4", "messages": [CHAT[0]]})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "small" in r.json()["error"]["message"]
        r = h.post("/v1/messages", json={"model": "gpt-4", "max_tokens": 5, "messages": [CHAT[0]]})
        assert r.status_code == 404 and r.json()["type"] == "error"


def test_concurrent_requests_for_both_models_switch_and_lose_nothing(two, expected):
    results, errors = {}, []

    def ask(key, fn, model, x):
        try:
            with two.client() as h:
                results[key] = fn(h, model, x)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"{key}: {e!r}")

    threads = []
    for round_ in range(2):
        for i, m in enumerate(CHAT):
            threads.append(threading.Thread(target=ask, args=(("demo", round_, i), chat, "small", m)))
        for i, p in enumerate(PROMPTS):
            threads.append(threading.Thread(target=ask, args=(("dense", round_, i), complete, "dense", p)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(results) == 12
    for (model, _, i), out in results.items():
        assert out == expected[DEMO if model == "demo" else DENSE][i], (model, i)
    with two.client() as h:
        st = h.get("/status").json()
    assert st["switches"] >= 2 and st["in_flight"] == 0 and not st["queued"]


def test_a_stream_finishes_before_the_switch(two):
    with two.client() as h:
        chat(h, "small", CHAT[0])  # the demo is loaded
        body = {"model": "small", "messages": [CHAT[2]], "max_tokens": 200, "ignore_eos": True, "stream": True,
                "temperature": 0}
        done = {}

        def other():
            with two.client() as h2:
                done["dense"] = complete(h2, "dense", "Hello")

        with h.stream("POST", "/v1/chat/completions", json=body) as s:
            lines = s.iter_lines()
            next(lines)
            t = threading.Thread(target=other)
            t.start()
            chunks = [line for line in lines if line.startswith("data: {")]
            assert "dense" not in done  # waited for the stream
        t.join(120)
        assert done["dense"] and '"finish_reason":"length"' in chunks[-1]


def test_switch_timeout_zero_and_failed_loads(tmp_path):
    s = multi(tmp_path, [{"model": DEMO}, {"model": str(tmp_path / "missing")}], "--switch-timeout", "0")
    try:
        with s.client() as h:
            r = h.post("/v1/chat/completions", json={"model": DEMO, "messages": [CHAT[0]]})
            assert r.status_code == 503 and r.json()["error"]["code"] == "model_switching"
            assert r.headers["retry-after"] == "2"
    finally:
        s.stop()
    s = multi(tmp_path, [{"model": DEMO}, {"model": str(tmp_path / "missing"), "aliases": ["broken"]}])
    try:
        with s.client() as h:
            r = h.post("/v1/chat/completions", json={"model": "broken", "messages": [CHAT[0]]})
            assert r.status_code == 503, r.text
            err = r.json()["error"]
            assert err["code"] == "model_load_failed" and "missing" in err["message"]
            assert h.get("/status").json()["models"][1]["state"] == "failed"
            assert chat(h, DEMO, CHAT[0])  # the other model still loads and answers
    finally:
        s.stop()


def test_api_key_is_checked_by_the_front_and_the_engine(tmp_path):
    s = multi(tmp_path, [{"model": DEMO}], "--api-key", "k3y")
    try:
        with s.client() as h:
            r = h.post("/v1/chat/completions", json={"messages": [CHAT[0]]})
            assert r.status_code == 401
            key = {"Authorization": "Bearer k3y"}
            assert h.get("/status").status_code == 401
            assert h.get("/status", headers=key).json()["loaded"] is None  # nothing was loaded
            r = h.post("/v1/chat/completions", headers=key, json={"messages": [CHAT[0]], "max_tokens": 4})
            assert r.status_code == 200, r.text  # no model named: the first one
    finally:
        s.stop()


def test_bad_configs_are_refused_at_start(tmp_path):
    import subprocess

    from splash_server import BIN

    for models, words in [
        ([], "nonempty array"),
        ([{"model": DEMO, "arguments": ["--port", "9"]}], "serve-multi itself"),
        ([{"model": DEMO}, {"model": DENSE, "aliases": [DEMO]}], "used twice"),
    ]:
        r = subprocess.run([BIN, "serve-multi", "--config", config(tmp_path, models), "--port", "0"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0 and words in r.stderr, r.stderr


def test_preload_loads_before_any_request(tmp_path):
    import time

    s = multi(tmp_path, [{"model": DEMO}, {"model": DENSE, "aliases": ["dense"], "preload": True}])
    try:
        with s.client() as h:
            for _ in range(200):
                st = h.get("/status").json()
                if st["loaded"] == DENSE:
                    break
                time.sleep(0.1)
            assert st["loaded"] == DENSE and st["switches"] == 1, st
            # A request that names no model goes to the loaded one.
            r = h.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2})
            assert r.status_code == 200 and r.json()["model"] == "qwen35-dense"
    finally:
        s.stop()
