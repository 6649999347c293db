"""The OpenAI API of `splash serve`, driven by the real `openai` Python SDK."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest


def sdk(server, **kw):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, **kw)


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": content}], **kw
    )


def test_models_lists_id_then_alias(server):
    models = sdk(server).models.list()
    ids = [m.id for m in models.data]
    assert ids == ["demo", "splash-alias"]
    card = models.data[0].model_dump()
    assert card["max_model_len"] == card["context_length"] == 65536
    assert sdk(server).models.retrieve("splash-alias").id == "splash-alias"
    with pytest.raises(openai.NotFoundError) as e:
        sdk(server).models.retrieve("gpt-4o")
    assert e.value.body["code"] == "model_not_found"


def test_chat_non_streaming_usage_and_reasoning(server):
    c = sdk(server)
    r = chat(c, "hi", temperature=0, max_tokens=20, extra_body={"ignore_eos": True})
    choice = r.choices[0]
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 20
    # Thinking is on by default in the Qwen3.5 template: the text is reasoning.
    extra = choice.message.model_extra
    assert extra.get("reasoning_content")
    # prompt_tokens equals the tokenized template rendering.
    h = server.client()
    prompt = h.post("/apply-template", json={"messages": [{"role": "user", "content": "hi"}]}).json()["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n<think>\n")
    tokens = h.post("/tokenize", json={"content": prompt}).json()["tokens"]
    assert r.usage.prompt_tokens == len(tokens)
    assert r.model_extra["timings"]["predicted_n"] == 20


def test_reasoning_effort_none_gives_plain_content(server):
    r = chat(sdk(server), "hi", temperature=0, reasoning_effort="none", max_tokens=8, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content
    assert not r.choices[0].message.model_extra.get("reasoning_content")
    prompt = server.client().post(
        "/apply-template", json={"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"}
    ).json()["prompt"]
    assert prompt.endswith("<think>\n\n</think>\n\n")
    with pytest.raises(openai.BadRequestError) as e:
        chat(sdk(server), "hi", reasoning_effort="extreme")
    assert e.value.body["param"] == "reasoning_effort"


def test_streaming_matches_non_streaming_and_reports_usage(server):
    c = sdk(server)
    args = dict(temperature=0, max_tokens=16, reasoning_effort="none", extra_body={"ignore_eos": True})
    whole = chat(c, "Tell me a story", **args).choices[0].message.content
    chunks = list(chat(c, "Tell me a story", stream=True, stream_options={"include_usage": True}, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert [f.choices[0].finish_reason for f in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_stop_sequence_ends_the_answer_before_it(server):
    c = sdk(server)
    args = dict(temperature=0, max_tokens=30, reasoning_effort="none", extra_body={"ignore_eos": True})
    full = chat(c, "count", **args).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), full
    r = chat(c, "count", stop=[stop], **args)
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        chat(c, "count", stop=["a", "b", "c", "d", "e"])
    assert e.value.body["param"] == "stop"


def test_seed_makes_sampling_reproducible(server):
    c = sdk(server)
    args = dict(temperature=1.0, max_tokens=16, reasoning_effort="none", extra_body={"ignore_eos": True})
    a = chat(c, "hello", seed=11, **args).choices[0].message.content
    b = chat(c, "hello", seed=11, **args).choices[0].message.content
    d = chat(c, "hello", seed=12, **args).choices[0].message.content
    assert a == b
    assert a != d


def test_concurrent_requests_get_their_own_answers(server):
    c = sdk(server)
    prompts = [f"question number {i}" for i in range(6)]
    args = dict(temperature=0, max_tokens=12, reasoning_effort="none", extra_body={"ignore_eos": True})
    solo = [chat(c, p, **args).choices[0].message.content for p in prompts]
    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(lambda p: chat(c, p, **args).choices[0].message.content, prompts))
    assert together == solo


def test_completions_text_and_token_prompts(server):
    c = sdk(server)
    r = c.completions.create(model="demo", prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16  # OpenAI's default max_tokens
    ids = server.client().post("/tokenize", json={"content": "Once upon a time"}).json()["tokens"]
    r2 = c.completions.create(model="demo", prompt=ids, temperature=0, max_tokens=16, extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r.choices[0].text
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(
            model="demo", prompt="Once upon a time", temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        if ch.choices
    )
    assert streamed == r.choices[0].text
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="demo", prompt=["a", "b"])
    assert e.value.body["param"] == "prompt"


def test_unsupported_options_are_refused_by_name(server):
    c = sdk(server)
    for kw, param in [
        (dict(n=2), "n"),
        (dict(logprobs=True), "logprobs"),
        (dict(logit_bias={"10": 5}), "logit_bias"),
        (dict(response_format={"type": "xml"}), "response_format.type"),
        (dict(response_format={"type": "json_object"}, tool_choice="required",
              tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), "response_format"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            chat(c, "hi", **kw)
        assert e.value.body["param"] == param, kw


def test_context_overflow(server, small_server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(sdk(server), "hi", max_tokens=10**7)
    assert e.value.body["code"] == "context_length_exceeded"
    assert "65536" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        chat(sdk(small_server), "word " * 100, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    # Without max_tokens the answer may use the rest of the context, and stops there.
    r = chat(sdk(small_server), "hi", max_tokens=None, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 64
    assert r.choices[0].finish_reason == "length"


def test_utility_endpoints(server):
    h = server.client()
    toks = h.post("/tokenize", json={"content": "<|im_start|>user\nhi<|im_end|>"}).json()["tokens"]
    assert toks == [8159, 373, 1152, 8160]  # the demo's 8K vocabulary: "user\n" and "hi" are one token each
    assert h.post("/detokenize", json={"tokens": toks}).json()["content"] == "<|im_start|>user\nhi<|im_end|>"
    assert h.get("/health").json() == {"status": "ok"}
    assert h.get("/ready").status_code == 200
    status = h.get("/status").json()
    assert status["model"] == "demo" and status["maximum_context_tokens"] == 65536
    assert {"waiting", "running", "lanes"} <= set(status["queue"])
    metrics = h.get("/metrics").text
    assert "splash_requests_total" in metrics and "splash_time_to_first_token_seconds_bucket" in metrics
    assert h.get("/").status_code == 200
