"""Structured output (JSON schema) and tool calls through the chat API, with the real `openai`
SDK. The schema, not the model, makes the output valid: these run greedy and check the constraint."""

import json
import re

import jsonschema
import openai
import pytest

from test_openai_api import sdk

INT = {"type": "integer", "minimum": -1000, "maximum": 1000}

SCHEMAS = [
    {"type": "object", "properties": {"n": INT}, "required": ["n"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["ok", "score"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3}},
     "required": ["tags"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"id": INT, "email": {"type": "string", "maxLength": 20}},
                                              "required": ["id", "email"], "additionalProperties": False}}, "required": ["user"]},
    {"type": "object", "properties": {"points": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "x": INT, "y": INT}, "required": ["x", "y"], "additionalProperties": False}}}, "required": ["points"]},
    {"type": "object", "properties": {"kind": {"const": "event"}, "when": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
     "required": ["kind", "when"]},
    {"type": "object", "properties": {"value": {"anyOf": [INT, {"type": "string", "maxLength": 5}]}}, "required": ["value"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {"type": "array", "maxItems": 2, "items": INT}}},
     "required": ["matrix"]},
    {"type": "object", "properties": {"status": {"enum": ["ok", "fail"]}, "detail": {"type": ["string", "null"], "maxLength": 8}},
     "required": ["status", "detail"]},
]

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": False}}}


def closed(schema):
    """Without `additionalProperties: false` a weak model may keep adding keys."""
    s = json.loads(json.dumps(schema))
    s.setdefault("additionalProperties", False)
    return s


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
def test_json_schema_output_validates(server, i):
    schema = closed(SCHEMAS[i])
    r = sdk(server).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Answer in JSON."}],
        max_tokens=600,
        reasoning_effort="none",
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}},
    )
    content = r.choices[0].message.content
    if r.choices[0].finish_reason == "length":
        # A number schema bounds no digits (JSON Schema has no such keyword, and llguidance no
        # cap), so the demo may write a number's digits until max_tokens (`0.7112850900000…`): a
        # valid prefix, which says nothing about the constraint. Check what came before them.
        run = re.search(r"[0-9]{100,}$", content)
        assert run, content
        content = content[: run.start() + 1]
        content += "]" * (content.count("[") - content.count("]")) + "}" * (content.count("{") - content.count("}"))
    else:
        assert r.choices[0].finish_reason == "stop", content
    doc = json.loads(content)
    jsonschema.validate(doc, schema)
    assert r.model_extra["timings"]["grammar_masks"] > 0


def test_json_object_and_streamed_json(server):
    c = sdk(server)
    r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "JSON please"}], max_tokens=300,
                                  reasoning_effort="none", response_format={"type": "json_object"}, seed=3)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    schema = closed(SCHEMAS[3])
    chunks = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "JSON please"}], max_tokens=300,
                                       reasoning_effort="none", stream=True, seed=4,
                                       response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    jsonschema.validate(json.loads(text), schema)


def test_invalid_schema_is_a_clear_400(server):
    with pytest.raises(openai.BadRequestError) as e:
        sdk(server).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "x"}], reasoning_effort="none",
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "no-such-type"}}})
    assert "constraint" in e.value.body["message"]


def test_forced_tool_call_non_streaming(server):
    r = sdk(server).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}], max_tokens=200,
        reasoning_effort="none", tools=[WEATHER, TIME], tool_choice="required", seed=1)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    args = json.loads(call.function.arguments)
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]["parameters"]
    jsonschema.validate(args, schema)
    assert not choice.message.content


def test_named_tool_call_streams_as_tool_call_deltas(server):
    chunks = list(sdk(server).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "What time is it?"}], max_tokens=200, reasoning_effort="none",
        tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}, stream=True, seed=2))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_time"
    args = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(args), TIME["function"]["parameters"])
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def test_tool_choice_errors(server):
    c = sdk(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}], tools=[WEATHER],
                                  tool_choice={"type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice" and "nope" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "x"}], tool_choice="required")


def test_call_result_answer_round_trip(server):
    """call → result → answer: the tool call and its result go back through the template."""
    c = sdk(server)
    first = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": "Weather in Oslo?"}],
                                      max_tokens=200, reasoning_effort="none", tools=[WEATHER], tool_choice="required", seed=5)
    call = first.choices[0].message.tool_calls[0]
    history = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 4, "sky": "cloudy"}'},
    ]
    prompt = server.client().post("/apply-template", json={"messages": history, "tools": [WEATHER]}).json()["prompt"]
    args = json.loads(call.function.arguments)
    assert f"<tool_call>\n<function=get_weather>\n<parameter=city>\n{args['city']}\n</parameter>" in prompt
    assert "<tool_response>\n{\"temp_c\": 4, \"sky\": \"cloudy\"}\n</tool_response>" in prompt
    answer = c.chat.completions.create(model="demo", messages=history, tools=[WEATHER], max_tokens=16, reasoning_effort="none",
                                       extra_body={"ignore_eos": True}, temperature=0)
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls


def test_strict_tools_constrain_calls_the_model_chooses(server):
    strict = {"type": "function", "function": {**WEATHER["function"], "strict": True}}
    calls = 0
    for seed in range(4):
        r = sdk(server).chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}], max_tokens=60,
            reasoning_effort="none",
            tools=[strict], seed=seed, temperature=1.0)
        for call in r.choices[0].message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
            calls += 1
            # The grammar applies from the opening tag: only a call is masked.
            assert r.model_extra["timings"]["grammar_masks"] > 0
        assert "<tool_call>" not in (r.choices[0].message.content or "")
    assert calls > 0


def test_calls_under_auto_follow_the_offered_tools(server):
    """Under `auto`, a call the model starts is held to the offered tools and their schemas (from its
    opening tag on, as llama.cpp's lazy grammars do): asked for the weather, the demo would call the
    `get_weather` it trained on; offered only an unfamiliar tool, every call it makes is to that tool,
    with arguments its schema allows, in every API."""
    code = {"type": "string", "enum": ["PAR-1", "OSA-2"]}
    params = {"type": "object", "properties": {"code": code, "note": {"type": "string"}}, "required": ["code"]}
    c = sdk(server)
    calls = 0
    for seed in range(6):
        r = c.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "What is the weather in Osaka right now?"}],
            max_tokens=120, tools=[{"type": "function", "function": {"name": "zq_lookup_7", "parameters": params}}],
            seed=seed, temperature=1.0)
        for call in r.choices[0].message.tool_calls or []:
            assert call.function.name == "zq_lookup_7"
            jsonschema.validate(json.loads(call.function.arguments), params)
            calls += 1
        r = c.responses.create(
            model="demo", input="What is the weather in Osaka right now?", max_output_tokens=120,
            tools=[{"type": "function", "name": "zq_lookup_7", "parameters": params}], temperature=1.0)
        for item in r.output:
            if item.type == "function_call":
                assert item.name == "zq_lookup_7"
                jsonschema.validate(json.loads(item.arguments), params)
                calls += 1
    assert calls >= 3, calls


def test_undeclared_keys_are_refused_in_tool_arguments_and_strict_formats(server):
    """Where a schema leaves `additionalProperties` out, tool arguments and `strict` formats take only the
    declared keys (as OpenAI's strict mode reads it). The non-strict format is the control: left to JSON
    Schema's default, the model adds keys of its own."""
    c = sdk(server)
    place = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"]}
    locate = {"type": "function", "function": {"name": "locate", "parameters": {
        "type": "object", "properties": {"place": place}, "required": ["place"]}}}
    ask = [{"role": "user", "content": "Where is Paris?"}]

    def fmt(strict):
        return {"type": "json_schema", "json_schema": {"name": "place", "schema": place, "strict": strict}}

    def keys(text):
        try:
            return set(json.loads(text))
        except ValueError:
            return {"<cut by max_tokens>"}

    loose_extra = 0
    for seed in range(6):
        kw = dict(model="demo", messages=ask, max_tokens=80, reasoning_effort="none", temperature=1.0, seed=seed)
        call = c.chat.completions.create(tools=[locate], tool_choice="required", **kw).choices[0].message.tool_calls[0]
        assert set(json.loads(call.function.arguments)) == {"place"}
        assert set(json.loads(call.function.arguments)["place"]) == {"city"}
        assert keys(c.chat.completions.create(response_format=fmt(True), **kw).choices[0].message.content) == {"city"}
        loose_extra += keys(c.chat.completions.create(response_format=fmt(False), **kw).choices[0].message.content) != {"city"}
    assert loose_extra > 0
