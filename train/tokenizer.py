#!/usr/bin/env python3
"""Train the demo model's byte-level BPE (8,192 ids) on generated conversations.

Same pipeline as the Qwen3.5/3.6 tokenizer (NFC, the Qwen3.5 split regex, byte-level BPE,
byte-level decoder), a smaller vocabulary, and every Qwen special token as one added token
with Qwen's flags, after the BPE ids as in Qwen; plus `<|mask|>`, the DFlash draft's mask.

    python3 train/tokenizer.py models/demo     # writes tokenizer.json.gz, tokenizer_config.json

Needs `tokenizers` and `transformers` (for the template renderer); runs in a minute on a CPU.
"""
import gzip
import json
import os
import random
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import data  # noqa: E402

VOCAB = 8192
SEED = 7
SAMPLES = 60_000
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3.5's added tokens in id order, with their `special` flag (the rest are visible text).
QWEN_ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False), ("<|audio_start|>", True), ("<|audio_end|>", True),
    ("<tts_pad>", True), ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True), ("<|mask|>", True),
]


def build(texts):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(QWEN_SPLIT, behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # The added tokens must not be learnt as merges: strip them from the training text.
    specials = [t for t, _ in QWEN_ADDED]

    def strip(t):
        for s in specials:
            t = t.replace(s, "\n")
        return t

    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(QWEN_ADDED), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((strip(t) for t in texts), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB - len(QWEN_ADDED), tok.get_vocab_size()
    tok.add_tokens([AddedToken(t, special=sp, normalized=False, single_word=False, lstrip=False, rstrip=False)
                    for t, sp in QWEN_ADDED])
    assert tok.get_vocab_size() == VOCAB
    return tok


def tokenizer_config(tok, template):
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": sp} for t, sp in QWEN_ADDED}
    return {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "errors": "replace", "model_max_length": 32768, "clean_up_tokenization_spaces": False,
        "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "chat_template": template,
    }


def main():
    out = sys.argv[1]
    template = open(os.path.join(out, "chat_template.jinja")).read()
    rng = random.Random(SEED)
    texts = [data.render(data.generate(rng), template) for _ in range(SAMPLES)]
    tok = build(texts)
    # Kept gzip-compressed (splash reads tokenizer.json.gz): a ninth of the bytes in the repository.
    with gzip.GzipFile(os.path.join(out, "tokenizer.json.gz"), "wb", compresslevel=9, mtime=0) as g:
        g.write(tok.to_str().encode("utf-8"))
    json.dump(tokenizer_config(tok, template), open(os.path.join(out, "tokenizer_config.json"), "w"),
              indent=2, ensure_ascii=False)
    # Round trip and single-token checks.
    for t, _ in QWEN_ADDED:
        assert tok.encode(t).ids == [tok.token_to_id(t)], t
    for t in texts[:200] + ["héllo wörld 你好 🙂\r\n\tcode()"]:
        assert tok.decode(tok.encode(t).ids, skip_special_tokens=False) == t
    n = sum(len(tok.encode(t).ids) for t in texts[:2000])
    c = sum(len(t) for t in texts[:2000])
    print(f"vocab {tok.get_vocab_size()}, {c / n:.2f} chars per token on the generated data")


if __name__ == "__main__":
    main()
