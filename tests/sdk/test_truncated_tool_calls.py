"""A tool call cut short by `max_tokens` comes back as a call, never as text, on every API.

What each API returns for a truncated call: Chat `finish_reason: "length"` with the partial
arguments string in `message.tool_calls`; Messages `stop_reason: "max_tokens"` with a `tool_use`
block whose `input` is what could be read of the arguments (the stream's `input_json_delta`s
carry the text generated); Responses `status: "incomplete"` (`max_output_tokens`) with a
`function_call` item of status `incomplete`. Both call forms are covered: Qwen3.5's XML form
(the demo model's template) and the JSON form `{"name": ..., "arguments": ...}` (the demo
model with a template that does not write the XML form, so splash's call grammar and parser
use the JSON form, as for Qwen3 / Qwen2.5 checkpoints). Greedy decoding keeps each cut point
the same from run to run; sweeping `max_tokens` cuts the call at every token.
"""

import json
import shutil
from pathlib import Path

import anthropic
import httpx
import pytest

from conftest import ROOT, Server
from test_openai_api import sdk

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
MARKUP = ["<tool_call>", "</tool_call>", "<function", "</function", "<parameter", "</parameter", '{"name"', "<tool_c"]


def no_markup(text):
    return not any(m in (text or "") for m in MARKUP)


@pytest.fixture(scope="module")
def json_form_server(tmp_path_factory):
    """The demo model with its template's XML call examples renamed: splash then uses the JSON form."""
    d = tmp_path_factory.mktemp("models") / "jsonform"
    shutil.copytree(ROOT / "models" / "demo", d, ignore=shutil.ignore_patterns("draft"))
    t = d / "chat_template.jinja"
    t.write_text(t.read_text().replace("<function=", "<function_"))
    s = Server(env={"SPLASH_DEMO_DIR": str(d)})
    s.model = "jsonform"
    yield s
    s.stop()


@pytest.fixture(scope="module", params=["xml", "json"])
def form(request, server, json_form_server):
    """(server, model name, max_tokens that cut the forced call) for each call form."""
    if request.param == "xml":
        return server, "demo", [4, 5, 7, 8]
    # The JSON form is one the demo never trained on: how long its call is depends on the
    # weights, so the cuts are counted back from the whole call's length.
    whole = chat(json_form_server, json_form_server.model, 80)
    assert whole.choices[0].finish_reason == "tool_calls", whole
    n = whole.usage.completion_tokens
    return json_form_server, json_form_server.model, [n - 8, n - 5, n - 3, n - 1]


def chat(server, model, n, **kw):
    kw.setdefault("tools", [READ])
    kw.setdefault("tool_choice", "required")
    return sdk(server).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Read src/main.rs"}], max_tokens=n,
        reasoning_effort="none", temperature=0, **kw)


def test_chat_forced_call_cut_at_every_token(form):
    server, model, budgets = form
    cut_calls = 0
    for n in range(1, 40):
        choice = chat(server, model, n).choices[0]
        assert choice.finish_reason in ("length", "tool_calls"), n
        assert no_markup(choice.message.content), (n, choice.message.content)
        calls = choice.message.tool_calls or []
        assert len(calls) <= 1 and all(c.function.name == "read_file" for c in calls), n
        if choice.finish_reason == "tool_calls":
            # Complete arguments (what path the demo picks in a call form it never trained on
            # is not the point: `{"path": ""}` is a valid call).
            assert calls and isinstance(json.loads(calls[0].function.arguments)["path"], str)
        elif calls:
            # The arguments generated so far: the start of a JSON object (or nothing yet).
            args = calls[0].function.arguments
            assert args == "" or args.startswith("{"), (n, args)
            cut_calls += 1
    assert cut_calls >= 3


def test_chat_streaming_cut_call_matches_non_streaming(form):
    server, model, budgets = form
    for n in budgets:
        whole = chat(server, model, n).choices[0]
        chunks = list(chat(server, model, n, stream=True))
        deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
        content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        assert finish == [whole.finish_reason] and no_markup(content), n
        if whole.message.tool_calls:
            assert deltas[0].function.name == "read_file"
            args = "".join(d.function.arguments or "" for d in deltas)
            assert args == whole.message.tool_calls[0].function.arguments, n
        else:
            assert not deltas, n


def test_chat_unforced_call_cut_never_leaks_markup(server):
    """The model calls a tool on its own (XML markup in free text) and runs out of tokens."""
    cut = 0
    for n in range(1, 40):
        choice = sdk(server).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Use get_weather for Oslo."}], max_tokens=n,
            reasoning_effort="none", temperature=0, tools=[WEATHER]).choices[0]
        assert no_markup(choice.message.content), (n, choice.message.content)
        cut += bool(choice.message.tool_calls) and choice.finish_reason == "length"
    assert cut >= 3


def anthropic_client(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def messages_request(model, n):
    return dict(model=model, max_tokens=n, messages=[{"role": "user", "content": "Read src/main.rs"}],
                tools=[{"name": "read_file", "description": "Read a file", "input_schema": READ["function"]["parameters"]}],
                tool_choice={"type": "tool", "name": "read_file"}, temperature=0)


def create_message(server, model, n):
    body = messages_request(model, n)
    body["extra_body"] = {"temperature": body.pop("temperature")}
    return anthropic_client(server).messages.create(**body)


def test_messages_cut_call_is_a_tool_use_block(form):
    server, model, budgets = form
    cut = 0
    for n in budgets:
        m = create_message(server, model, n)
        assert all(b.type != "text" or no_markup(b.text) for b in m.content), n
        uses = [b for b in m.content if b.type == "tool_use"]
        if m.stop_reason == "tool_use":
            assert isinstance(uses[0].input["path"], str)
            continue
        assert m.stop_reason == "max_tokens", n
        if uses:
            cut += 1
            (use,) = uses
            assert use.name == "read_file" and isinstance(use.input, dict) and set(use.input) <= {"path"}
    assert cut >= 2


def test_messages_stream_carries_the_partial_arguments(form):
    server, model, budgets = form
    for n in budgets:
        with httpx.stream("POST", server.url + "/v1/messages", json={**messages_request(model, n), "stream": True},
                           timeout=60) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
        starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
        deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
        stop = [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"]
        assert all(d["type"] != "text_delta" or no_markup(d["text"]) for d in deltas), n
        if stop == ["tool_use"]:
            continue
        assert stop == ["max_tokens"], n
        if any(b["type"] == "tool_use" for b in starts):
            partial = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
            assert partial == "" or partial.startswith("{"), (n, partial)
            whole = create_message(server, model, n)
            (use,) = [b for b in whole.content if b.type == "tool_use"]
            if "path" in use.input:
                # The object read from the cut arguments holds the value generated so far.
                assert json.dumps(use.input["path"], ensure_ascii=False)[:-1] in partial, n


def test_responses_cut_call_is_an_incomplete_function_call(form):
    server, model, budgets = form

    def request(n):
        return dict(model=model, input="Read src/main.rs", max_output_tokens=n, tools=[{
            "type": "function", "name": "read_file", "parameters": READ["function"]["parameters"]}],
            tool_choice="required", reasoning={"effort": "none"}, temperature=0)

    if model != "demo":
        # Responses renders its own prompt, so the JSON-form call's length is counted again.
        n = sdk(server).responses.create(**request(80)).usage.output_tokens
        budgets = [n - 8, n - 5, n - 3, n - 1]
    cut = 0
    for n in budgets:
        for stream in [False, True]:
            kw = request(n)
            if stream:
                events = list(sdk(server).responses.create(stream=True, **kw))
                r = events[-1].response
            else:
                r = sdk(server).responses.create(**kw)
            assert no_markup(r.output_text), n
            calls = [i for i in r.output if i.type == "function_call"]
            if r.status == "completed":
                assert calls[0].status == "completed" and isinstance(json.loads(calls[0].arguments)["path"], str)
                continue
            assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens", n
            if calls:
                (call,) = calls
                assert call.name == "read_file", n
                if call.status == "completed":
                    # The call was complete; the cut came after it (inside `</tool_call>`).
                    assert isinstance(json.loads(call.arguments)["path"], str)
                    continue
                cut += 1
                assert call.status == "incomplete", n
                assert call.arguments == "" or call.arguments.startswith("{")
    assert cut >= 2
