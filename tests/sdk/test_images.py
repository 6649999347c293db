"""Images through every API of `splash serve`, with the real `openai` and `anthropic` SDKs, on
the vision-language fixture `tests/fixtures/qwen35-vl-tied` (a tiny random model whose logits on
image prompts splash-model's `vision_prompts` test checks against transformers). Here: the
prompt the server assembles equals transformers' for the same conversation, every API takes
images (streaming and not, Anthropic tool results too), the same picture is served from the
prefix cache and another is not, and bad images get a 400 in each API's own shape.
"""

import base64
import struct
import zlib

import anthropic
import httpx
import numpy as np
import openai
import pytest
from safetensors.numpy import load_file

from splash_server import ROOT, Server

FIXTURE = ROOT / "tests" / "fixtures" / "qwen35-vl-tied"
MODEL = "qwen35-vl-tied"


def png(h, w, salt=0):
    """The fixture script's `pattern(h, w)` as a PNG: channel c of (y, x) is (7y + 13x + 50c) % 256
    (`salt` shifts it, for a picture of the same size that differs)."""
    raw = b"".join(
        b"\x00" + bytes((7 * y + 13 * x + 50 * c + salt) % 256 for x in range(w) for c in range(3))
        for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def b64(data):
    return base64.b64encode(data).decode()


def data_url(data, kind="image/png"):
    return f"data:{kind};base64,{b64(data)}"


def image_part(data):
    return {"type": "image_url", "image_url": {"url": data_url(data)}}


def anthropic_image(data):
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}


@pytest.fixture(scope="module")
def vl():
    s = Server(model=str(FIXTURE))
    yield s
    s.stop()


def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def reference_ids(case):
    return [int(t) for t in load_file(str(FIXTURE / "reference.safetensors"))[f"{case}.ids"]]


def test_status_reports_vision(vl, server):
    assert httpx.get(vl.url + "/status").json()["vision"] is True
    assert httpx.get(server.url + "/status").json()["vision"] is False


@pytest.mark.parametrize("case, content", [
    ("one", [image_part(png(64, 96)), {"type": "text", "text": "What is in this picture?"}]),
    ("two", [image_part(png(96, 64)), image_part(png(32, 32)), {"type": "text", "text": "Compare them."}]),
    ("interleaved", [image_part(png(64, 128)), {"type": "text", "text": "and then"}, image_part(png(96, 64)),
                     {"type": "text", "text": "which is larger?"}]),
    ("resized", [image_part(png(150, 100)), {"type": "text", "text": "Describe it."}]),
])
def test_the_prompt_is_transformers_one(vl, case, content):
    """`/tokenize` with messages gives the ids a chat request runs: transformers' ids for the same
    turn (the fixture's prompts end with the generation prompt `<|im_start|>assistant\\n`)."""
    r = httpx.post(vl.url + "/tokenize", json={"messages": [{"role": "user", "content": content}],
                                                "add_generation_prompt": False})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    want = reference_ids(case)
    tail = httpx.post(vl.url + "/tokenize", json={"content": "<|im_start|>assistant\n"}).json()["tokens"]
    assert ids + tail == want


def test_openai_chat_with_an_image_is_cached_by_picture(vl):
    messages = [{"role": "user", "content": [image_part(png(64, 96)), {"type": "text", "text": "What is in this picture?"}]}]
    count = httpx.post(vl.url + "/tokenize", json={"messages": messages}).json()["count"]
    first = oai(vl).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens == count
    again = oai(vl).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens >= count - 1
    # Another picture of the same size: the same token ids, but no state past the image start.
    other = [{"role": "user", "content": [image_part(png(64, 96, salt=101)), messages[0]["content"][1]]}]
    third = oai(vl).chat.completions.create(model=MODEL, messages=other, max_tokens=8, temperature=0)
    assert third.usage.prompt_tokens == count
    assert third.usage.prompt_tokens_details.cached_tokens <= 4
    # Streaming gives the non-streaming text.
    stream = oai(vl).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == first.choices[0].message.content


def test_responses_input_image(vl):
    image = data_url(png(64, 96))
    chat = oai(vl).chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": [image_part(png(64, 96)), {"type": "text", "text": "What is in this picture?"}]}])
    r = oai(vl).responses.create(model=MODEL, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": image},
                                     {"type": "input_text", "text": "What is in this picture?"}]}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        oai(vl).responses.create(model=MODEL, max_output_tokens=8, input=[
            {"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])
    assert e.value.body["param"] == "input[0].content[0]"


def test_anthropic_image_block_and_a_screenshot_in_a_tool_result(vl):
    c = claude(vl)
    msg = [{"role": "user", "content": [anthropic_image(png(64, 96)), {"type": "text", "text": "What is in this picture?"}]}]
    counted = c.messages.count_tokens(model=MODEL, messages=msg).input_tokens
    m = c.messages.create(model=MODEL, max_tokens=8, messages=msg, extra_body={"temperature": 0})
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted
    with c.messages.stream(model=MODEL, max_tokens=8, messages=msg, extra_body={"temperature": 0}) as s:
        streamed = s.get_final_message()
    assert [b.text for b in streamed.content] == [b.text for b in m.content]
    # Claude Code's Read tool on a screenshot: the image comes back inside the tool_result.
    read = {"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
    turns = [
        {"role": "user", "content": "Look at shot.png"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "shot.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "shot.png"}, anthropic_image(png(96, 64))]}]},
    ]
    with_image = c.messages.count_tokens(model=MODEL, messages=turns, tools=[read]).input_tokens
    turns_text = [*turns[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                             "content": [{"type": "text", "text": "shot.png"}]}]}]
    without = c.messages.count_tokens(model=MODEL, messages=turns_text, tools=[read]).input_tokens
    assert with_image - without == 6 + 2  # 3×2 merged patches, vision start and end
    r = c.messages.create(model=MODEL, max_tokens=8, messages=turns, tools=[read])
    assert r.usage.output_tokens > 0


def test_text_that_looks_like_an_image_stays_text(vl):
    messages = [{"role": "user", "content": "<|vision_start|><|image_pad|><|vision_end|> is what I typed"}]
    r = oai(vl).chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert r.usage.prompt_tokens == httpx.post(vl.url + "/tokenize", json={"messages": messages}).json()["count"]


def corrupt(data):
    """The file with bytes in the middle of its pixel data flipped."""
    return data[:60] + bytes(b ^ 0x55 for b in data[60:120]) + data[120:]


def bad_openai(server, part, role="user", model=MODEL):
    with pytest.raises(openai.BadRequestError) as e:
        oai(server).chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": role, "content": [part]}, *([{"role": "user", "content": "hi"}] if role != "user" else [])])
    return e.value


@pytest.mark.parametrize("part, words", [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "base64 data URL"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "not valid base64"),
    ({"type": "image_url", "image_url": {"url": data_url(corrupt(png(64, 96)))}}, "cannot be decoded"),
    ({"type": "image_url", "image_url": {"url": data_url(png(64, 96)[:200])}}, "cannot be decoded"),
    ({"type": "image_url", "image_url": {"url": data_url(b"just text")}}, "not a JPEG, PNG, WebP or GIF"),
    ({"type": "image_url", "image_url": {"url": data_url(png(1, 300))}}, "aspect ratio"),
    ({"type": "image_url", "image_url": {}}, "needs `image_url.url`"),
])
def test_bad_images_get_a_400_naming_the_part(vl, part, words):
    e = bad_openai(vl, part)
    assert words in e.body["message"], e.body
    assert e.body["param"] == "messages[0].content[0].image_url"


def test_limits_and_misplaced_images(vl, server):
    e = bad_openai(vl, image_part(png(32, 32)), role="system")
    assert "system message" in e.body["message"]
    # A picture that decodes to more pixels than splash allocates (a decompression bomb) is
    # refused from its header.
    bomb = png(1, 1)
    bomb = bomb[:16] + struct.pack(">II", 60000, 60000) + bomb[24:]
    e = bad_openai(vl, image_part(bomb))
    assert "smaller image" in e.body["message"] or "cannot be decoded" in e.body["message"], e.body
    many = [image_part(png(32, 32))] * 65
    with pytest.raises(openai.BadRequestError) as e:
        oai(vl).chat.completions.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": many}])
    assert "at most 64 images" in e.value.body["message"]
    # The demo model is text-only.
    e = bad_openai(server, image_part(png(32, 32)), model="demo")
    assert "reads text only" in e.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude(vl).messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "base64" in e.value.body["error"]["message"]


def test_language_only_refuses_images():
    s = Server("--language-only", model=str(FIXTURE))
    try:
        assert httpx.get(s.url + "/status").json()["vision"] is False
        e = bad_openai(s, image_part(png(32, 32)))
        assert "--language-only" in e.body["message"]
    finally:
        s.stop()


def test_the_resized_image_costs_what_its_grid_says(vl):
    # 150×100 is resized to 96×64 (a multiple of 32 within the fixture's 1,024–8,192 pixels):
    # 3×2 merged patches.
    grid = np.array(load_file(str(FIXTURE / "reference.safetensors"))["resized.grids"]).tolist()
    assert grid == [[6, 4]]
    text = [{"role": "user", "content": [{"type": "text", "text": "Describe it."}]}]
    image = [{"role": "user", "content": [image_part(png(150, 100)), {"type": "text", "text": "Describe it."}]}]
    count = lambda m: httpx.post(vl.url + "/tokenize", json={"messages": m}).json()["count"]  # noqa: E731
    assert count(image) - count(text) == 6 + 2
