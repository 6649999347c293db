"""The OpenAI Responses API of `splash serve` (what Codex speaks), with the real `openai` SDK."""

import json

import jsonschema
import openai
import pytest

from test_openai_api import sdk

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}


def test_plain_response(server):
    r = sdk(server).responses.create(model="demo", input="Say hello", max_output_tokens=8,
                                     reasoning={"effort": "none"}, extra_body={"ignore_eos": True})
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].type == "message" and r.output_text == r.output[0].content[0].text
    assert r.usage.output_tokens == 8 and r.usage.input_tokens > 0


def test_streaming_event_types(server):
    events = list(sdk(server).responses.create(model="demo", input="Hi", max_output_tokens=6, stream=True,
                                               reasoning={"effort": "none"}, extra_body={"ignore_eos": True}))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    # Cut by max_output_tokens: the stream ends as the API ends it, with `response.incomplete`.
    assert kinds[-1] == "response.incomplete" and events[-1].response.status == "incomplete"
    for k in ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.output_item.done"]:
        assert k in kinds, k
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text


def test_reasoning_items(server):
    greedy = {"temperature": 0, "ignore_eos": True}
    r = sdk(server).responses.create(model="demo", input="Think", max_output_tokens=8, reasoning={"effort": "high"}, extra_body=greedy)
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text
    events = list(sdk(server).responses.create(model="demo", input="Think", max_output_tokens=8, stream=True,
                                               reasoning={"effort": "low"}, extra_body=greedy))
    assert "response.reasoning_text.delta" in [e.type for e in events]


def test_function_call_and_continuation(server):
    c = sdk(server)
    r = c.responses.create(model="demo", input="Weather in Oslo?", tools=[WEATHER, {"type": "web_search"}],
                           tool_choice="required", reasoning={"effort": "none"}, max_output_tokens=200)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # Streamed arguments.
    events = list(c.responses.create(model="demo", input="Weather?", tools=[WEATHER], stream=True, max_output_tokens=200,
                                     tool_choice={"type": "function", "name": "get_weather"}, reasoning={"effort": "none"}))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and done[0].arguments == args
    jsonschema.validate(json.loads(args), WEATHER["parameters"])
    # call → result → answer, continuing from the stored response.
    follow = c.responses.create(model="demo", previous_response_id=r.id, tools=[WEATHER], reasoning={"effort": "none"},
                                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "4C, cloudy"}],
                                max_output_tokens=8, extra_body={"temperature": 0, "ignore_eos": True})
    assert follow.previous_response_id == r.id and follow.output
    # The stored conversation includes the call and its result: the continuation's prompt is longer.
    assert follow.usage.input_tokens > r.usage.input_tokens


def test_store_get_delete(server):
    c = sdk(server)
    r = c.responses.create(model="demo", input="Remember me", max_output_tokens=4, reasoning={"effort": "none"})
    assert c.responses.retrieve(r.id).id == r.id
    c.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="demo", input="x", previous_response_id="resp_missing")


def test_text_format_json_schema(server):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 99}, "sure": {"type": "boolean"}},
              "required": ["answer", "sure"], "additionalProperties": False}
    r = sdk(server).responses.create(model="demo", input="JSON", max_output_tokens=100, reasoning={"effort": "none"},
                                     text={"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_background_is_refused(server):
    with pytest.raises(openai.BadRequestError) as e:
        sdk(server).responses.create(model="demo", input="x", background=True)
    assert e.value.body["param"] == "background"


def test_bad_input_items(server):
    with pytest.raises(openai.BadRequestError) as e:
        sdk(server).responses.create(model="demo", input=[{"type": "computer_call_output", "call_id": "x"}])
    assert "computer_call_output" in e.value.body["message"]
