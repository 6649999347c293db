"""Scoring without generation: `/v1/judgments` over raw HTTP and `/v1/systemone` through the real
`typesafe-sdk` (sync and async clients), on the demo model."""

import asyncio
import math
import time

import httpx
import pytest
from typesafe_sdk import (
    AsyncTypeSafeClient,
    Choice,
    Noul,
    RetryPolicy,
    Score,
    TypeSafeClient,
    TypeSafeInternalServerError,
    TypeSafeUnprocessableEntityError,
)

from splash_server import Server

NO_RETRY = RetryPolicy(max_retries=0)
ROW = {
    "id": "row-1",
    "state": "Anna added 47 + 38 and wrote 85.",
    "question": "Is the sum correct?",
    "options": [{"id": "yes", "description": "yes, it is correct"}, {"id": "no", "description": "no, it is wrong"}],
}


@pytest.fixture(scope="module")
def scorer():
    # One lane and no queue: a second request while one runs is refused (the 529 test).
    s = Server("--inject-faults", "--lanes", "1", "--queue-size", "0")
    yield s
    s.stop()


def client(server, **kw):
    return TypeSafeClient(api_key="local", base_url=server.url, model="demo", retry=NO_RETRY, **kw)


def judge(server, row=ROW, **kw):
    with server.client() as h:
        return h.post("/v1/judgments", json=row, **kw)


def test_judgment_reads_the_option_letters_logits(scorer):
    r = judge(scorer)
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["id"] == "row-1" and j["option_ids"] == ["yes", "no"]
    assert len(j["option_logits"]) == 2 and all(math.isfinite(x) for x in j["option_logits"])
    assert abs(sum(j["probabilities"]) - 1) < 1e-9
    # Probabilities are the logits' softmax.
    a, b = j["option_logits"]
    assert abs(j["probabilities"][0] - 1 / (1 + math.exp(b - a))) < 1e-9
    assert j["prompt_version"] == "direct-options-v1" and j["probability_status"] == "uncalibrated"
    assert len(j["prompt_sha256"]) == 64 and len(j["answer_token_ids"]) == 2
    assert j["model"] == {"id": "demo"}
    assert j["usage"] == {"prompt_tokens": j["input_tokens"], "completion_tokens": 0, "total_tokens": j["input_tokens"]}
    assert 0 < j["forward_seconds"] <= j["total_seconds"]
    # Deterministic: the same row scores the same (it is served from the prefix cache now).
    again = judge(scorer).json()
    assert again["prompt_sha256"] == j["prompt_sha256"]
    assert max(abs(x - y) for x, y in zip(again["option_logits"], j["option_logits"])) < 1e-3


def test_a_second_question_on_the_same_state_prefills_only_what_differs(scorer):
    state = {"log": [f"line {i}: the build of module {i} passed in {i % 7} seconds" for i in range(120)]}
    first = judge(scorer, {**ROW, "id": "a", "state": state, "question": "Did the build pass?"}).json()
    second = judge(scorer, {**ROW, "id": "b", "state": state, "question": "Was any module slow?"}).json()
    assert first["input_tokens"] > 1000
    assert second["cached_tokens"] > 1000, second
    assert second["input_tokens"] - second["cached_tokens"] < 120, second


@pytest.mark.parametrize(
    "change, status, words",
    [
        ({"options": [{"id": str(i), "description": "x"} for i in range(17)]}, 400, "2-16"),
        ({"options": [{"id": "a", "description": "x"}]}, 400, "2-16"),
        ({"options": [{"id": "a", "description": "x"}, {"id": "a", "description": "y"}]}, 400, "unique"),
        ({"options": [{"id": "a"}, {"id": "b", "description": "y"}]}, 400, "description"),
        ({"state": ""}, 400, "nonempty"),
        ({"state": 5}, 400, "state"),
        ({"question": ""}, 400, "question"),
        ({"id": 3}, 400, "id"),
        ({"stream": True}, 400, "unsupported fields: stream"),
        ({"model": "gpt-4"}, 404, "does not exist"),
        ({"timeout": -1}, 400, "timeout"),
        ({"priority": "urgent"}, 400, "priority"),
    ],
)
def test_bad_judgments_get_openai_errors(scorer, change, status, words):
    r = judge(scorer, {**ROW, **change})
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"]


def test_missing_fields_and_bad_json(scorer):
    r = judge(scorer, {"id": "x"})
    assert r.status_code == 400 and "options, question, state" in r.json()["error"]["message"]
    with scorer.client() as h:
        r = h.post("/v1/judgments", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_system_one_every_question_type(scorer):
    with client(scorer) as c:
        r = c.system_one(
            state={"message": "I was charged twice for one order. Please refund me."},
            questions={
                "billing": Noul(instructions="Is this about billing?"),
                "tone": Choice(instructions="What is the tone?", criteria={"calm": None, "angry": "upset or hostile"}),
                "urgency": Score(instructions="How urgent is it?", criteria=["can wait", "this week", "today"]),
                "raw": {"type": "noul", "criteria": {"true": "about money", "false": None}},
            },
        )
    assert r.model == "demo"
    assert set(r.answers) == {"billing", "tone", "urgency", "raw"}
    assert 0 <= r.nouls["billing"].noul <= 1 and 0 <= r.nouls["raw"].noul <= 1
    tone = r.choices["tone"]
    assert tone.choice in {"calm", "angry"} and abs(sum(tone.probabilities.values()) - 1) < 1e-9
    assert tone.choice == max(tone.probabilities, key=tone.probabilities.get)
    assert 0 <= tone.confidence <= 1
    u = r.scores["urgency"]
    assert set(u.probabilities) == {0, 1, 2} and u.legend == {0: "can wait", 1: "this week", 2: "today"}
    assert abs(u.score - sum(k * p for k, p in u.probabilities.items())) < 1e-9
    p = list(u.probabilities.values())
    assert abs(u.confidence - (1 + sum(x * math.log(x) for x in p if x > 0) / math.log(3))) < 1e-9
    assert r.usage.input_tokens > 0 and r.usage.output_tokens == 0
    assert r.raw_http_response.headers["x-typesafe-request-id"].startswith("req_")


def test_system_one_async_client_and_models_list(scorer):
    async def main():
        async with AsyncTypeSafeClient(api_key="local", base_url=scorer.url, model="demo", retry=NO_RETRY) as c:
            models = await c.models.list()
            r = await c.system_one(state="2 + 2 = 4", questions={"ok": Noul(instructions="Is it true?")})
            return models, r

    models, r = asyncio.run(main())
    assert [m.name for m in models.models] == ["demo"]
    assert 0 <= r.nouls["ok"].noul <= 1


def test_singletons_are_answered_without_inference(scorer):
    with client(scorer) as c:
        r = c.system_one(
            state="anything",
            questions={"only": Choice(criteria={"yes": None}), "level": Score(criteria=["the one level"])},
        )
    assert r.choices["only"].choice == "yes" and r.choices["only"].confidence == 1.0
    assert r.scores["level"].score == 0 and r.scores["level"].probabilities == {0: 1.0}
    assert r.usage.input_tokens == 0


def test_sixty_four_questions_and_not_sixty_five(scorer):
    questions = {f"q{i}": Noul(instructions=f"Is {i} + 1 = {i + 1}?") for i in range(64)}
    with client(scorer) as c:
        r = c.system_one(state="arithmetic", questions=questions, timeout=120)
        assert len(r.answers) == 64
        with pytest.raises(TypeSafeUnprocessableEntityError) as e:
            c.system_one(state="arithmetic", questions={**questions, "q64": Noul()})
    assert "at most 64 questions" in str(e.value)


def post_systemone(server, body):
    with server.client() as h:
        return h.post("/v1/systemone", json=body)


@pytest.mark.parametrize(
    "body, loc, words",
    [
        ({"state": "s", "questions": {"q": {"type": "noul"}}}, ["body", "model"], "field required"),
        ({"model": "gpt-4", "state": "s", "questions": {"q": {"type": "noul"}}}, ["body", "model"], "does not exist"),
        ({"model": "demo", "questions": {"q": {"type": "noul"}}}, ["body", "state"], "field required"),
        ({"model": "demo", "state": 3, "questions": {"q": {"type": "noul"}}}, ["body", "state"], "string"),
        ({"model": "demo", "state": "s", "questions": {}}, ["body", "questions"], "nonempty"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "maybe"}}}, ["body", "questions", "q", "type"], "noul"),
        ({"model": "demo", "state": "s", "questions": {"q": 5}}, ["body", "questions", "q"], "object"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "score", "criteria": [str(i) for i in range(300)]}}},
         ["body", "questions", "q", "criteria"], "at most 255 levels"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "choice", "criteria": {}}}},
         ["body", "questions", "q", "criteria"], "nonempty object"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "choice", "criteria": {"a": 5, "b": None}}}},
         ["body", "questions", "q", "criteria"], "descriptions"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "noul", "criteria": {"maybe": "x"}}}},
         ["body", "questions", "q", "criteria"], "true and false"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "noul", "thinking": True}}},
         ["body", "questions", "q", "thinking"], "unknown field"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "noul"}}, "timeout": 0}, ["body", "timeout"], "positive"),
        ({"model": "demo", "state": "s", "questions": {"q": {"type": "noul"}}, "seed": 1}, ["body", "seed"], "unknown field"),
    ],
)
def test_bad_system_one_requests_get_422_details(scorer, body, loc, words):
    r = post_systemone(scorer, body)
    assert r.status_code == 422, r.text
    assert r.headers["x-typesafe-request-id"].startswith("req_")
    details = r.json()["detail"]
    assert any(d["loc"] == loc and words in d["msg"] for d in details), details


def test_every_problem_is_reported_at_once_and_bad_json_is_422(scorer):
    r = post_systemone(scorer, {"questions": {"a": {"type": "x"}, "b": {"type": "choice"}}})
    locs = [d["loc"] for d in r.json()["detail"]]
    assert ["body", "model"] in locs and ["body", "state"] in locs
    assert ["body", "questions", "a", "type"] in locs and ["body", "questions", "b", "criteria"] in locs
    with scorer.client() as h:
        r = h.post("/v1/systemone", content=b"[1, 2", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]


def test_more_labels_than_answer_slots_is_422(scorer):
    # The demo tokenizer has fewer single-token labels than 255: a domain longer than its slots.
    with scorer.client() as h:
        slots = h.post("/v1/systemone", json={"model": "demo", "state": "s", "questions": {
            "q": {"type": "score", "criteria": [str(i) for i in range(255)]}}})
    if slots.status_code == 200:
        pytest.skip("this tokenizer has 255 answer slots")
    assert slots.status_code == 422
    assert "answer slots" in slots.json()["detail"][0]["msg"]


def test_non_finite_logit_fails_only_that_request(scorer):
    with client(scorer) as c:
        with pytest.raises(TypeSafeInternalServerError) as e:
            c.system_one(state="s", questions={"q": Noul()}, extra_headers={"x-splash-fault": "nonfinite-logits"})
        assert e.value.status == 500
        assert e.value.body["detail"]["error_type"] == "model_result_invalid"
        assert 0 <= c.system_one(state="s", questions={"q": Noul()}).nouls["q"].noul <= 1
    r = judge(scorer, headers={"x-splash-fault": "nonfinite-logits"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "model_result_invalid"
    assert judge(scorer).status_code == 200


def test_overload_is_529_with_retry_after(scorer):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 60000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=scorer.url, timeout=30) as h:
        with h.stream("POST", "/v1/chat/completions", json=body) as s:
            lines = s.iter_lines()
            next(lines)  # the one lane is taken
            r = post_systemone(scorer, {"model": "demo", "state": "s", "questions": {"q": {"type": "noul"}}})
            assert r.status_code == 529, r.text
            assert r.headers["retry-after"] == "1"
            assert r.json()["detail"]["error_type"] == "server_overloaded"
            assert judge(scorer).status_code == 503
    wait_until_idle(scorer)


def wait_until_idle(server, seconds=30):
    """Waits until the server runs no request: a stream closed by its client frees its lane only
    when the engine next sees the disconnect, and the next test must find the lane free."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        metrics = httpx.get(server.url + "/metrics").text
        if "splash_running_requests 0" in metrics.splitlines():
            return
        time.sleep(0.05)
    raise AssertionError(f"the server still ran a request {seconds} s after its client left")


def test_timeout_is_504(scorer):
    state = "word " * 3000
    r = post_systemone(scorer, {"model": "demo", "state": state, "timeout": 0.001,
                                "questions": {"q": {"type": "noul"}}})
    assert r.status_code == 504, r.text
    assert r.json()["detail"]["error_type"] == "request_timeout"


def test_api_key_errors_keep_each_shape(keyed_server):
    with keyed_server.client() as h:
        r = h.post("/v1/systemone", json={"model": "x", "state": "s", "questions": {"q": {"type": "noul"}}})
        assert r.status_code == 401 and "API key" in r.json()["detail"]["message"]
        assert r.headers["x-typesafe-request-id"].startswith("req_")
        r = h.post("/v1/judgments", json=ROW)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    c = TypeSafeClient(api_key="sekret-key", base_url=keyed_server.url, retry=NO_RETRY)
    with c:
        model = c.models.list().models[0].name
        assert 0 <= c.system_one(state="s", questions={"q": Noul()}, model=model).nouls["q"].noul <= 1
