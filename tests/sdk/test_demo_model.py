"""Round trips with the trained demo model through the real `openai` and `anthropic` SDKs: the
model itself chooses the tool, fills its arguments, reads the tool's result and answers;
JSON-schema answers carry the values from the prompt; speculation with the bundled draft is
on and accepts several tokens per target pass. Greedy decoding, so the outputs are fixed."""

import json

import anthropic
import httpx

from conftest import Server
from test_openai_api import sdk

TOOLS = [
    {"type": "function", "function": {"name": "send_email", "description": "Send an email.", "parameters": {
        "type": "object", "properties": {"to": {"type": "string", "description": "Recipient address"},
                                         "subject": {"type": "string"}, "body": {"type": "string"}},
        "required": ["to", "subject", "body"]}}},
    {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city.",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "description": "City name, e.g. Paris"}},
                                          "required": ["city"]}}},
]


def test_the_model_calls_the_right_tool_and_uses_its_result(server):
    c = sdk(server)
    question = [{"role": "user", "content": "What's the weather like in Vienna?"}]
    first = c.chat.completions.create(model="demo", messages=question, tools=TOOLS, temperature=0, max_tokens=200)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Vienna"}
    # Run the "tool" and send its result back: the model answers from it.
    result = {"city": "Vienna", "temperature": 21, "unit": "celsius", "condition": "sunny"}
    history = question + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
    answer = c.chat.completions.create(model="demo", messages=history, tools=TOOLS, temperature=0, max_tokens=200)
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop"
    assert "21" in text and "Vienna" in text and "sunny" in text, text


def test_strict_renamed_tool_is_called_in_the_xml_form(server):
    """The same capability under another name and parameter name, `strict`: the grammar, in
    the XML form of the model's template, makes the call use the offered names (unconstrained,
    the small model sometimes writes a parameter name it learnt for another variant)."""
    tools = [{"type": "function", "function": {"name": "weather_lookup", "description": "Get the current weather for a city.",
                                               "strict": True, "parameters": {
                                                   "type": "object", "properties": {"location": {"type": "string", "description": "City name"}},
                                                   "required": ["location"], "additionalProperties": False}}}]
    r = sdk(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": "Is it cold in Oslo right now?"}],
                                            tools=tools, temperature=0, max_tokens=200)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "weather_lookup"
    assert json.loads(call.function.arguments) == {"location": "Oslo"}


def test_anthropic_tool_use(server):
    c = anthropic.Anthropic(base_url=server.url, api_key="none")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    m = c.messages.create(model="demo", max_tokens=300, extra_body={"temperature": 0}, tools=tools,
                          messages=[{"role": "user", "content": "Send an email to kira@example.com with the subject "
                                                                "\"Release 1.2\" saying I'll be late."}])
    assert m.stop_reason == "tool_use", m
    use = [b for b in m.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "send_email"
    assert use[0].input["to"] == "kira@example.com" and use[0].input["subject"] == "Release 1.2"


def test_json_schema_answer_carries_the_values(server):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                               "city": {"type": "string"}}, "required": ["name", "age", "city"]}
    r = sdk(server).chat.completions.create(
        model="demo", temperature=0, max_tokens=200,
        messages=[{"role": "user", "content": "Extract the data as JSON matching this schema: " + json.dumps(schema)
                   + "\n\nText: Maya is 42 years old and lives in Lisbon."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert json.loads(r.choices[0].message.content) == {"name": "Maya", "age": 42, "city": "Lisbon"}


def test_thinking_arithmetic_and_speculation(server):
    before = httpx.get(server.url + "/status").json()["metrics"]["speculation"]
    r = sdk(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": "What is 56 + 27?"}],
                                            temperature=0, max_tokens=200)
    msg = r.choices[0].message
    assert "ones: 6 + 7 = 13" in msg.reasoning_content, msg
    assert "83" in msg.content
    after = httpx.get(server.url + "/status").json()["metrics"]["speculation"]
    passes = after["target_passes_total"] - before["target_passes_total"]
    accepted = after["accepted_tokens_total"] - before["accepted_tokens_total"]
    assert passes > 0, "the bundled draft should be on by default"
    assert (accepted + passes) / passes > 2.0, (accepted, passes)


def test_repeated_conversation_is_served_from_the_prefix_cache(server):
    system = "You answer questions about geography. " * 30
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "What is the capital of Peru?"}]
    c = sdk(server)
    first = c.chat.completions.create(model="demo", messages=msgs, temperature=0, max_tokens=50)
    second = c.chat.completions.create(model="demo", messages=msgs, temperature=0, max_tokens=50)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    # Everything up to the generation prompt comes from the cache; the answer is the same.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 12
    assert second.choices[0].message.content == first.choices[0].message.content
    # The same conversation through the Messages API: Anthropic counts cache reads apart.
    m = anthropic.Anthropic(base_url=server.url, api_key="none").messages.create(
        model="demo", max_tokens=50, system=system, messages=msgs[1:], extra_body={"temperature": 0})
    assert m.usage.cache_read_input_tokens >= first.usage.prompt_tokens - 12, m.usage
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens > m.usage.cache_read_input_tokens
    cache = httpx.get(server.url + "/status").json()["metrics"]["prefix_cache"]
    assert cache["hits_total"] >= 2 and cache["entries"] >= 1, cache


def test_concurrent_requests_share_decode_passes_and_keep_their_answers(server):
    """Four requests at once go through batched decode passes (visible in /status and
    /metrics), and each gets exactly the answer it gets alone (the passes are batch-invariant)."""
    import concurrent.futures

    questions = [f"What is {a} + {b}?" for a, b in [(47, 38), (12, 30), (250, 199), (8, 9)]]

    def ask(q):
        r = sdk(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": q}],
                                                temperature=0, max_tokens=60)
        return r.choices[0].message.content

    alone = [ask(q) for q in questions]
    before = httpx.get(server.url + "/status").json()["metrics"]["batching"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, questions))
    after = httpx.get(server.url + "/status").json()["metrics"]["batching"]
    assert together == alone
    passes = after["decode_passes_total"] - before["decode_passes_total"]
    assert passes > 0 and after["sequences_per_pass"] > before["sequences_per_pass"], (before, after)
    metrics = httpx.get(server.url + "/metrics").text
    assert "splash_batch_passes_total" in metrics and "splash_prefill_pending_tokens" in metrics


def test_persistent_disk_cache_serves_a_restarted_server(tmp_path):
    system = "You answer questions about rivers. " * 30
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Which river flows through Cairo?"}]
    args = ("--max-cache-disk", "1G", "--persistent-cache", "--cache-dir", str(tmp_path))
    first_server = Server(*args)
    try:
        assert "prefix cache on disk" in first_server.log and "kept across restarts" in first_server.log
        first = sdk(first_server).chat.completions.create(model="demo", messages=msgs, temperature=0, max_tokens=40)
    finally:
        first_server.stop()
    assert first_server.proc.returncode == 0, first_server.log
    files = list(tmp_path.rglob("*.splc"))
    assert files, "the memory tier is written to disk at exit"
    second_server = Server(*args)
    try:
        second = sdk(second_server).chat.completions.create(model="demo", messages=msgs, temperature=0, max_tokens=40)
        cache = httpx.get(second_server.url + "/status").json()["metrics"]["prefix_cache"]
    finally:
        second_server.stop()
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 12, second.usage
    assert cache["disk_hits_total"] == 1 and cache["disk"]["entries"] >= 1, cache
    # Without --persistent-cache the files go away with the server.
    temp_server = Server("--max-cache-disk", "1G", "--cache-dir", str(tmp_path / "temp"))
    try:
        sdk(temp_server).chat.completions.create(model="demo", messages=msgs, temperature=0, max_tokens=5)
    finally:
        temp_server.stop()
    assert not list((tmp_path / "temp").rglob("*.splc")), temp_server.log


def test_the_chat_pages_suggestions_are_what_the_demo_can_answer(server):
    """The suggestions a newcomer clicks first on the chat page: each gets a right answer."""
    page = server.client().get("/webui/app.js").text
    listed = page[page.index("for (const idea of ["):].split("])", 1)[0]
    ideas = [line.strip().rstrip(",").strip("'") for line in listed.splitlines()[1:]
             if line.strip().startswith("'")]
    expected = {"What is 56 + 27?": "83", "What is the capital of Peru?": "Lima",
                "Write a Python function that checks whether a number is prime.": "def ",
                "What is the chemical symbol for gold?": "Au"}
    assert ideas and set(ideas) <= set(expected), f"no expected answer for {set(ideas) - set(expected)}"
    for idea in ideas:
        r = sdk(server).chat.completions.create(model="demo", messages=[{"role": "user", "content": idea}],
                                                temperature=0, max_tokens=300)
        assert r.choices[0].finish_reason == "stop" and expected[idea] in r.choices[0].message.content, (idea, r)
