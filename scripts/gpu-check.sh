#!/usr/bin/env bash
# Builds the CUDA test and bench binaries here (no GPU or CUDA toolkit needed) and stages them
# in .device/ (git-ignored), with what the GPU machine needs to make synthetic checkpoints and
# the generated fixtures its tests read.
# Needs a Python with numpy (PYTHON=...) for the config files, and the fixture packages
# (tests/fixtures/requirements.txt) in SPLASH_FIXTURE_PYTHON, default .venv/bin/python (as
# scripts/test makes it). Prints the one command that runs them there (scripts/gpu-run.sh).
# `gpu-check.sh speed` (about half the time) stages only what the speed runs need: `splash`,
# `gemv_cuda` and `cuda_ops`, no generated fixtures (gpu-run.sh's `tests` part needs them).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
case "$what" in
  all) tests="cuda_ops cuda_parity speculative_cuda scheduler_cuda" crates="-p splash-backend -p splash-model -p splash-engine" ;;
  speed) tests="cuda_ops" crates="-p splash-backend" ;;
  *) echo "usage: scripts/gpu-check.sh [all|speed]" >&2; exit 2 ;;
esac
export CARGO_PROFILE_RELEASE_DEBUG=0
mkdir -p .device
# shellcheck disable=SC2086  # $crates is a list of arguments
bins=$(cargo test --release --features cuda $crates --no-run --message-format=json 2>/dev/null |
  TESTS="$tests" python3 -c 'import json,os,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in os.environ["TESTS"].split():
        print(m["target"]["name"], m["executable"])')
while read -r name exe; do cp "$exe" ".device/$name"; done <<<"$bins"
# The generated fixtures the GPU tests read (tests/fixtures/derived.rs, FOR_THE_GPU: the GGUFs and
# the MLX checkpoints),
# made here by cuda_parity's ignored test, which prints their target/fixtures/<set>-<hash>/
# directories: the GPU machine has no gguf or tokenizers. gpu-run.sh puts them back at
# target/fixtures/ there, where the tests find them.
rm -rf .device/fixtures
if [ "$what" = all ]; then
  mkdir -p .device/fixtures
  sets=$(SPLASH_FIXTURE_PYTHON=${SPLASH_FIXTURE_PYTHON:-$PWD/.venv/bin/python} "$(awk '$1 == "cuda_parity" {print $2}' <<<"$bins")" \
    --ignored --exact derived_fixtures_for_the_gpu_machine --nocapture | sed -n 's/^derived fixtures: //p')
  [ -n "$sets" ] || { echo "cuda_parity named no generated fixtures to stage" >&2; exit 1; }
  for d in $sets; do cp -r "$d" .device/fixtures/; done
fi
cargo build --release --features cuda -p splash-cli
cp target/release/splash .device/splash
bench=$(cargo bench --no-run --features cuda -p splash-backend --bench gemv_cuda --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])')
cp "$bench" .device/gemv_cuda
binaries=(.device/splash .device/gemv_cuda)
for t in $tests; do binaries+=(".device/$t"); done
strip "${binaries[@]}"
pwd > .device/built_in
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: -d .device gguf==0.19.0
for m in 27b:"--size 27b" 35b:"--size 35b-a3b --moe"; do
  [ -d ".device/cfg-${m%%:*}" ] || "${PYTHON:-python3}" bench/make_synthetic.py ".device/cfg-${m%%:*}" ${m#*:} --config-only
done
rm -f .device/cfg-*/tokenizer.json.gz  # gpu-run.sh copies the real-vocabulary fixture's
du -sh .device
# The device tool carries at most 64 MiB with the working tree (about 58 MB tracked): the
# staged files go as one archive (about 7 MB; xz -6 makes 12), unpacked there by gpu-run.sh.
mkdir -p .devpack
# Only what this run built, and earlier builds kept to compare with (.device/splash-before,
# .device/gemv_cuda-before).
staged=("${binaries[@]}" .device/built_in .device/cfg-27b .device/cfg-35b .device/gguf-*.whl)
[ -d .device/fixtures ] && staged+=(.device/fixtures)
for b in .device/*-before; do [ -f "$b" ] && staged+=("$b"); done
tar -cf - "${staged[@]}" | xz -T2 -9e --lzma2=preset=9e,dict=64MiB > .devpack/device.tar.xz
du -sh .devpack/device.tar.xz
if [ "$what" = all ]; then
  echo 'run on the GPU machine (device tool, carry [".devpack"]): bash scripts/gpu-run.sh tests bench'
else
  echo 'run on the GPU machine (device tool, carry [".devpack"]): e.g. bash scripts/gpu-run.sh decode-ab (no `tests`: no fixtures staged)'
fi

