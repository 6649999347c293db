#!/usr/bin/env python3
"""Write a GGUF checkpoint with random weights at the geometry of a synthetic Qwen3.5 checkpoint.

    /tmp/venv-gguf/bin/python bench/make_synthetic_gguf.py SRC_DIR OUT.gguf --type TYPE [--seed N]

SRC_DIR is a directory written by `bench/make_synthetic.py`. Only its `config.json`,
`generation_config.json`, `tokenizer.json(.gz)`, `tokenizer_config.json` and
`chat_template.jinja` are read, never its weights: the tensor list comes from the config through
`bench/qwen35_layout.py` (the layout make_synthetic.py writes), and every quantised tensor is
written directly as random GGML blocks. Needs `gguf`, `numpy`, `tokenizers` and `safetensors`
(the last two through tests/fixtures/gguf/make_gguf_fixture.py):
`python3 -m venv /tmp/venv-gguf && /tmp/venv-gguf/bin/pip install gguf numpy safetensors tokenizers`.

Layout, as llama.cpp writes arch `qwen35` / `qwen35moe` (shared with
tests/fixtures/gguf/make_gguf_fixture.py, which checks it byte for byte against the real
converter): tensor names through gguf's TensorNameMap, `conv1d` squeezed to [C, K], `A_log` ->
`ssm_a`, `dt_bias` -> `ssm_dt.bias`, the fused `experts.gate_up_proj` split into
`ffn_gate_exps`/`ffn_up_exps` (conversion/qwen.py Qwen2MoeModel), every converter
hyper-parameter key, and the tokenizer metadata of the real Qwen3.5 tokenizer
(`tokenizer.ggml.pre` = "qwen35", `tokenizer.chat_template` from the checkpoint). Value
transforms (norm +1, V-head tiling) do not change shapes, so random values need none of them.

Tensor order: `Q8_0` is what `convert_hf_to_gguf.py --outtype q8_0` writes (tensors in sorted HF
name order). Every other type is what llama-quantize would write from a BF16 conversion: tensors
sorted by (layer, name) (llama_model_loader's weight_name_comparer), `general.file_type` set to
the target type in place.

TYPE:
  Q8_0       every matrix Q8_0 (the converter).
  Q4_0, Q4_K, Q6_K, IQ4_XS
             every matrix, `token_embd` and `output` included, in that type
             (`llama-quantize --pure`); file types MOSTLY_Q4_0 / Q4_K_S / Q6_K / IQ4_XS.
  Q4_K_M     llama-quantize's Q4_K_M rule (src/llama-quant.cpp), with two choices of ours:
             matrices Q4_K; Q6_K for `attn_v`, `attn_qkv` (llama-quant counts it as an attn_v
             tensor) and every `ffn_down*` in layers where use_more_bits(i, n) holds, i.e. the
             first and last eighth of the layers and every third layer in between
             (i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2); `output` Q6_K; `token_embd` Q6_K
             (llama-quantize gives that only to a tied embedding, Q4_K otherwise);
             `ssm_alpha`/`ssm_beta` Q8_0 (llama-quantize would leave them at Q4_K).
  UD-Q4_K_M  an Unsloth-like dynamic mix (model-spec §0.9: Q4_K, IQ4_XS, IQ4_NL, Q5_K, Q6_K,
             Q3_K, IQ3_S, Q8_0). Our deterministic assignment, with `more` = use_more_bits(i, n)
             and `low` = (not more and i odd):
               token_embd Q4_K, output Q6_K
               attn_qkv Q5_K if more else Q4_K; attn_gate IQ4_XS; ssm_out IQ4_NL;
               ssm_alpha/ssm_beta Q8_0
               attn_q/attn_k Q4_K, attn_v Q6_K, attn_output Q5_K
               ffn_gate(_exps) IQ3_S if low else Q4_K; ffn_up(_exps) Q3_K if low else Q4_K
               ffn_down Q6_K if more else Q5_K; ffn_down_exps Q5_K if more else IQ4_XS
               ffn_gate_shexp/ffn_up_shexp Q5_K, ffn_down_shexp Q6_K
             plus the four `quantize.imatrix.*` keys llama-quantize writes with an imatrix
             (marked synthetic). `general.file_type` MOSTLY_Q4_K_M.
A row length that the chosen type's block does not divide falls back as llama-quantize does
(IQ4_XS/IQ3_S -> IQ4_NL, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16;
the converter's Q8_0 -> F16). None of the bench presets needs it at hidden 512/1024.

Values. Tensors the converter keeps F32: norms 1 + N(0, 0.1) (GGUF stores 1 + w; `ssm_norm` is
used as w and gets the same), `ssm_a` = -exp(U(log 1, log 16)), `ssm_dt.bias` N(-5, 1.5),
`ssm_conv1d` N(0, 0.3), `ffn_gate_inp`/`ffn_gate_inp_shexp` N(0, 0.3). Quantised tensors:
random bytes, with every fp16 scale field set from make_dequant_fixture.scale_values (|v|
log-uniform over two decades, random sign) times a per-type factor, calibrated on 2^20 random
elements so that the dequantised weights have std 0.02; the `dmin`/`m` field of the types that
have one is d times a constant that centres the block on 0 (Q4_K: dmin = 7.5 d). F16 fallbacks
are N(0, 0.02). Each tensor has its own generator seeded with (seed, crc32(name)).

Memory: one tensor at a time (the largest, `token_embd`, is 248320 x hidden).
After writing, the file is read back with gguf.GGUFReader: tensor types are counted and a few
rows of every tensor type are dequantised with gguf.quants.dequantize (std, max, finiteness).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
import tempfile
import time
import zlib
from math import prod
from pathlib import Path

import numpy as np

import gguf
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "fixtures" / "gguf"))

import qwen35_layout  # noqa: E402
from make_dequant_fixture import FP16_OFFSETS, scale_values  # noqa: E402
from make_gguf_fixture import Converter, add_metadata, is_forced_f32  # noqa: E402

TARGET_STD = 0.02
CALIBRATION_ELEMS = 1 << 20
LFT = gguf.LlamaFileType

# type -> (general.file_type, llama-quantize output order)
VARIANTS = {
    "Q8_0": (LFT.MOSTLY_Q8_0, False),
    "Q4_0": (LFT.MOSTLY_Q4_0, True),
    "Q4_K": (LFT.MOSTLY_Q4_K_S, True),
    "Q6_K": (LFT.MOSTLY_Q6_K, True),
    "IQ4_XS": (LFT.MOSTLY_IQ4_XS, True),
    "Q4_K_M": (LFT.MOSTLY_Q4_K_M, True),
    "UD-Q4_K_M": (LFT.MOSTLY_Q4_K_M, True),
}

# llama-quant.cpp tensor_type_fallback
FALLBACK = {Q.IQ4_XS: Q.IQ4_NL, Q.IQ3_S: Q.IQ4_NL, Q.Q3_K: Q.Q4_0, Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1,
            Q.Q6_K: Q.Q8_0}

# Second fp16 field as a multiple of d, so that blocks are centred on 0:
# Q4_1/Q5_1 y = d q + m (q in 0..15 / 0..31); K-quants y = d sc q - dmin m with sc, m alike.
MIN_CENTRE = {"Q4_1": -7.5, "Q5_1": -15.5, "Q2_K": 1.5, "Q4_K": 7.5, "Q5_K": 15.5}

KNOWN_QWEN35_CHKHSH = {
    "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4",
    "1444df51289cfa8063b96f0e62b1125440111bc79a52003ea14b6eac7016fd5f",
}


# ---------------------------------------------------------------------------------------------
# Layout


def staged_source(src: Path, tmp: Path) -> Path:
    """A copy of SRC_DIR's config/tokenizer files, named like SRC_DIR (general.name comes from the
    directory name), with tokenizer.json decompressed: make_gguf_fixture reads `tokenizer.json`."""
    dst = tmp / src.resolve().name
    dst.mkdir()
    for f in ["config.json", "generation_config.json", "tokenizer_config.json", "chat_template.jinja"]:
        if (src / f).is_file():
            shutil.copyfile(src / f, dst / f)
    if (src / "tokenizer.json").is_file():
        shutil.copyfile(src / "tokenizer.json", dst / "tokenizer.json")
    else:
        with gzip.open(src / "tokenizer.json.gz", "rb") as fi, open(dst / "tokenizer.json", "wb") as fo:
            shutil.copyfileobj(fi, fo)
    return dst


def converter_tensors(c: Converter) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, shape outermost first) in the order convert_hf_to_gguf.py writes them."""
    specs = {s.name: tuple(s.shape) for s in qwen35_layout.tensor_specs(c.config, 0)}
    out: list[tuple[str, tuple[int, ...]]] = []
    for orig in sorted(specs):  # gguf.utility.SafetensorsLocal sorts by name
        name = c.filter_name(orig)
        if name is None:
            continue
        shape = specs[orig]
        # Qwen2MoeModel.modify_tensors: fused expert stacks [E, 2I, H] / [E, H, I]
        if name.endswith("mlp.experts.down_proj"):
            out.append((c.map_name(name + ".weight"), shape))
            continue
        if name.endswith("mlp.experts.gate_up_proj"):
            e, two_i, h = shape
            base = name.removesuffix(".gate_up_proj")
            for w in ["gate_proj", "up_proj"]:
                out.append((c.map_name(f"{base}.{w}.weight"), (e, two_i // 2, h)))
            continue
        # Qwen3NextModel.modify_tensors
        if name.endswith(".dt_bias"):
            name = name.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        elif "conv1d" in name:
            shape = tuple(d for d in shape if d != 1)
        out.append((c.map_name(name), shape))
    return out


def layer_of(name: str) -> int:
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def quantize_order(tensors):
    """llama_model_loader::weight_name_comparer: by layer (non-layer tensors first), then name."""
    return sorted(tensors, key=lambda t: (layer_of(t[0]), t[0]))


# ---------------------------------------------------------------------------------------------
# Tensor types


def use_more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp; C++ integer division (i >= n/8 whenever the modulo is reached)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m(name: str, n_layers: int) -> Q:
    if name in ("output.weight", "token_embd.weight"):
        return Q.Q6_K
    kind = name.split(".")[2]
    if kind in ("ssm_alpha", "ssm_beta"):
        return Q.Q8_0
    if kind in ("attn_v", "attn_qkv") or kind.startswith("ffn_down"):
        return Q.Q6_K if use_more_bits(layer_of(name), n_layers) else Q.Q4_K
    return Q.Q4_K


def ud_q4_k_m(name: str, n_layers: int) -> Q:
    if name == "output.weight":
        return Q.Q6_K
    if name == "token_embd.weight":
        return Q.Q4_K
    i = layer_of(name)
    kind = name.split(".")[2]
    more = use_more_bits(i, n_layers)
    low = not more and i % 2 == 1
    table = {
        "attn_qkv": Q.Q5_K if more else Q.Q4_K,
        "attn_gate": Q.IQ4_XS,
        "ssm_out": Q.IQ4_NL,
        "ssm_alpha": Q.Q8_0,
        "ssm_beta": Q.Q8_0,
        "attn_q": Q.Q4_K,
        "attn_k": Q.Q4_K,
        "attn_v": Q.Q6_K,
        "attn_output": Q.Q5_K,
        "ffn_gate": Q.IQ3_S if low else Q.Q4_K,
        "ffn_gate_exps": Q.IQ3_S if low else Q.Q4_K,
        "ffn_up": Q.Q3_K if low else Q.Q4_K,
        "ffn_up_exps": Q.Q3_K if low else Q.Q4_K,
        "ffn_down": Q.Q6_K if more else Q.Q5_K,
        "ffn_down_exps": Q.Q5_K if more else Q.IQ4_XS,
        "ffn_gate_shexp": Q.Q5_K,
        "ffn_up_shexp": Q.Q5_K,
        "ffn_down_shexp": Q.Q6_K,
    }
    if kind not in table:
        raise SystemExit(f"UD-Q4_K_M: no type for {name}")
    return table[kind]


def tensor_type(variant: str, name: str, shape: tuple[int, ...], n_layers: int) -> Q:
    if is_forced_f32(name, np.broadcast_to(np.float32(0), shape)):
        return Q.F32
    row = shape[-1]
    if variant == "Q8_0":
        # the converter falls back to F16 when quantize() refuses the row length
        return Q.Q8_0 if row % 32 == 0 else Q.F16
    if variant == "Q4_K_M":
        qt = q4_k_m(name, n_layers)
    elif variant == "UD-Q4_K_M":
        qt = ud_q4_k_m(name, n_layers)
    else:
        qt = Q[variant]
    if row % GGML_QUANT_SIZES[qt][0] != 0:
        qt = FALLBACK.get(qt, Q.F16)
        if row % GGML_QUANT_SIZES[qt][0] != 0:
            qt = Q.F16
    return qt


# ---------------------------------------------------------------------------------------------
# Random values


def random_blocks(qt: Q, n_blocks: int, rng: np.random.Generator, factor: float) -> np.ndarray:
    """[n_blocks, type_size] uint8: random bytes, fp16 scale fields from scale_values x factor."""
    _, type_size = GGML_QUANT_SIZES[qt]
    offsets = FP16_OFFSETS.get(qt.name) or []
    if not offsets:
        raise SystemExit(f"no fp16 scale field known for {qt.name}")
    n = n_blocks * type_size
    raw = rng.bit_generator.random_raw((n + 7) // 8).view(np.uint8)[:n].reshape(n_blocks, type_size)
    d = (scale_values(rng, n_blocks).astype(np.float32) * np.float32(factor)).astype(np.float16)
    if not (np.all(np.isfinite(d)) and np.all(d != 0)):
        raise SystemExit(f"{qt.name}: scale factor {factor} gives zero or non-finite fp16 scales")
    raw[:, offsets[0]:offsets[0] + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    if len(offsets) == 2:
        m = (d.astype(np.float32) * np.float32(MIN_CENTRE[qt.name])).astype(np.float16)
        raw[:, offsets[1]:offsets[1] + 2] = m.view(np.uint8).reshape(n_blocks, 2)
    return raw


_FACTORS: dict[Q, float] = {}


def scale_factor(qt: Q) -> float:
    """Factor on scale_values() that gives dequantised std TARGET_STD (measured, fixed seed)."""
    if qt not in _FACTORS:
        block, _ = GGML_QUANT_SIZES[qt]
        rng = np.random.default_rng([20261201, zlib.crc32(qt.name.encode())])
        y = dequantize(random_blocks(qt, CALIBRATION_ELEMS // block, rng, 1.0), qt)
        _FACTORS[qt] = TARGET_STD / float(np.std(y, dtype=np.float64))
    return _FACTORS[qt]


def f32_values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if name.endswith("_norm.weight"):
        x = 1.0 + rng.normal(0.0, 0.1, shape)
    elif name.endswith(".ssm_a"):
        x = -np.exp(rng.uniform(np.log(1.0), np.log(16.0), shape))
    elif name.endswith(".ssm_dt.bias"):
        x = rng.normal(-5.0, 1.5, shape)
    elif name.endswith((".ssm_conv1d.weight", ".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight")):
        x = rng.normal(0.0, 0.3, shape)
    else:
        raise SystemExit(f"no F32 fill for {name}")
    return x.astype(np.float32)


def tensor_data(name: str, shape: tuple[int, ...], qt: Q, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if qt == Q.F32:
        return f32_values(name, shape, rng)
    if qt == Q.F16:
        return rng.normal(0.0, TARGET_STD, shape).astype(np.float16)
    block, _ = GGML_QUANT_SIZES[qt]
    return random_blocks(qt, prod(shape) // block, rng, scale_factor(qt))


def nbytes(shape: tuple[int, ...], qt: Q) -> int:
    return prod(gguf.quants.quant_shape_to_byte_shape(shape, qt))


# ---------------------------------------------------------------------------------------------
# Writing and checking


def write(src: Path, out: Path, variant: str, seed: int) -> None:
    t0 = time.time()
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") not in ("qwen3_5_text", "qwen3_5_moe_text"):
        raise SystemExit(f"{src}: model_type {config.get('model_type')!r}; expected a bench/make_synthetic.py checkpoint")
    arch = gguf.MODEL_ARCH.QWEN35MOE if config.get("num_experts") else gguf.MODEL_ARCH.QWEN35
    ftype, quantize_layout = VARIANTS[variant]
    with tempfile.TemporaryDirectory() as tmp:
        c = Converter(staged_source(src, Path(tmp)), arch)
        tensors = converter_tensors(c)
        if quantize_layout:
            tensors = quantize_order(tensors)
        plan = [(name, shape, tensor_type(variant, name, shape, c.block_count)) for name, shape in tensors]

        w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[arch])
        for name, shape, qt in plan:
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes(shape, qt), raw_dtype=qt)
        info = add_metadata(w, c, ftype, pre="qwen35")
        if variant.startswith("UD-"):
            # what llama-quantize adds when given an imatrix (Unsloth's files have them)
            w.add_string("quantize.imatrix.file", "none (synthetic weights)")
            w.add_string("quantize.imatrix.dataset", "none (synthetic weights)")
            w.add_int32("quantize.imatrix.entries_count", sum(qt not in (Q.F32, Q.F16) for _, _, qt in plan))
            w.add_int32("quantize.imatrix.chunks_count", 0)
    known = "a known qwen35 hash" if info["chkhsh"] in KNOWN_QWEN35_CHKHSH else "not a hash we know"
    print(f"{arch.name.lower()} {variant}: {len(plan)} tensors, tokenizer chkhsh {info['chkhsh'][:16]}… ({known})")

    out.parent.mkdir(parents=True, exist_ok=True)
    w.write_header_to_file(path=out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qt in plan:
        w.write_tensor_data(tensor_data(name, shape, qt, seed))
    w.close()
    print(f"wrote {out}: {out.stat().st_size:,} bytes in {time.time() - t0:.1f}s")
    factors = ", ".join(f"{qt.name} {f:.3g}" for qt, f in sorted(_FACTORS.items(), key=lambda kv: kv[0].name))
    print(f"scale factors on scale_values(): {factors}")


def verify(path: Path, sample_rows: int = 64) -> None:
    """Read back with GGUFReader: type counts, and dequantised stats per type on sampled rows."""
    r = gguf.GGUFReader(path)
    by_type: dict[str, list] = {}
    for t in r.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    pre = r.fields["tokenizer.ggml.pre"]
    ftype = int(r.fields["general.file_type"].parts[-1][0])
    print(f"read back {path.name}: {len(r.tensors)} tensors, {path.stat().st_size:,} bytes, "
          f"general.file_type {ftype} ({LFT(ftype).name}), tokenizer.ggml.pre "
          f"{bytes(pre.parts[-1]).decode()!r}")
    print("  " + ", ".join(f"{k} {len(v)}" for k, v in sorted(by_type.items(), key=lambda kv: -len(kv[1]))))
    f32: dict[str, list[np.ndarray]] = {}
    for t in by_type.get("F32", []):
        kind = re.sub(r"^blk\.\d+\.", "", t.name).removesuffix(".weight")
        kind = "*_norm" if kind.endswith("_norm") else kind
        f32.setdefault(kind, []).append(np.asarray(t.data, dtype=np.float64).ravel())
    for kind, xs in sorted(f32.items()):
        v = np.concatenate(xs)
        print(f"  F32 {kind:18s} {len(xs):4d} tensors: mean {v.mean():+.3f} std {v.std():.3f} "
              f"range [{v.min():+.3f}, {v.max():+.3f}]")
    for tname, ts in sorted(by_type.items()):
        if tname == "F32":
            continue
        qt = Q[tname]
        vals = []
        for t in ts[:: max(1, len(ts) // 4)][:4]:  # up to 4 tensors spread over the file
            data = np.asarray(t.data)
            rows = data.reshape(-1, data.shape[-1])
            idx = np.linspace(0, rows.shape[0] - 1, min(sample_rows, rows.shape[0])).astype(np.int64)
            vals.append(dequantize(np.ascontiguousarray(rows[idx]), qt).astype(np.float64).ravel())
        v = np.concatenate(vals)
        finite = bool(np.all(np.isfinite(v)))
        print(f"  {tname:7s} {len(ts):4d} tensors; {v.size:,} sampled values: mean {v.mean():+.4f} "
              f"std {v.std():.4f} max|v| {np.abs(v).max():.4f} finite {finite}")
        if not finite:
            raise SystemExit(f"{path}: non-finite {tname} values")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src_dir", type=Path, help="checkpoint directory from bench/make_synthetic.py")
    ap.add_argument("out", type=Path, help="output .gguf")
    ap.add_argument("--type", required=True, choices=list(VARIANTS), dest="variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-verify", action="store_true", help="skip reading the file back")
    args = ap.parse_args()
    write(args.src_dir, args.out, args.variant, args.seed)
    if not args.no_verify:
        verify(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
