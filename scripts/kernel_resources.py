"""Registers, spills and shared memory of every CUDA kernel (crates/splash-backend/src/cuda/kernels/), without a GPU.

Compiles the source with NVRTC exactly as the server does (model dimensions as -D flags, PTX
for compute_XX), then assembles the PTX with ptxas -v for the chip, which is what the driver
does at load. A kernel that spills or needs too many registers shows up here before any GPU
time is spent. Run by scripts/kernel-resources.sh, which installs NVRTC and ptxas from PyPI.
"""

import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile


def nvrtc_ptx(lib, source, options):
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source, b"splash_kernels.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = (ctypes.c_char_p * len(options))(*options)
    status = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if status:
        sys.exit("NVRTC failed:\n" + log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", required=True, help="site-packages holding nvidia/cu13")
    ap.add_argument("--sm", default="90", help="compute capability, e.g. 90 for the H200")
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--gdn-dk", type=int, default=128)
    ap.add_argument("--gdn-dv", type=int, default=128)
    ap.add_argument("--only", default="", help="regular expression over kernel names")
    ap.add_argument("-D", "--define", action="append", default=[], help="a kernel constant, e.g. I8TC16_REGS=128")
    args = ap.parse_args()

    cu13 = os.path.join(args.tools, "nvidia", "cu13")
    lib = ctypes.CDLL(glob.glob(os.path.join(cu13, "lib", "libnvrtc.so.*"))[0])
    cuda = os.path.join(os.path.dirname(__file__), "..", "crates", "splash-backend", "src", "cuda")
    # The kernel files in the order compile.rs concatenates them (KERNEL_FILES).
    names = re.findall(r'include_str!\("kernels/([\w.]+)"\)', open(os.path.join(cuda, "compile.rs")).read())
    source = b"".join(f'#line 1 "kernels/{n}"\n'.encode() + open(os.path.join(cuda, "kernels", n), "rb").read() for n in names)
    options = [
        f"--gpu-architecture=compute_{args.sm}".encode(),
        f"-DHEAD_DIM={args.head_dim}".encode(),
        f"-DGDN_DK={args.gdn_dk}".encode(),
        f"-DGDN_DV={args.gdn_dv}".encode(),
    ] + [f"-D{d}".encode() for d in args.define]
    ptx = nvrtc_ptx(lib, source, options)
    with tempfile.TemporaryDirectory() as tmp:
        ptx_path = os.path.join(tmp, "k.ptx")
        open(ptx_path, "wb").write(ptx)
        out = subprocess.run(
            [os.path.join(cu13, "bin", "ptxas"), f"-arch=sm_{args.sm}", "-v", ptx_path, "-o", os.path.join(tmp, "k.cubin")],
            capture_output=True,
            text=True,
        )
    if out.returncode:
        sys.exit("ptxas failed:\n" + out.stderr)
    rows, name = [], None
    for line in out.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            spill, stack = "0 / 0", 0
        # The stack frame holds spills and local arrays: an array indexed by a value known only
        # at run time lives there, in local memory, without any spill being reported.
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            stack, spill = int(m.group(1)), f"{m.group(2)} / {m.group(3)}"
        m = re.search(r"Used (\d+) registers.*?(?:(\d+) bytes smem)?$", line)
        if m and name:
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((name, int(m.group(1)), spill, stack, int(smem.group(1)) if smem else 0))
            name = None
    only = re.compile(args.only) if args.only else None
    print(f"sm_{args.sm}, head dim {args.head_dim}, GDN {args.gdn_dk}/{args.gdn_dv}")
    print(f"{'kernel':<34} {'regs':>5} {'spill st/ld (B)':>16} {'stack (B)':>10} {'smem (B)':>9}")
    for name, regs, spill, stack, smem in sorted(rows):
        if only is None or only.search(name):
            print(f"{name:<34} {regs:>5} {spill:>16} {stack:>10} {smem:>9}")


if __name__ == "__main__":
    main()
