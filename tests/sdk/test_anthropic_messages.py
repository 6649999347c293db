"""The Anthropic Messages API of `splash serve`, driven by the real `anthropic` Python SDK."""

import json

import anthropic
import httpx
import jsonschema
import pytest

WEATHER = {"name": "get_weather", "description": "Weather forecast", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}


def client(server, **kw):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, **kw)


def test_message_non_streaming(server):
    m = client(server).messages.create(
        model="claude-sonnet-5", max_tokens=12, messages=[{"role": "user", "content": "Hello"}],
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        metadata={"user_id": "u1"}, extra_body={"temperature": 0},
    )
    assert m.type == "message" and m.role == "assistant" and m.model == "claude-sonnet-5"
    assert m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert 0 < m.usage.output_tokens <= 12 and m.usage.input_tokens > 0
    assert m.stop_reason == ("max_tokens" if m.usage.output_tokens == 12 else "end_turn")


def test_stream_event_sequence(server):
    with client(server).messages.stream(model="claude-opus-4", max_tokens=10,
                                        messages=[{"role": "user", "content": "Count to three"}]) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[1] == "content_block_start"
    assert kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert "text" in kinds  # the SDK's text event, one per text_delta
    assert final.content[0].type == "text" and final.usage.output_tokens <= 10


def test_golden_raw_event_sequence(server):
    """The wire order Claude Code relies on, including ping and the named SSE events."""
    # A forced call with room to finish, greedy: the tool_use block is always there.
    body = {"model": "claude-x", "max_tokens": 200, "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": {"type": "any"}, "tools": [WEATHER], "temperature": 0}
    with httpx.Client(base_url=server.url, timeout=60) as h, h.stream("POST", "/v1/messages?beta=true", json=body) as r:
        names = [l[len("event: "):] for l in r.iter_lines() if l.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"}


def test_thinking_blocks(server):
    greedy = {"temperature": 0, "ignore_eos": True}
    m = client(server).messages.create(model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "Think first"}],
                                       thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=greedy)
    assert m.content[0].type == "thinking" and m.content[0].thinking
    with client(server).messages.stream(model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "Think"}],
                                        thinking={"type": "enabled", "budget_tokens": 1024}, extra_body=greedy) as s:
        kinds = [e.type for e in s]
    assert "thinking" in kinds and "signature" in kinds


def test_forced_tool_use_and_round_trip(server):
    c = client(server)
    m = c.messages.create(model="claude-x", max_tokens=200, messages=[{"role": "user", "content": "Weather in Oslo?"}],
                          tools=[WEATHER, {"type": "web_search_20250305", "name": "web_search"}], tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use"
    (use,) = [b for b in m.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER["input_schema"])
    # Streamed: input_json_delta fragments assemble to the same kind of input.
    with c.messages.stream(model="claude-x", max_tokens=200, messages=[{"role": "user", "content": "Weather?"}],
                           tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}) as s:
        events = list(s)
        final = s.get_final_message()
    assert any(e.type == "input_json" for e in events)
    jsonschema.validate(final.content[-1].input, WEATHER["input_schema"])
    # call → result → answer through the template.
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "4°C, cloudy"}]},
    ]
    answer = c.messages.create(model="claude-x", max_tokens=8, messages=history, tools=[WEATHER],
                               extra_body={"temperature": 0, "ignore_eos": True})
    assert answer.content
    n = c.messages.count_tokens(model="claude-x", messages=history, tools=[WEATHER])
    assert n.input_tokens > 0


def test_structured_output_config(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["ok", "n"], "additionalProperties": False}
    m = client(server).messages.create(model="claude-x", max_tokens=100, messages=[{"role": "user", "content": "JSON"}],
                                       output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_count_tokens_ignores_billing_header(server):
    c = client(server)
    msgs = [{"role": "user", "content": "hi"}]
    a = c.messages.count_tokens(model="claude-x", messages=msgs,
                                system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.92; cch=1a2b3;"},
                                        {"type": "text", "text": "You are Claude Code."}])
    b = c.messages.count_tokens(model="claude-x", messages=msgs,
                                system=[{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.92; cch=ffff0;"},
                                        {"type": "text", "text": "You are Claude Code."}])
    plain = c.messages.count_tokens(model="claude-x", messages=msgs, system="You are Claude Code.")
    assert a.input_tokens == b.input_tokens == plain.input_tokens


def test_errors_in_anthropic_shape(server, keyed_server):
    c = client(server)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="gpt-4o", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="claude-x", max_tokens=4, messages=[{"role": "developer", "content": "x"}])
    assert "role" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        c.messages.create(model="claude-x", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    with pytest.raises(anthropic.AuthenticationError) as e:
        client(keyed_server).messages.create(model="claude-x", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    ok = anthropic.Anthropic(base_url=keyed_server.url, api_key="sekret-key", max_retries=0)
    assert ok.messages.create(model="claude-x", max_tokens=2, messages=[{"role": "user", "content": "x"}]).type == "message"


def test_max_tokens_beyond_context_is_clamped(small_server):
    m = client(small_server).messages.create(model="claude-x", max_tokens=20000, messages=[{"role": "user", "content": "hi"}],
                                             extra_body={"ignore_eos": True})
    assert m.stop_reason == "model_context_window_exceeded"
    # input_tokens leaves out what the prefix cache served (an earlier test may have sent "hi").
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) + m.usage.output_tokens == 64
