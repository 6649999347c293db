"""Tiny, dependency-light safetensors writer for random test checkpoints.

Shared by `tests/fixtures/qwen35-realvocab/make_demo.py` and `bench/make_synthetic.py`.
Needs only numpy (the `safetensors` package is used by callers for verification only).

Why hand-written: numpy has no bfloat16 dtype, so `safetensors.numpy.save_file` cannot
emit `"dtype": "BF16"`. We therefore generate float32, round to bf16 bit patterns
(round-to-nearest-even on the top 16 bits) held in uint16, and write the file ourselves:

    [u64 little-endian header length N][N bytes of JSON header, space-padded][raw data]

Header: {"__metadata__": {...}, name: {"dtype", "shape", "data_offsets": [begin, end]}}
with offsets relative to the start of the data section. Tensors are laid out in
sorted-name order (the order the official writer uses), contiguous, no gaps.

Random values are reproducible and independent of write order: each tensor gets its own
generator seeded with (seed, crc32(name)), and large tensors are produced in fixed-size
chunks so memory stays bounded.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

# elements generated per chunk (fixed: changing it changes the random values)
CHUNK_ELEMS = 1 << 22

DTYPE_BYTES = {"BF16": 2, "F32": 4}


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint16 bf16 bit patterns, round-to-nearest-even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = (u >> 16) & 1
    r += 0x7FFF
    r += u
    r >>= 16
    return r.astype(np.uint16)


def bf16_bits_to_f32(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


@dataclass
class TensorSpec:
    """One tensor to write.

    init:
      "normal"  -> mean + std * N(0,1)
      "const"   -> filled with `mean`
      "array"   -> the explicit float32 `array` (small tensors only)
    """

    name: str
    shape: tuple
    dtype: str = "BF16"  # "BF16" or "F32"
    init: str = "normal"
    std: float = 0.02
    mean: float = 0.0
    array: Optional[np.ndarray] = field(default=None, repr=False)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def _chunks(spec: TensorSpec, seed: int):
    """Yield float32 chunks (flattened, row-major) of the tensor's values."""
    n = spec.numel
    if spec.init == "array":
        a = np.asarray(spec.array, dtype=np.float32)
        assert a.shape == tuple(spec.shape), (spec.name, a.shape, spec.shape)
        yield a.reshape(-1)
        return
    if spec.init == "const":
        done = 0
        while done < n:
            m = min(CHUNK_ELEMS, n - done)
            yield np.full(m, spec.mean, dtype=np.float32)
            done += m
        return
    assert spec.init == "normal", spec.init
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    done = 0
    while done < n:
        m = min(CHUNK_ELEMS, n - done)
        x = rng.standard_normal(m, dtype=np.float32)
        if spec.std != 1.0:
            x *= np.float32(spec.std)
        if spec.mean != 0.0:
            x += np.float32(spec.mean)
        yield x
        done += m


def write_safetensors(path: str, specs: list[TensorSpec], seed: int, metadata: Optional[dict] = None,
                      progress: Optional[Callable[[str], None]] = None) -> int:
    """Write `specs` to `path`. Returns the total number of parameters."""
    assert sys.byteorder == "little", "writer assumes a little-endian host"
    specs = sorted(specs, key=lambda s: s.name)
    names = [s.name for s in specs]
    assert len(set(names)) == len(names), "duplicate tensor names"
    header = {"__metadata__": dict(metadata or {"format": "pt"})}
    off = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": [int(d) for d in s.shape],
                          "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((-len(hb)) % 8)  # pad so the data section starts 8-byte aligned
    total = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for s in specs:
            if progress:
                progress(s.name)
            written = 0
            for x in _chunks(s, seed):
                if s.dtype == "BF16":
                    buf = f32_to_bf16_bits(x)
                else:
                    buf = x.astype("<f4", copy=False)
                f.write(buf.tobytes())  # host is little-endian (asserted above)
                written += buf.nbytes
            assert written == s.nbytes, (s.name, written, s.nbytes)
            total += s.numel
    return total


def read_header(path: str) -> dict:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def verify_safetensors(path: str) -> None:
    """Check the file with the official `safetensors` reader (if installed) and our own parser."""
    import os

    hdr = read_header(path)
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
    end = max(v["data_offsets"][1] for k, v in hdr.items() if k != "__metadata__")
    assert os.path.getsize(path) == 8 + n + end, "file size does not match header"
    try:
        from safetensors import safe_open
    except ImportError:
        return
    with safe_open(path, framework="numpy") as st:
        keys = set(st.keys())
        assert keys == set(hdr) - {"__metadata__"}
        for k in keys:
            sl = st.get_slice(k)
            assert sl.get_dtype() == hdr[k]["dtype"], k
            assert list(sl.get_shape()) == hdr[k]["shape"], k
            if hdr[k]["dtype"] == "F32":
                st.get_tensor(k)  # numpy can load F32 directly
