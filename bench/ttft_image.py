#!/usr/bin/env python3
"""Time to first token of image and PDF prompts through `splash serve`.

    python3 bench/ttft_image.py --model M.gguf [--mmproj P.gguf] [--device cuda]
        [--images 1024x1024,2048x2048] [--pdf-pages 10] [--repeat 3] [--bin target/release/splash]

Starts `splash serve` on a loopback port and sends chat completions of one user message: a
picture of each `--images` size and a question, a `--pdf-pages` page PDF and a question, and
a text-only prompt as long as the first picture's. Each request is answered with one token
(`max_tokens` 1, not streamed), so its time is the time to first token: the request parsed,
the image decoded and resized (the PDF read and its pages rendered), the vision tower, the
prefill and one sampled token. Every request carries pixels never sent before, so neither the
encoded-image cache nor the prefix cache serves it. Prints the median of `--repeat` requests
(after one untimed request of each kind) and the prompt tokens.
"""

import argparse
import base64
import statistics
import struct
import sys
import time
import zlib
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sdk"))
from pdf_file import pdf_of_streams  # noqa: E402
from splash_server import Server  # noqa: E402

WORDS = ("river stone cloud lantern harbor meadow copper violet signal orchard anchor "
         "thunder pebble canyon willow ember glacier falcon velvet compass").split()


def png(w, h, salt):
    """A smooth RGB pattern as a PNG; `salt` changes every pixel."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(7 * y + 13 * x + 50 * c + salt) % 256 for c in range(3)], axis=-1).astype(np.uint8)
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1).tobytes()

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b""))


def pdf(pages, salt):
    """US Letter pages of 40 lines of 12-point Helvetica text each, a frame and a diagonal."""
    streams = []
    for p in range(pages):
        lines = [f"Report {salt}, page {p + 1}, line {i + 1}: " + " ".join(WORDS[(i * 3 + p + k) % len(WORDS)]
                                                                          for k in range(8)) for i in range(40)]
        stream = "2 w 36 36 540 720 re S 36 36 m 576 756 l S\nBT /F1 12 Tf 54 730 Td 17 TL\n"
        streams.append(stream + "".join(f"({line}) Tj T*\n" for line in lines) + "ET\n")
    return pdf_of_streams(streams)


def ask(client, content):
    """Seconds to the one-token answer, and the prompt tokens."""
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    dt = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"HTTP {r.status_code}: {r.text[:500]}")
    return dt, r.json()["usage"]["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target" / "release" / "splash"))
    ap.add_argument("--model", required=True, help="what `splash serve --model` takes")
    ap.add_argument("--mmproj", help="what `splash serve --mmproj` takes")
    ap.add_argument("--device", help="what `splash serve --device` takes")
    ap.add_argument("--images", default="1024x1024,2048x2048")
    ap.add_argument("--pdf-pages", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    args = ["--max-context", "65536"]
    args += ["--mmproj", a.mmproj] if a.mmproj else []
    args += ["--device", a.device] if a.device else []
    server = Server(*args, binary=a.bin, model=a.model, ready_timeout=900)
    salt = iter(range(1, 1 << 30))
    question = {"type": "text", "text": "What does this show?"}

    def image(w, h):
        url = "data:image/png;base64," + base64.b64encode(png(w, h, next(salt))).decode()
        return [{"type": "image_url", "image_url": {"url": url}}, question]

    def document():
        data = base64.b64encode(pdf(a.pdf_pages, next(salt))).decode()
        return [{"type": "file", "file": {"filename": "report.pdf",
                                          "file_data": f"data:application/pdf;base64,{data}"}}, question]

    kinds = [(f"image {s}", lambda s=s: image(*map(int, s.split("x")))) for s in a.images.split(",") if s]
    if a.pdf_pages:
        kinds.append((f"PDF of {a.pdf_pages} pages", document))
    try:
        with httpx.Client(base_url=server.url, timeout=a.timeout) as c:
            first = None
            for name, make in kinds:
                ask(c, make())  # untimed: kernels compiled, buffers grown
                times, tokens = [], 0
                for _ in range(a.repeat):
                    dt, tokens = ask(c, make())
                    times.append(dt)
                first = first or tokens
                print(f"{name}: {tokens} prompt tokens, time to first token {statistics.median(times) * 1e3:.1f} ms "
                      f"(median of {a.repeat}: {', '.join(f'{t * 1e3:.1f}' for t in times)})", flush=True)
            # A text prompt of as many tokens as the first picture's, for what the text model
            # alone costs.
            sample = c.post("/tokenize", json={"content": " ".join(WORDS * 50)}).json()["tokens"]
            n = int(len(WORDS) * 50 * first / len(sample))
            text = lambda: f"{next(salt)}: " + " ".join(WORDS[(i * 7 + i // 20) % len(WORDS)] for i in range(n))  # noqa: E731
            ask(c, text())
            times = [ask(c, text()) for _ in range(a.repeat)]
            print(f"text only: {times[0][1]} prompt tokens, time to first token "
                  f"{statistics.median(t for t, _ in times) * 1e3:.1f} ms", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
