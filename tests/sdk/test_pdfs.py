"""PDFs through every API of `splash serve`, with the real `openai` and `anthropic` SDKs, on the
vision-language fixture `tests/fixtures/qwen35-vl-tied`. Each page reaches the model as
`PDF page N:`, its text, then its rendering as an image; the prompt, its token count and the
prefix cache treat pages as they treat images, and bad files get a 400 in each API's shape.
"""

import anthropic
import httpx
import openai
import pytest

from pdf_file import pdf
from test_images import MODEL, b64, claude, image_part, oai, png, vl  # noqa: F401 (vl: the server fixture)

SHOWN = "<|vision_start|><|image_pad|><|vision_end|>"


INVOICE = pdf([["Invoice 2291", "Total due: 4,250 EUR"], ["Paid by transfer"]])
# The standard security handler with a user password that is not empty.
LOCKED = pdf([["secret"]], "/Encrypt << /Filter /Standard /V 1 /R 2 /Length 40 /P -4 "
             "/O <0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef> "
             "/U <fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210> >> "
             "/ID [<00112233445566778899aabbccddeeff> <00112233445566778899aabbccddeeff>]")


def file_part(data, url=True):
    return {"type": "file", "file": {"filename": "invoice.pdf",
                                     "file_data": f"data:application/pdf;base64,{b64(data)}" if url else b64(data)}}


def document(data, **extra):
    return {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": b64(data)},
            **extra}


def ask(part):
    return [{"role": "user", "content": [part, {"type": "text", "text": "What is the total?"}]}]


def test_pages_are_text_then_image_in_the_prompt(vl):
    r = httpx.post(vl.url + "/apply-template", json={"messages": ask(file_part(INVOICE))})
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert (f"<|im_start|>user\nPDF page 1:\nInvoice 2291\nTotal due: 4,250 EUR\n{SHOWN}"
            f"PDF page 2:\nPaid by transfer\n{SHOWN}What is the total?<|im_end|>") in prompt
    # Each page costs its text and an image: at the fixture's 8,192-pixel cap a US Letter page
    # is 64×96 pixels, 2×3 merged patches, with the vision start and end.
    count = lambda m: httpx.post(vl.url + "/tokenize", json={"messages": m}).json()["count"]  # noqa: E731
    text = [{"role": "user", "content": "PDF page 1:\nInvoice 2291\nTotal due: 4,250 EUR\nPDF page 2:\n"
                                        "Paid by transfer\nWhat is the total?"}]
    assert abs(count(ask(file_part(INVOICE))) - count(text) - 2 * (6 + 2)) <= 2


def test_openai_chat_file_part_is_cached_by_content(vl):
    messages = ask(file_part(INVOICE))
    count = httpx.post(vl.url + "/tokenize", json={"messages": messages}).json()["count"]
    first = oai(vl).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    assert first.usage.prompt_tokens == count
    # Bare base64 is the same file.
    again = oai(vl).chat.completions.create(model=MODEL, messages=ask(file_part(INVOICE, url=False)),
                                            max_tokens=8, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens >= count - 1
    stream = oai(vl).chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                             stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == first.choices[0].message.content
    # Another document with the same text and layout renders differently: no state past its start.
    other = pdf([["Invoice 2291", "Total due: 4,250 EUR"], ["Paid by cheque"]])
    third = oai(vl).chat.completions.create(model=MODEL, messages=ask(file_part(other)), max_tokens=8, temperature=0)
    assert third.usage.prompt_tokens_details.cached_tokens < count - 20


def test_responses_input_file(vl):
    chat = oai(vl).chat.completions.create(model=MODEL, messages=ask(file_part(INVOICE)), max_tokens=8, temperature=0)
    r = oai(vl).responses.create(model=MODEL, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [
            {"type": "input_file", "filename": "invoice.pdf",
             "file_data": f"data:application/pdf;base64,{b64(INVOICE)}"},
            {"type": "input_text", "text": "What is the total?"}]}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as e:
        oai(vl).responses.create(model=MODEL, max_output_tokens=8, input=[
            {"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}])
    assert e.value.body["param"] == "input[0].content[0]"
    assert "file_data" in e.value.body["message"]


def test_anthropic_document_blocks(vl):
    c = claude(vl)
    msg = [{"role": "user", "content": [document(INVOICE, title="invoice.pdf", context="From accounts"),
                                        {"type": "text", "text": "What is the total?"}]}]
    counted = c.messages.count_tokens(model=MODEL, messages=msg).input_tokens
    m = c.messages.create(model=MODEL, max_tokens=8, messages=msg, extra_body={"temperature": 0})
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == counted
    with c.messages.stream(model=MODEL, max_tokens=8, messages=msg, extra_body={"temperature": 0}) as s:
        assert [b.text for b in s.get_final_message().content] == [b.text for b in m.content]
    # Title and context come first; a plain-text document is its text.
    plain = [{"role": "user", "content": [
        {"type": "document", "title": "notes.txt", "source": {"type": "text", "media_type": "text/plain",
                                                              "data": "Total due: 4,250 EUR"}},
        {"type": "text", "text": "What is the total?"}]}]
    just_text = [{"role": "user", "content": "notes.txt\nTotal due: 4,250 EUR\nWhat is the total?"}]
    assert (c.messages.count_tokens(model=MODEL, messages=plain).input_tokens
            == c.messages.count_tokens(model=MODEL, messages=just_text).input_tokens)
    # A tool that reads a PDF returns it inside the tool_result.
    read = {"name": "Read", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
    turns = [
        {"role": "user", "content": "Read invoice.pdf"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "invoice.pdf"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [document(INVOICE)]}]},
    ]
    r = c.messages.create(model=MODEL, max_tokens=8, messages=turns, tools=[read])
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == c.messages.count_tokens(
        model=MODEL, messages=turns, tools=[read]).input_tokens


def bad_openai(server, content, role="user"):
    with pytest.raises(openai.BadRequestError) as e:
        oai(server).chat.completions.create(model=MODEL, max_tokens=4, messages=[
            {"role": role, "content": content}, *([{"role": "user", "content": "hi"}] if role != "user" else [])])
    return e.value.body


@pytest.mark.parametrize("part, words", [
    (file_part(LOCKED), "needs a password"),
    (file_part(b"%PDF-1.4 not really"), "not a PDF, or it is damaged"),
    (file_part(png(32, 32)), "not a PDF"),
    ({"type": "file", "file": {"file_data": "data:image/png;base64,AAAA"}}, "only PDF files"),
    ({"type": "file", "file": {"file_data": "@@@"}}, "not valid base64"),
    ({"type": "file", "file": {"file_id": "file-abc"}}, "send the PDF inline"),
    ({"type": "file", "file": {}}, "needs `file.file_data`"),
])
def test_bad_pdfs_get_a_400_naming_the_part(vl, part, words):
    body = bad_openai(vl, [part])
    assert words in body["message"], body
    assert body["param"] == "messages[0].content[0].file"


def test_pdf_limits(vl, server):
    # Pages count against the 64 images of a request.
    body = bad_openai(vl, [file_part(pdf([["page"]] * 65))])
    assert "65 pages, more than the 64" in body["message"], body
    body = bad_openai(vl, [image_part(png(32, 32))] * 63 + [file_part(pdf([["a"], ["b"]]))])
    assert "more than the 1 images" in body["message"], body
    assert body["param"] == "messages[0].content[63].file"
    assert "system message" in bad_openai(vl, [file_part(INVOICE)], role="system")["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai(server).chat.completions.create(model="demo", max_tokens=4, messages=ask(file_part(INVOICE)))
    assert "reads text only" in e.value.body["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude(vl).messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}]}])
    assert "base64" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude(vl).messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            document(INVOICE, citations={"enabled": True})]}])
    assert "citations" in e.value.body["error"]["message"]
