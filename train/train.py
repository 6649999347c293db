#!/usr/bin/env python3
"""Train the demo model (a small Qwen3.5 GDN + gated-attention model) and its DFlash draft.

Runs on one GPU (the H200: about 8 minutes in all) or, with --smoke, on a CPU in a minute.

    python3 train/train.py --out OUT [--target-minutes 5] [--draft-minutes 2] [--dflash-ref model.py]

Steps: generate the conversations (train/data.py, seeded, in parallel), tokenize them with
models/demo/tokenizer.json.gz, find the assistant turns (checked against the rendered text): full
loss weight there, OTHER_WEIGHT on the other text; pack them into 1,024-token rows, train the target, then train the
DFlash draft on the frozen target's tap features (block diffusion: each block is the last
accepted token plus mask tokens, attending to the taps of everything before it), and
evaluate both. OUT receives model.safetensors + config.json (the target), draft/ (the
draft), heldout.txt (text for `splash perplexity`) and metrics.json.

With --dflash-ref (z-lab/dflash's dflash/model.py), the trained draft is loaded into the
reference class and checked against this script's batched training forward, and the
acceptance is measured with the reference model.
"""
import argparse
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEMO = os.path.join(ROOT, "models", "demo")
sys.path.insert(0, HERE)
import data  # noqa: E402

SEQ = 1024
SEED = 2026

TARGET = {
    "architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text",
    "vocab_size": 8192, "hidden_size": 256, "num_hidden_layers": 8,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"],
    "full_attention_interval": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "attn_output_gate": True, "attention_bias": False, "attention_dropout": 0.0,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4, "hidden_act": "silu", "rms_norm_eps": 1e-06, "intermediate_size": 640,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                        "mrope_interleaved": True, "mrope_section": [4, 2, 2]},
    "max_position_embeddings": 65536, "tie_word_embeddings": True, "initializer_range": 0.02,
    "use_cache": True, "bos_token_id": None, "dtype": "bfloat16", "mamba_ssm_dtype": "float32",
}
DRAFT_LAYERS = 2
TAPS = [1, 3, 5]
BLOCK = 8
LOSS_DECAY = 4.0  # weight of block position k (1-based): exp(-(k-1)/decay), as in DFlash
OTHER_WEIGHT = 0.15  # loss weight of the text outside assistant turns (assistant tokens weigh 1)
# Loss weight of the assistant tokens of scoring conversations (`judgment`: the empty think block,
# the option letter, <|im_end|>); at 1 the letter, their only informative token, is lost in the mean.
JUDGMENT_WEIGHT = 1.0
SHARD_BYTES = 12 << 20


# ---------------------------------------------------------------------------------------------
# Data

def assistant_mask(ids, im_start, im_end, assistant, newline):
    """True on the tokens an assistant turn generates, the ones the loss is on: from the first
    token after `<|im_start|>assistant\n` through the `<|im_end|>` that ends the turn, so the
    think block, the text, the tool-call markup and the end of the turn; False on system, user
    and tool-result turns and on each turn's scaffolding. (The tokenizer sometimes merges the
    head's newline with the first characters of the turn, `\nS` of "\nSee you": that token is
    the turn's first and is trained.)"""
    mask = np.zeros(len(ids), dtype=bool)
    ends = np.flatnonzero(ids == im_end)
    for p in np.flatnonzero(ids[:-2] == im_start):
        if ids[p + 1] == assistant:
            s = p + 2 + (ids[p + 2] == newline)
            mask[s:ends[np.searchsorted(ends, s)] + 1] = True
    return mask


def special_ids(tok):
    """<|im_start|>, <|im_end|>, and the ids of "assistant" and of the newline after it."""
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    head = tok.encode("<|im_start|>assistant\n").ids
    assert len(head) == 3 and head[0] == im_start, head
    return im_start, im_end, head[1], head[2]


def check_assistant_mask(tok, texts, ids, masks):
    """The self-check of the loss mask, on rendered conversations: the trained tokens must be
    exactly those that overlap the characters of an assistant turn (after each
    `<|im_start|>assistant\n`, up to and with its `<|im_end|>`), found in the text rather than
    in the token ids; a token may cross a turn's boundary only by carrying the head's newline
    into the turn; the trained tokens decode to exactly the turns (plus such newlines).
    Returns (conversations, assistant turns, trained tokens, tokens)."""
    head, end = "<|im_start|>assistant\n", "<|im_end|>"
    turns = trained = total = 0
    for text, i, m in zip(texts, ids, masks):
        spans, pos = [], 0
        while (a := text.find(head, pos)) >= 0:
            b = text.index(end, a) + len(end)
            spans.append((a + len(head), b))
            pos = b
        assert spans, "a conversation without an assistant turn"
        enc = tok.encode(text)
        assert enc.ids == i.tolist()
        want = np.zeros(len(i), dtype=bool)
        starts = {}
        for k, (s, e) in enumerate(enc.offsets):
            for lo, hi in spans:
                if s < hi and e > lo:  # the token has characters of the turn
                    assert e <= hi and (s >= lo or (s == lo - 1 and text[s] == "\n")), \
                        f"token {k} {text[s:e]!r} crosses a turn boundary"
                    want[k] = True
                    starts.setdefault(lo, s)
        assert (want == m).all(), f"mask differs from the assistant turns at {np.flatnonzero(want != m)[:5]}"
        got = tok.decode([t for t, k in zip(i.tolist(), m) if k], skip_special_tokens=False)
        assert got == "".join(text[starts[lo]:hi] for lo, hi in spans)
        assert "<|im_start|>" not in got and got.count(end) == len(spans) == len(starts)
        turns += len(spans)
        trained += int(m.sum())
        total += len(i)
    return len(texts), turns, trained, total


def _chunk(args):
    seed, count, template_path, tokenizer_dir, judgment_share = args
    template = open(template_path).read()
    tok = data.load_tokenizer(tokenizer_dir)
    rng = random.Random(seed)
    convs, texts, dropped = [], [], []
    while len(convs) < count:
        c = data.gen_judgment(rng) if rng.random() < judgment_share else data.generate(rng)
        t = data.render(c, template)
        # Nothing of the held-out tool-call set (evaluate.py --tool-rate) may occur in the data:
        # made-up values are drawn apart from it, and a conversation that still shows a held-out
        # city or tool name (two made-up pieces side by side) is left out and counted.
        leak = data.heldout_leak(t)
        if leak is not None:
            dropped.append(leak)
            continue
        convs.append(c)
        texts.append(t)
    assert not {data.heldout_leak(t) for t in texts} - {None}
    ids = [np.array(e.ids, dtype=np.int16) for e in tok.encode_batch(texts)]  # vocab < 32768
    special = special_ids(tok)
    masks = [assistant_mask(i, *special) for i in ids]
    return [c["kind"] for c in convs], texts, ids, masks, dropped


def make_conversations(seed, n, workers, chunk=2000, judgment_share=0.0):
    """n conversations: (kinds, texts, token arrays, loss masks), the same for the same seed and n;
    `judgment_share` of them drawn from gen_judgment on top of its share of the mixture."""
    jobs = [(seed * 1_000_003 + i, min(chunk, n - i * chunk), os.path.join(DEMO, "chat_template.jinja"),
             DEMO, judgment_share) for i in range((n + chunk - 1) // chunk)]
    kinds, texts, ids, masks, dropped = [], [], [], [], []
    data.stdlib_functions()  # parsed once, shared by the forked workers
    with mp.get_context("fork").Pool(workers) as pool:
        for k, t, i, m, d in pool.imap(_chunk, jobs):
            kinds += k
            texts += t
            ids += i
            masks += m
            dropped += d
    # A rare coincidence is left out; more than that would be a leak in the generators.
    assert len(dropped) <= max(3, n // 20000), f"held-out names in the generated data: {sorted(set(dropped))}"
    return kinds, texts, ids, masks, dropped


def pack(ids, masks, eot, rng, judgments=None):
    """Rows of SEQ tokens, each starting at a conversation; conversations joined by <|endoftext|>,
    the tail padded. Labels on every token of a conversation, -100 on the separators and the
    padding; the class of each position: 2 in an assistant turn (masks: full loss weight; 3 in
    the conversations flagged by `judgments`: JUDGMENT_WEIGHT), 1 for the other text of a
    conversation (system, user and tool turns, turn heads: OTHER_WEIGHT), 0 for separators and
    padding (no loss)."""
    order = [i for i in range(len(ids)) if len(ids[i]) < SEQ]
    rng.shuffle(order)
    placed, row, fill = [], 0, 0  # (conversation, row, offset)
    for i in order:
        n = len(ids[i]) + 1
        if fill + n > SEQ:
            row, fill = row + 1, 0
        placed.append((i, row, fill))
        fill += n
    rows = np.full((row + 1, SEQ), eot, dtype=np.int64)
    labels = np.full((row + 1, SEQ), -100, dtype=np.int64)
    cls = np.zeros((row + 1, SEQ), dtype=np.uint8)
    for i, r, o in placed:
        n = len(ids[i])
        rows[r, o:o + n] = ids[i]
        labels[r, o:o + n] = ids[i]
        cls[r, o:o + n] = np.where(masks[i], 3 if judgments is not None and judgments[i] else 2, 1)
    # The weights follow the checked masks exactly: as many assistant positions as masked tokens.
    assert int((cls >= 2).sum()) == sum(int(masks[i].sum()) for i, _, _ in placed)
    assert ((labels == -100) == (cls == 0)).all()
    return torch.from_numpy(rows), torch.from_numpy(labels), torch.from_numpy(cls)


# ---------------------------------------------------------------------------------------------
# Target

def target_model(device):
    from transformers import AutoConfig, AutoModelForCausalLM
    half = int(TARGET["head_dim"] * TARGET["rope_parameters"]["partial_rotary_factor"]) // 2
    TARGET["rope_parameters"]["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
    rest = {k: v for k, v in TARGET.items() if k not in ("architectures", "model_type")}
    cfg = AutoConfig.for_model(TARGET["model_type"], **rest)
    cfg.architectures = TARGET["architectures"]
    torch.manual_seed(SEED)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).to(device)


def lr_at(step, total, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def timed_training(name, params, loss_fn, batches, minutes, peak_lr, log, smoke):
    """AdamW with warmup and cosine decay over a wall-clock budget: the step count is fixed
    after 20 timed steps so that the schedule ends when the budget does."""
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=torch.cuda.is_available())
    total, step, t0, t_probe = (12 if smoke else 10**9), 0, time.time(), None
    warmup = 5 if smoke else 150
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total, peak_lr, warmup)
        loss = loss_fn(next(batches))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step == 10:
            torch.cuda.synchronize() if torch.cuda.is_available() else None
            t_probe = time.time()
        if step == 30 and not smoke:
            torch.cuda.synchronize()
            per_step = (time.time() - t_probe) / 20
            total = int((minutes * 60 - (time.time() - t0)) / per_step) + 30
            log(f"{name}: {per_step * 1000:.1f} ms/step, {total} steps in {minutes} min")
        if step % 200 == 0 or step == total or smoke:
            note = getattr(loss_fn, "note", None)
            log(f"{name} step {step}/{total} loss {loss.item():.4f}"
                + (f" (assistant tokens {note.item():.4f})" if note is not None else "")
                + f" lr {lr_at(step, total, peak_lr, warmup):.2e} t {time.time() - t0:.0f}s")
    return step


def batches_of(rows, labels, cls, batch, device, rng):
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    while True:
        perm = torch.randperm(len(rows), generator=g)
        for i in range(0, len(perm) - batch + 1, batch):
            idx = perm[i:i + batch]
            yield (rows[idx].to(device, non_blocking=True), labels[idx].to(device, non_blocking=True),
                   cls[idx].to(device, non_blocking=True))


def token_weights(c, other=None):
    """Loss weight per position from its class (pack): 1 in assistant turns, OTHER_WEIGHT on the
    other text, 0 on separators and padding."""
    other = OTHER_WEIGHT if other is None else other
    return (c == 2).float() + JUDGMENT_WEIGHT * (c == 3).float() + other * (c == 1).float()


def target_loss(model):
    """Cross-entropy weighted per token (token_weights), normalised by the weights' sum; the mean
    over the assistant tokens alone is kept in fn.note for the log."""
    def fn(b):
        x, y, c = b
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), y[:, 1:].reshape(-1),
                             ignore_index=-100, reduction="none")
        w = token_weights(c[:, 1:]).reshape(-1)
        asst = (c[:, 1:] >= 2).reshape(-1).float()
        fn.note = (ce.detach() * asst).sum() / asst.sum().clamp(min=1)
        return (ce * w).sum() / w.sum()
    fn.note = None
    return fn


def save_target(model, out):
    from safetensors.torch import save_file
    sd = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            continue  # tied to model.embed_tokens.weight
        sd[k] = v.detach().to(torch.float32 if k.endswith("A_log") else torch.bfloat16).cpu().contiguous()
    # Shards of at most SHARD_BYTES (the device tool returns files of at most 16 MiB), listed in
    # model.safetensors.index.json as transformers writes them; one file when it fits.
    shards, size = [{}], 0
    for k in sorted(sd):
        nbytes = sd[k].numel() * sd[k].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][k] = sd[k]
        size += nbytes
    if len(shards) == 1:
        save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        for name, shard in zip(names, shards):
            save_file(shard, os.path.join(out, name), metadata={"format": "pt"})
        index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in sd.values())},
                 "weight_map": {k: name for name, shard in zip(names, shards) for k in shard}}
        json.dump(index, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)
    json.dump(TARGET | {"eos_token_id": [EOS, EOT], "pad_token_id": EOT}, open(os.path.join(out, "config.json"), "w"),
              indent=2)
    return sum(v.numel() for v in sd.values())


@torch.no_grad()
def perplexity(model, ids, window, device, mask):
    """Mean NLL over windows of `window` tokens, each from an empty context (as `splash perplexity`):
    over all predicted tokens, and over those in assistant turns (mask, per token id).
    Returns ((ppl, mean nll, tokens) for all, the same for the assistant tokens)."""
    nll, n, anll, an = 0.0, 0, 0.0, 0
    for s in range(0, len(ids), window):
        w = torch.tensor(ids[s:s + window], device=device)[None]
        if w.shape[1] < 2:
            continue
        logits = model(input_ids=w).logits.double()
        per = F.cross_entropy(logits[0, :-1], w[0, 1:], reduction="none")
        m = torch.tensor(mask[s + 1:s + w.shape[1]], device=device)
        nll += per.sum().item()
        n += w.shape[1] - 1
        anll += per[m].sum().item()
        an += int(m.sum())
    return (math.exp(nll / n), nll / n, n), (math.exp(anll / max(an, 1)), anll / max(an, 1), an)


# ---------------------------------------------------------------------------------------------
# DFlash draft (v1): same parameter names as z-lab's DFlashDraftModel.

def draft_config():
    from transformers import Qwen3Config
    h = TARGET["hidden_size"]
    cfg = Qwen3Config(
        vocab_size=TARGET["vocab_size"], hidden_size=h, intermediate_size=TARGET["intermediate_size"],
        num_hidden_layers=DRAFT_LAYERS, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        rms_norm_eps=1e-6, max_position_embeddings=TARGET["max_position_embeddings"],
        layer_types=["full_attention"] * DRAFT_LAYERS, tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    cfg.architectures = ["DFlashDraftModel"]
    cfg.dflash_config = {"block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": TAPS}
    cfg.num_target_layers = TARGET["num_hidden_layers"]
    cfg.block_size = BLOCK
    cfg.is_causal = False
    return cfg


def rms(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope(x, pos, theta):
    """Rotate-half RoPE over the whole head dim; x [B, H, N, D], pos [B, N]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    f = pos[:, None, :, None].float() * inv
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return (x.float() * cos + torch.cat([-x2, x1], -1).float() * sin).to(x.dtype)


class Draft(torch.nn.Module):
    """The DFlash v1 draft, with a batched forward over many blocks per row for training."""

    def __init__(self, cfg):
        super().__init__()
        h, inter, nh, nkv, hd = cfg.hidden_size, cfg.intermediate_size, 4, 2, 64
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, cfg.rope_parameters["rope_theta"]
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.fc = lin(len(TAPS) * h, h)
        self.hidden_norm = torch.nn.Parameter(torch.ones(h))
        self.norm = torch.nn.Parameter(torch.ones(h))
        self.layers = torch.nn.ModuleList()
        for _ in range(cfg.num_hidden_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            a = layer.self_attn
            a.q_proj, a.k_proj, a.v_proj, a.o_proj = lin(h, nh * hd), lin(h, nkv * hd), lin(h, nkv * hd), lin(nh * hd, h)
            a.q_norm, a.k_norm = torch.nn.Parameter(torch.ones(hd)), torch.nn.Parameter(torch.ones(hd))
            layer.mlp = torch.nn.Module()
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj = lin(h, inter), lin(h, inter), lin(inter, h)
            layer.input_layernorm = torch.nn.Parameter(torch.ones(h))
            layer.post_attention_layernorm = torch.nn.Parameter(torch.ones(h))
            self.layers.append(layer)
        for p in self.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=0.02)

    def state_dict_hf(self):
        """Parameter names of the reference checkpoint (norm weights end in `.weight`)."""
        out = {}
        for k, v in self.state_dict().items():
            if k.endswith("norm") or k.endswith("layernorm"):
                k += ".weight"
            out[k] = v
        return out

    def forward(self, taps, ctx_pos, noise, block_pos, mask):
        """taps [B, T, n·H] with positions ctx_pos [B, T]; noise [B, N, H] (block embeddings)
        at block_pos [B, N]; mask [B, N, T + N] (True: may attend). Returns hidden [B, N, H]."""
        ctx = rms(self.fc(taps), self.hidden_norm)
        x = noise
        B, N, _ = x.shape
        T = ctx.shape[1]
        for layer in self.layers:
            a = layer.self_attn
            hn = rms(x, layer.input_layernorm)
            q = a.q_proj(hn).view(B, N, self.nh, self.hd)
            q = rope(rms(q, a.q_norm).transpose(1, 2), block_pos, self.theta)
            k = torch.cat([a.k_proj(ctx), a.k_proj(hn)], 1).view(B, T + N, self.nkv, self.hd)
            v = torch.cat([a.v_proj(ctx), a.v_proj(hn)], 1).view(B, T + N, self.nkv, self.hd).transpose(1, 2)
            k = rope(rms(k, a.k_norm).transpose(1, 2), torch.cat([ctx_pos, block_pos], 1), self.theta)
            rep = self.nh // self.nkv
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])
            x = x + a.o_proj(o.transpose(1, 2).reshape(B, N, -1))
            hn = rms(x, layer.post_attention_layernorm)
            x = x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(hn)) * layer.mlp.up_proj(hn))
        return rms(x, self.norm)


def tap_features(target, x):
    with torch.no_grad(), torch.autocast(x.device.type, dtype=torch.bfloat16):
        hs = target(input_ids=x, output_hidden_states=True).hidden_states
    return torch.cat([hs[l + 1] for l in TAPS], -1).float()


def draft_batch(target, x, y, anchors_per_row, rng_t):
    """Anchors, block inputs, labels and the attention mask for a batch of packed rows."""
    B, T = x.shape
    dev = x.device
    taps = tap_features(target, x)
    K = anchors_per_row
    # K distinct anchors per row, at random among those whose next token has a label (inside an
    # assistant turn), others only where a row has fewer than K of them.
    score = torch.rand((B, T - BLOCK - 1), generator=rng_t, device="cpu").to(dev) + (y[:, 2:T - BLOCK + 1] != -100)
    a = score.topk(K, dim=1).indices + 1                                                        # anchor positions
    offs = torch.arange(BLOCK, device=dev)
    pos = (a[:, :, None] + offs).reshape(B, K * BLOCK)                                         # block positions
    ids = torch.where(offs == 0, x.gather(1, a)[:, :, None].expand(B, K, BLOCK), torch.full_like(pos.view(B, K, BLOCK), MASK))
    labels = y.gather(1, pos).view(B, K, BLOCK).clone()
    labels[:, :, 0] = -100                                                                     # the anchor is given
    ctx_ok = torch.arange(T, device=dev)[None, None, :] < a[:, :, None]                        # context before the anchor
    same = torch.eye(K, dtype=torch.bool, device=dev)[None].expand(B, K, K)
    mask = torch.cat([ctx_ok[:, :, None, :].expand(B, K, BLOCK, T).reshape(B, K * BLOCK, T),
                      same[:, :, None, :, None].expand(B, K, BLOCK, K, BLOCK).reshape(B, K * BLOCK, K * BLOCK)], -1)
    return taps, torch.arange(T, device=dev)[None].expand(B, T), ids.view(B, K * BLOCK), pos, mask, labels


@torch.no_grad()
def check_batched_blocks(draft, target, x, y, rng_t):
    """The training forward over many blocks with the block mask must equal one block at a
    time with its own context (what inference does)."""
    taps, ctx_pos, ids, pos, mask, _ = draft_batch(target, x[:1], y[:1], 4, rng_t)
    emb = target.get_input_embeddings()
    together = draft(taps, ctx_pos, emb(ids), pos, mask)
    worst = 0.0
    for k in range(4):
        a = int(pos[0, k * BLOCK])
        one = draft(taps[:, :a], ctx_pos[:, :a], emb(ids[:, k * BLOCK:(k + 1) * BLOCK]), pos[:, k * BLOCK:(k + 1) * BLOCK],
                    torch.ones(1, BLOCK, a + BLOCK, dtype=torch.bool, device=x.device))
        part = together[:, k * BLOCK:(k + 1) * BLOCK]
        worst = max(worst, ((one - part).abs().max() / one.abs().max()).item())
    assert worst < 1e-4, f"batched draft blocks differ from single blocks: {worst:.2e}"
    return worst


def draft_loss(draft, target, anchors, rng_t):
    emb, head = target.get_input_embeddings(), target.lm_head
    w = torch.exp(-torch.arange(BLOCK, dtype=torch.float32) / LOSS_DECAY)
    w = torch.cat([torch.zeros(1), w[:-1]])  # position 0 is the anchor; position k weighs exp(-(k-1)/decay)

    def fn(b):
        x, y, c = b
        y = y.masked_fill(c < 2, -100)  # the draft learns the assistant turns only, as before
        taps, ctx_pos, ids, pos, mask, labels = draft_batch(target, x, y, anchors, rng_t)
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            hidden = draft(taps, ctx_pos, emb(ids).detach(), pos, mask)
            logits = head(hidden).float()
        B, N, V = logits.shape
        ce = F.cross_entropy(logits.view(-1, V), labels.view(-1), ignore_index=-100, reduction="none").view(B, -1, BLOCK)
        weight = w.to(x.device)[None, None, :] * (labels != -100)
        return (ce * weight).sum() / weight.sum()
    return fn


def save_draft(draft, cfg, out):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    cfg.save_pretrained(out)
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in draft.state_dict_hf().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return sum(v.numel() for v in sd.values())


@torch.no_grad()
def acceptance(draft, target, prompts, new_tokens, device):
    """Greedy speculative decoding without caches (every verify is a full target pass): mean
    accepted tokens per target pass, and a check that the output equals plain greedy."""
    emb, head = target.get_input_embeddings(), target.lm_head
    passes = tokens = 0
    for p in prompts:
        def full(ids):
            out = target(input_ids=torch.tensor([ids], device=device), output_hidden_states=True)
            return out.logits[0].float(), torch.cat([out.hidden_states[l + 1] for l in TAPS], -1)[0].float()
        logits, feats = full(p)
        committed = list(p) + [int(logits[-1].argmax())]
        while len(committed) - len(p) < new_tokens and committed[-1] not in (EOS, EOT):
            start = len(committed) - 1
            ids = torch.tensor([[committed[-1]] + [MASK] * (BLOCK - 1)], device=device)
            mask = torch.ones(1, BLOCK, start + BLOCK, dtype=torch.bool, device=device)
            hidden = draft(feats[:start][None], torch.arange(start, device=device)[None], emb(ids),
                           torch.arange(start, start + BLOCK, device=device)[None], mask)
            proposals = [int(t) for t in head(hidden[0, 1:]).argmax(-1)]
            logits, feats = full(committed + proposals)
            post = [int(t) for t in logits[start:start + BLOCK].argmax(-1)]
            acc = 0
            while acc < BLOCK - 1 and proposals[acc] == post[acc]:
                acc += 1
            committed += proposals[:acc] + [post[acc]]
            feats = feats[: len(committed) - 1]
            passes += 1
            tokens += acc + 1
    return tokens / max(1, passes), passes


def check_against_reference(draft, cfg, ref_path, out, target, prompt, device):
    """Loads the saved draft into z-lab's DFlashDraftModel; its block logits must match ours."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("dflash_reference", ref_path)
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    model = ref.DFlashDraftModel.from_pretrained(out, dtype=torch.float32).to(device).eval()
    model.config._attn_implementation = "sdpa"
    emb, head = target.get_input_embeddings(), target.lm_head
    with torch.no_grad():
        out_t = target(input_ids=torch.tensor([prompt], device=device), output_hidden_states=True)
        feats = torch.cat([out_t.hidden_states[l + 1] for l in TAPS], -1).float()
        start = len(prompt) - 1
        ids = torch.tensor([[prompt[-1]] + [MASK] * (BLOCK - 1)], device=device)
        h_ref = model(target_hidden=feats[:, :start], noise_embedding=emb(ids).float(),
                      position_ids=torch.arange(start + BLOCK, device=device)[None])[:, 1 - BLOCK:]
        ours = Draft(cfg).to(device)
        ours.load_state_dict({k.removesuffix(".weight") if ("norm" in k and k.endswith("norm.weight")) else k: v.float()
                              for k, v in model.state_dict().items()})
        mask = torch.ones(1, BLOCK, start + BLOCK, dtype=torch.bool, device=device)
        h_ours = ours(feats[:, :start], torch.arange(start, device=device)[None], emb(ids).float(),
                      torch.arange(start, start + BLOCK, device=device)[None], mask)[:, 1:]
        l_ref, l_ours = head(h_ref.float()), head(h_ours)
    err = ((l_ref - l_ours).abs().max() / l_ref.abs().max()).item()
    same = bool((l_ref.argmax(-1) == l_ours.argmax(-1)).all())
    return err, same


# ---------------------------------------------------------------------------------------------

def main():
    global EOS, EOT, MASK, TAPS, OTHER_WEIGHT, JUDGMENT_WEIGHT
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--conversations", type=int, default=600_000)
    ap.add_argument("--target-minutes", type=float, default=5.0)
    ap.add_argument("--draft-minutes", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", help="a trained target (config.json + model.safetensors): train the draft only")
    ap.add_argument("--init-target", help="a target to go on training (a previous call's --out, with --no-draft): "
                    "fresh optimiser, --peak-lr, its step count added")
    ap.add_argument("--no-draft", action="store_true", help="train and save the target only (the first of two calls)")
    ap.add_argument("--data-seed", type=int, default=SEED,
                    help="seed of the training conversations (another for a second call: fresh data)")
    ap.add_argument("--peak-lr", type=float, default=3e-3, help="the target's peak learning rate")
    ap.add_argument("--dflash-ref", help="z-lab/dflash dflash/model.py, for the parity check")
    ap.add_argument("--smoke", action="store_true", help="a few steps on a small model (CPU test of the script)")
    ap.add_argument("--other-weight", type=float, default=OTHER_WEIGHT,
                    help="loss weight of the tokens outside assistant turns (assistant tokens weigh 1)")
    ap.add_argument("--judgment-share", type=float, default=0.0,
                    help="share of the conversations drawn from gen_judgment (scoring prompts) instead of the mixture")
    ap.add_argument("--judgment-weight", type=float, default=JUDGMENT_WEIGHT,
                    help="loss weight of the scoring conversations' assistant tokens")
    ap.add_argument("--init-draft", help="a draft to go on training (a draft/ folder such as models/demo/draft) "
                    "instead of a fresh one: for a target fine-tuned from the one that draft was trained on")
    ap.add_argument("--draft-peak-lr", type=float, default=2e-3, help="the draft's peak learning rate")
    ap.add_argument("--append-layers", help="with --init-target: layers to add after its last one, e.g. "
                    "linear,full,linear,full; they start as identities (output projections zero)")
    args = ap.parse_args()
    if args.data_seed == SEED + 1:
        ap.error(f"--data-seed {SEED + 1} is the held-out text's seed: choose another")
    if args.target and args.init_target:
        ap.error("--target trains the draft only; --init-target goes on training the target: give one")
    appended = [{"linear": "linear_attention", "full": "full_attention"}.get(k.strip())
                for k in args.append_layers.split(",")] if args.append_layers else []
    if None in appended:
        ap.error("--append-layers takes a comma-separated list of `linear` and `full`")
    if appended and not args.init_target:
        ap.error("--append-layers grows a trained target: give it --init-target")
    OTHER_WEIGHT, JUDGMENT_WEIGHT = args.other_weight, args.judgment_weight
    os.makedirs(args.out, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logf = open(os.path.join(args.out, "train.log"), "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    tok = data.load_tokenizer(DEMO)
    EOS, EOT, MASK = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|mask|>")
    if args.smoke:
        TARGET.update(hidden_size=64, num_hidden_layers=4, layer_types=TARGET["layer_types"][:4], intermediate_size=96,
                      head_dim=16, linear_key_head_dim=8, linear_value_head_dim=8)
        TAPS = [0, 1, 2]
        args.conversations, args.batch = 400, 4
    t0 = time.time()
    workers = max(1, min(16, os.cpu_count() or 1))
    kinds, texts, ids, masks, dropped = make_conversations(args.data_seed, args.conversations, workers,
                                                           judgment_share=args.judgment_share)
    hk, htexts, hids, hmasks, _ = make_conversations(SEED + 1, 2000, workers)  # held out: another seed
    ntok = sum(len(i) for i in ids)
    ntrained = sum(int(m.sum()) for m in masks)
    log(f"data: {len(ids)} conversations, {ntok / 1e6:.1f}M tokens ({ntrained / 1e6:.1f}M in assistant turns, "
        f"full loss weight), {time.time() - t0:.0f}s; {len(dropped)} left out for a held-out name; kinds "
        + json.dumps({k: kinds.count(k) for k in sorted(set(kinds))}))
    nconv, nturns, mt, mn = check_assistant_mask(tok, htexts[:300] + texts[:300], hids[:300] + ids[:300],
                                                 hmasks[:300] + masks[:300])
    log(f"loss mask: exactly the {nturns} assistant turns of {nconv} rendered conversations ({mt}/{mn} tokens at full weight)")
    rng = random.Random(args.data_seed)
    rows, labels, cls = pack(ids, masks, EOT, rng, [k == "judgment" for k in kinds])
    log(f"packed: {rows.shape[0]} rows of {SEQ}, {(rows != EOT).float().mean():.3f} of positions are text, "
        f"{(cls == 2).float().mean():.3f} in assistant turns (loss weight 1), {(cls == 3).float().mean():.4f} in "
        f"scoring answers (weight {JUDGMENT_WEIGHT}), {(cls == 1).float().mean():.3f} "
        f"other text (weight {OTHER_WEIGHT}); the assistant turns carry "
        f"{(cls >= 2).float().mul(token_weights(cls)).sum() / token_weights(cls).sum():.2f} of the loss weight, the "
        f"scoring answers {(cls == 3).float().mul(token_weights(cls)).sum() / token_weights(cls).sum():.2f}")
    heldout = "".join(htexts[:300])
    open(os.path.join(args.out, "heldout.txt"), "w").write(heldout)

    # --- target
    torch.backends.cuda.matmul.allow_tf32 = True
    loaded = args.target or args.init_target
    if loaded:  # its layers (a grown target has more than TARGET's)
        cfg = json.load(open(os.path.join(loaded, "config.json")))
        if cfg["hidden_size"] != TARGET["hidden_size"]:
            raise SystemExit(f"{loaded}: hidden_size {cfg['hidden_size']}, this script trains {TARGET['hidden_size']}")
        TARGET["layer_types"] = cfg["layer_types"]
    grown_from = len(TARGET["layer_types"])
    TARGET["layer_types"] = TARGET["layer_types"] + appended
    TARGET["num_hidden_layers"] = len(TARGET["layer_types"])
    model = target_model(device)
    nparams = sum(p.numel() for p in model.parameters())
    log(f"target: {nparams / 1e6:.2f}M parameters")
    def load_target(path):
        from safetensors.torch import load_file
        index = os.path.join(path, "model.safetensors.index.json")
        files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
        sd = {k: v for f in files for k, v in load_file(os.path.join(path, f)).items()}
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        new = [k for k in missing if k.startswith("model.layers.") and int(k.split(".")[2]) >= grown_from]
        if unexpected or len(new) != len(missing):
            raise SystemExit(f"{path} does not fit the target: missing {sorted(set(missing) - set(new))}, "
                             f"unexpected {unexpected}")
        if appended:
            # New layers add nothing to the residual stream until trained: the grown model starts
            # as the loaded one (same logits), and gradients reach the zeroed projections first.
            for layer in model.model.layers[grown_from:]:
                mixer = layer.self_attn.o_proj if hasattr(layer, "self_attn") else layer.linear_attn.out_proj
                for w in (mixer.weight, layer.mlp.down_proj.weight):
                    torch.nn.init.zeros_(w)
            log(f"target: {len(appended)} layers appended ({','.join(args.append_layers.split(','))}), "
                f"{TARGET['num_hidden_layers']} in all")
        metrics_path = os.path.join(path, "metrics.json")
        log(f"target: loaded from {path}")
        return json.load(open(metrics_path))["target"]["steps"] if os.path.exists(metrics_path) else 0

    if args.target:
        steps = load_target(args.target)
    else:
        before = load_target(args.init_target) if args.init_target else 0
        model.train()
        steps = before + timed_training("target", list(model.parameters()), target_loss(model),
                                        batches_of(rows, labels, cls, args.batch, device, rng), args.target_minutes,
                                        args.peak_lr, log, args.smoke)
    model.eval()
    saved = save_target(model, args.out)
    # Evaluate in the shipped precision.
    model = model.to(torch.bfloat16).float()
    hold_ids = np.array(tok.encode(heldout).ids)
    hold_mask = assistant_mask(hold_ids, *special_ids(tok))
    (ppl, nll, n), (appl, anll, an) = perplexity(model, hold_ids.tolist(), 512, device, hold_mask)
    log(f"target: {steps} steps, held-out perplexity {ppl:.4f} over all {n} predicted tokens, {appl:.4f} over the "
        f"{an} in assistant turns (windows of 512)")
    metrics = {"target": {"parameters": saved, "steps": steps, "heldout_ppl": ppl, "heldout_mean_nll": nll,
                          "heldout_predicted": n, "heldout_ppl_assistant": appl, "heldout_mean_nll_assistant": anll,
                          "heldout_predicted_assistant": an, "other_text_weight": OTHER_WEIGHT,
                          "tokens_trained": steps * args.batch * SEQ,
                          "train_conversations": len(ids), "train_tokens": ntok}}
    json.dump(metrics, open(os.path.join(args.out, "metrics.json"), "w"), indent=1)
    if args.no_draft:
        log(f"done in {time.time() - t0:.0f}s (target only)")
        return

    # --- draft
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = draft_config()
    torch.manual_seed(SEED + 1)
    draft = Draft(cfg).to(device)
    if args.init_draft:
        from safetensors.torch import load_file
        try:
            sd = load_file(os.path.join(args.init_draft, "model.safetensors"))
            draft.load_state_dict({k.removesuffix(".weight") if k.endswith("norm.weight") else k: v.float()
                                   for k, v in sd.items()})
            log(f"draft: loaded from {args.init_draft}")
        except Exception as e:  # a fresh draft rather than no draft
            log(f"draft: could not load {args.init_draft} ({e}); training a fresh one")
    rng_t = torch.Generator().manual_seed(SEED + 2)
    x0, y0 = rows[:1].to(device), labels[:1].masked_fill(cls[:1] < 2, -100).to(device)
    torch.backends.cuda.matmul.allow_tf32 = False  # the check compares in full f32
    log(f"draft: batched blocks vs single blocks, max rel error {check_batched_blocks(draft, model, x0, y0, rng_t):.1e}")
    torch.backends.cuda.matmul.allow_tf32 = True
    dsteps = timed_training("draft", list(draft.parameters()), draft_loss(draft, model, 32, rng_t),
                            batches_of(rows, labels, cls, args.batch, device, rng), args.draft_minutes, args.draft_peak_lr, log,
                            args.smoke)
    draft.eval()
    dsaved = save_draft(draft, cfg, os.path.join(args.out, "draft"))
    draft = draft.to(torch.bfloat16).float()
    prompts = []
    for text in htexts[300:]:
        # prompt = everything up to the last assistant turn's generation prompt
        cut = text.rfind("<|im_start|>assistant\n")
        if cut > 0:
            prompts.append(tok.encode(text[: cut + len("<|im_start|>assistant\n")]).ids)
        if len(prompts) == (4 if args.smoke else 60):
            break
    tau, passes = acceptance(draft, model, prompts, 64, device)
    log(f"draft: {dsteps} steps, {dsaved / 1e6:.2f}M parameters, mean accepted tokens per target pass {tau:.3f} "
        f"over {passes} passes ({len(prompts)} held-out prompts, greedy)")
    metrics["draft"] = {"parameters": dsaved, "steps": dsteps, "block": BLOCK, "taps": TAPS,
                        "tokens_per_pass": tau, "passes": passes, "prompts": len(prompts)}
    if args.dflash_ref:
        err, same = check_against_reference(draft, cfg, args.dflash_ref, os.path.join(args.out, "draft"), model,
                                            prompts[0], device)
        log(f"reference DFlashDraftModel vs training forward: max rel logit error {err:.2e}, same argmax {same}")
        metrics["draft"]["reference_max_rel_err"] = err
        metrics["draft"]["reference_same_argmax"] = same
    json.dump(metrics, open(os.path.join(args.out, "metrics.json"), "w"), indent=1)
    log(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
