#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with the binaries scripts/gpu-check.sh
# staged in .device/: the GPU tests (cuda_ops, cuda_parity, speculative_cuda, scheduler_cuda),
# then `splash bench` on synthetic checkpoints of the real sizes (made there: they are too
# large to carry).
#   bash scripts/gpu-run.sh [tests|vision|ttft-image|kernels|sweep|gemv-ncu|demo|bench|decode|serving|profile|draft-profile|prefill|prefill-ab|decode-ab|timeline|peers|table|serve|ttft|ab|all]...   (results under $OUT, default ./gpu-out)
# Several parts run one after the other. The staged files come as .devpack/device.tar.xz
# (carried with the working tree) and are unpacked into .device/ first.
# `vision`: the vision tower's time at the real tower sizes, and transformers' beside it.
# `ttft-image`: `splash serve` on each model's synthetic GGUF with a synthetic full-size mmproj
# beside it: time to first token of a 1-Mpx and a 4-Mpx image and a 10-page PDF
# (bench/ttft_image.py); PEER_PREFILL=1 adds transformers' text prefill at those prompt sizes.
# `decode`: plain decoding speed with and without CUDA graphs.
# `peers`: PyTorch transformers in bf16 at the 27B / 35B-A3B geometries (bench/peers/).
# `profile`: Nsight Compute's GPU time and DRAM bytes per kernel for a short prefill and decode;
# one decode pass's kernels with the bandwidth each reached (bench/ncu_passes.py); PROFILE_AS_RUN=1
# keeps the GPU's clocks and caches as they are (Nsight Compute locks and flushes them otherwise).
# `prefill`: prefill speed at 8K and 32K tokens in the engine's passes (2,048 tokens) and at
# 8K in one pass (PREFILL_RUNS, tokens:passes pairs), then one 8K prefill with every launch
# timed (SPLASH_GPU_PROFILE=1).
# `prefill-ab`: the prefill runs (PREFILL_RUNS, default 8K in 2,048-token passes) under each of
# the settings in AB, one machine, no profile: e.g. AB="- SPLASH_PREFILL_EXPERTS=gemm" ("-": none).
# `decode-ab`: plain decode with the 1- and VERIFY_ROWS-row (16; a list: 4,8,16) pass costs at CONTEXT (1,024)
# tokens of context under each of the settings in AB, alternating, AB_ROUNDS rounds (2); a
# setting is "-" (none) or VAR=value pairs joined by commas, "before" or "before,VAR=value..."
# running .device/splash-before instead (default "- SPLASH_ATTENTION_HEADS=1";
# the launch chain of before 2026-12-06 is
# SPLASH_CAPTURE_POOL=0,SPLASH_DEPENDENT_LAUNCH=early).
# `timeline`: one pass of 1 and VERIFY_ROWS rows with every launch's wait timed on the GPU
# (SPLASH_TIMELINE; Gpu::timeline): each launch's start and the time it held the stream, as run
# (no Nsight Systems on the device machine), and those times summed by kernel.
# `draft-profile`: one draft block's launches, each synchronised and timed
# (SPLASH_GPU_PROFILE=1), for each DRAFT_WEIGHTS (the full output is kept under $OUT).
# `kernels`: the quantised GEMV kernels alone on the 27B / 35B-A3B matrix shapes (no checkpoint);
# `sweep`: the same at each warps-per-tile count (GEMV_SWEEP=1); `gemv-ncu`: Nsight
# Compute on single GEMV launches.
# `table`: issue 6's table for each model: decode with the 1- and 16-row pass costs at 1K, 2K,
# 8K and 32K of context, prefill at 2K, 8K and 32K (passes of 2,048), peak GPU memory, and beside them
# transformers in bf16 (prefill 2K, decode after it) on the same machine.
# `serve`: `splash serve --device cuda` on each model's synthetic GGUF (and the demo), one chat
# completion, one streamed Anthropic message and one tool call each through curl on loopback.
# `ttft`: a short request's time to first token sent 1 s after a 32K-token prompt, with
# .device/splash and, when staged, .device/splash-before (an earlier build to compare with).
# `ab`: prefill, plain decode (1- and 16-row passes) and drafted decode with .device/splash and
# .device/splash-before, alternating (AB_ROUNDS rounds, default 1).
# `serving`: the prefix cache's time to first token on a 32K agent prompt (uncached, memory,
# next turn, disk tier) and the aggregate decode speed of 1, 4 and 16 concurrent sequences.
set -uo pipefail
if [ $# -gt 1 ]; then
  for part in "$@"; do bash "$0" "$part"; done
  exit
fi
what=${1:-all}
if [ ! -d .device ] && [ -f .devpack/device.tar.xz ]; then
  xz -dc .devpack/device.tar.xz | tar -xf -
fi
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
# Test binaries look for fixtures at the path they were built in.
built_in=$(cat .device/built_in)
if [ "$built_in" != "$PWD" ] && [ ! -e "$built_in" ]; then
  mkdir -p "$(dirname "$built_in")" && ln -s "$PWD" "$built_in"
fi
# The generated fixtures the GPU tests read (the GGUFs), made by gpu-check.sh and staged as
# .device/fixtures/<set>-<hash>/: at target/fixtures/ the tests find them and run no Python.
if [ -d .device/fixtures ]; then
  mkdir -p target/fixtures && cp -r .device/fixtures/. target/fixtures/
fi
export SPLASH_KERNEL_CACHE=/tmp/splash-kernels
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

if [ "$what" = tests ] || [ "$what" = all ]; then
  # Q4_K_M checkpoints with rows wide enough for the tensor-core GEMV (the committed fixtures'
  # are 64 wide), dense and MoE: cuda_parity's batched-pass test takes them.
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl && export PYTHONPATH=/tmp/site
  synthetic=""
  for m in dense:"" moe:"--moe"; do
    f=/tmp/synth-0.5b-${m%%:*}-Q4_K_M.gguf
    if [ ! -f "$f" ]; then
      python3 bench/make_synthetic.py "/tmp/cfg-0.5b-${m%%:*}" --size 0.5b ${m#*:} --config-only >/dev/null &&
        cp tests/fixtures/qwen35-realvocab/tokenizer.json.gz "/tmp/cfg-0.5b-${m%%:*}/" &&
        python3 bench/make_synthetic_gguf.py "/tmp/cfg-0.5b-${m%%:*}" "$f" --type Q4_K_M --no-verify >/dev/null
    fi
    [ -f "$f" ] && synthetic="$synthetic:$f"
  done
  export SPLASH_SYNTHETIC_GGUF="${synthetic#:}"
  for t in ${TESTS:-cuda_ops cuda_parity speculative_cuda scheduler_cuda}; do
    echo "== $t"
    SPLASH_REQUIRE_GPU=1 timeout "${TEST_TIMEOUT:-400}" ".device/$t" --test-threads 1 --nocapture 2>&1 | tee "$out/$t.log" | grep -E '^test |test result|panicked|GPU vs CPU' | head -60
  done
fi

if [ "$what" = vision ]; then
  # The vision tower at Qwen3.5's size with the 27B's and the 35B-A3B's merger widths (beside a
  # tiny text model), then transformers' tower in bf16 on the same cases.
  for m in 27b:5120 35b:2048; do
    d=/tmp/vision-${m%%:*}
    [ -d "$d" ] || python3 bench/make_synthetic.py "$d" --size tiny --vision --vision-out "${m#*:}" > /dev/null
    echo "== splash vision tower, ${m%%:*}"
    ./.device/splash bench --model "$d" --device cuda --image 1024x1024,2048x2048,896x1152 \
      --prompt-tokens 16 --decode-tokens 4 --repeat 5 2>&1 | tee "$out/vision-${m%%:*}.txt" | grep vision
  done
  echo "== transformers vision tower"
  python3 bench/peers/transformers_vision.py --repeat 5 2>&1 | tee "$out/vision-transformers.txt"
fi

if [ "$what" = kernels ] || [ "$what" = all ]; then
  echo "== GEMV kernels"
  timeout 300 ./.device/gemv_cuda 2>&1 | tee "$out/gemv.txt"
fi

if [ "$what" = sweep ]; then
  echo "== GEMV kernels, each warps-per-tile count"
  GEMV_SWEEP=1 timeout 300 ./.device/gemv_cuda 2>&1 | tee "$out/gemv-sweep.txt"
fi

if [ "$what" = gemv-ncu ]; then
  # Nsight Compute's analysis of single tensor-core GEMV launches from `gemv_cuda` (the 27B
  # gate / up product at 1 token, then the Q6_K down product): throughput, occupancy, stalls.
  for k in gemv_tc8_q4_k gemv_tc8_q6_k; do
    echo "== ncu $k"
    /usr/local/cuda/bin/ncu -k "regex:^$k" --launch-skip 4 --launch-count 1 --kill yes \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section MemoryWorkloadAnalysis --section LaunchStats --section ComputeWorkloadAnalysis \
      ./.device/gemv_cuda > "$out/ncu-$k.txt" 2>&1
    grep -vE '^\s*$|^==PROF==' "$out/ncu-$k.txt" | tail -120
  done
fi

if [ "$what" = demo ] || [ "$what" = all ]; then
  # The trained demo and its draft: greedy answers with and without speculation.
  for q in "What is 47 + 38?" "Write a Python function that returns the squares of a list." \
    "Call the weather tool for Paris."; do
    for spec in off on; do
      echo "== demo, speculation $spec: $q"
      ./.device/splash generate --model models/demo --device cuda --chat --temperature 0 \
        --max-tokens 256 --speculative "$spec" --prompt "$q" 2>&1 | tail -4
    done
  done | tee "$out/demo.txt"
fi

if [ "$what" = peers ]; then
  # PyTorch transformers in bf16 at the same geometries (issue 6's side-by-side figures).
  for m in ${MODELS:-27b 35b}; do
    echo "== transformers $m"
    python3 bench/peers/transformers_bench.py ".device/cfg-$m" --prompt-tokens 1024 --decode-tokens 64 --repeat 3 2>&1 |
      tee "$out/peers-$m.txt" | tail -5
  done
fi

if [ "$what" = bench ] || [ "$what" = all ] || [ "$what" = profile ] || [ "$what" = serving ] || [ "$what" = decode ] ||
  [ "$what" = draft-profile ] || [ "$what" = prefill ] || [ "$what" = prefill-ab ] || [ "$what" = table ] || [ "$what" = serve ] || [ "$what" = ttft ] ||
  [ "$what" = ab ] || [ "$what" = ttft-image ] || [ "$what" = decode-ab ] || [ "$what" = timeline ]; then
  # The server on `$1` (a model), `$2` a name for its files: /ready, a chat completion, a
  # streamed Anthropic message and a tool call, each printed.
  serve_once() {
    local port=8199 log="$out/serve-$2.log"
    ./.device/splash serve --model "$1" --device cuda --port $port --served-model-name m > "$log" 2>&1 &
    local pid=$!
    for _ in $(seq 300); do curl -sf localhost:$port/ready > /dev/null && break; sleep 1; done
    grep -iE 'device|memory|listening' "$log" | head -8
    local chat='{"model":"m","messages":[{"role":"user","content":"What is 47 + 38?"}],"max_tokens":64,"temperature":0}'
    echo "-- POST /v1/chat/completions"
    curl -s -w '\nHTTP %{http_code} in %{time_total} s\n' localhost:$port/v1/chat/completions \
      -H 'content-type: application/json' -d "$chat" | tee "$out/serve-$2-chat.json"
    echo "-- POST /v1/messages (stream)"
    curl -sN localhost:$port/v1/messages -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' \
      -d '{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"Hello"}]}' |
      tee "$out/serve-$2-messages.txt" | grep -E '^event' | sort | uniq -c
    echo "-- POST /v1/chat/completions with a tool (tool_choice required)"
    curl -s localhost:$port/v1/chat/completions -H 'content-type: application/json' -d '{"model":"m","max_tokens":64,
      "messages":[{"role":"user","content":"Weather in Paris?"}],"tool_choice":"required","tools":[{"type":"function",
      "function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},
      "required":["city"]}}}]}' | tee "$out/serve-$2-tool.json"
    echo
    kill $pid
    wait $pid
  }
  [ "$what" = serve ] && { echo "== serve demo"; serve_once models/demo demo; }
  # GPU memory in use sampled every 200 ms into file $1 until memory_peak prints its peak.
  memory_watch() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 > "$1" &
    smi=$!
  }
  memory_peak() {
    kill $smi
    echo "peak GPU memory $(sort -n "$1" | tail -1) MiB"
  }
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/*.whl && export PYTHONPATH=/tmp/site
  # A random draft of the published shape (5 layers, block 16) for model $1: `dflash` (v1) or
  # `dflash2` ($2), made once; prints its directory.
  synthetic_draft() {
    local d=/tmp/synth-$1-$2 flag=""
    [ "$2" = dflash2 ] && flag=--dflash2
    [ -d "$d" ] || python3 bench/make_synthetic_draft.py ".device/cfg-$1" "$d" --layers 5 --block 16 $flag >&2
    echo "$d"
  }
  for m in ${MODELS:-27b 35b}; do
    f=/tmp/synth-$m-Q4_K_M.gguf
    if [ ! -f "$f" ]; then
      # Staged without the 5 MB tokenizer, which the repository already carries.
      cp --update=none tests/fixtures/qwen35-realvocab/tokenizer.json.gz ".device/cfg-$m/"
      start=$SECONDS
      python3 bench/make_synthetic_gguf.py ".device/cfg-$m" "$f" --type Q4_K_M --no-verify 2>&1 | tail -2
      echo "made $f in $((SECONDS - start)) s"
    fi
    if [ "$what" = decode ]; then
      # Plain decoding (no draft), the one-token pass replayed from a CUDA graph and launched
      # kernel by kernel.
      for graphs in 1 0; do
        echo "== decode $m, CUDA graphs $graphs"
        SPLASH_CUDA_GRAPHS=$graphs ./.device/splash bench --model "$f" --device cuda --prompt-tokens 1024 \
          --decode-tokens 128 --repeat 3 --speculative off 2>&1 | tee "$out/decode-$m-graphs$graphs.txt" | grep -E 'decode|pass cost'
      done
    elif [ "$what" = prefill ]; then
      # PREFILL_RUNS: tokens:passes pairs.
      for run in ${PREFILL_RUNS:-8192:2048 32768:2048 8192:8192}; do
        n=${run%%:*} chunk=${run#*:}
        echo "== prefill $m, $n tokens in passes of $chunk"
        ./.device/splash bench --model "$f" --device cuda --prompt-tokens "$n" --prefill-chunk "$chunk" --decode-tokens 8 \
          --repeat 2 --speculative off 2>&1 | tee "$out/prefill-$m-$n-$chunk.txt" | grep -E '^prefill'
      done
      echo "== prefill profile $m (8,192 tokens, every launch synchronised and timed)"
      SPLASH_GPU_PROFILE=1 ./.device/splash bench --model "$f" --device cuda --prompt-tokens 8192 --decode-tokens 1 \
        --repeat 1 --speculative off > "$out/prefill-profile-$m.txt" 2>&1
      grep -A30 -E '^(kernel|launch)' "$out/prefill-profile-$m.txt" | head -40
    elif [ "$what" = prefill-ab ]; then
      for setting in ${AB:--}; do
        [ "$setting" = - ] && setting=""
        for run in ${PREFILL_RUNS:-8192:2048}; do
          n=${run%%:*} chunk=${run#*:}
          echo "== prefill $m, $n tokens in passes of $chunk, ${setting:-default}"
          env $setting ./.device/splash bench --model "$f" --device cuda --prompt-tokens "$n" --prefill-chunk "$chunk" \
            --decode-tokens 8 --repeat 2 --speculative off 2>&1 |
            tee "$out/prefill-ab-$m-$n-$chunk-${setting//[^A-Za-z0-9]/_}.txt" | grep -E '^prefill'
        done
      done
    elif [ "$what" = decode-ab ]; then
      for round in $(seq "${AB_ROUNDS:-2}"); do
        for setting in ${AB:-- SPLASH_ATTENTION_HEADS=1}; do
          [ "$setting" = - ] && setting=""
          bin=splash
          case $setting in before*) bin=splash-before setting=${setting#before} setting=${setting#,} ;; esac
          echo "== decode $m, $bin, ${setting:-default}, round $round"
          env ${setting//,/ } ./.device/$bin bench --model "$f" --device cuda --prompt-tokens "${CONTEXT:-1024}" --decode-tokens 128 \
            --repeat 3 --speculative off --verify-rows "${VERIFY_ROWS:-16}" 2>&1 |
            tee "$out/decode-ab-$m-$bin-${setting//[^A-Za-z0-9]/_}-$round.txt" | grep -E '^(decode|pass)'
        done
      done
    elif [ "$what" = timeline ]; then
      # One pass of 1 and VERIFY_ROWS (4,16) rows at CONTEXT (1,024) with every launch's wait
      # recorded (SPLASH_TIMELINE): each launch's start and the time it held the stream, as run.
      echo "== timeline $m"
      SPLASH_TIMELINE=1 ./.device/splash bench --model "$f" --device cuda --prompt-tokens "${CONTEXT:-1024}" \
        --decode-tokens 16 --repeat 3 --speculative off --verify-rows "${VERIFY_ROWS:-4,16}" \
        > "$out/timeline-$m.txt" 2>&1
      grep -E '^(decode|pass|timeline)' "$out/timeline-$m.txt"
      awk '/^kernel +launches/ {on = 1} /^timeline|^ +#/ {on = 0} on' "$out/timeline-$m.txt" | head -40
    elif [ "$what" = ab ]; then
      # This build against .device/splash-before on the same machine, alternating (before,
      # after, AB_ROUNDS times, default 1) so that drift shows: prefill of 2,048 tokens, plain
      # decode with the 1- and 16-row pass costs, then decode with a DFlash draft.
      d=$(synthetic_draft "$m" dflash)
      for round in $(seq "${AB_ROUNDS:-1}"); do
        for bin in splash-before splash; do
          [ -x ".device/$bin" ] || continue
          echo "== ab $m, $bin, round $round"
          ./.device/$bin bench --model "$f" --device cuda --prompt-tokens 2048 --prefill-chunk 2048 \
            --decode-tokens 128 --repeat 3 --speculative off --verify-rows 16 2>&1 |
            tee "$out/ab-$m-$bin-$round.txt" | grep -E '^(prefill|decode|pass)'
          ./.device/$bin bench --model "$f" --device cuda --prompt-tokens 1024 --decode-tokens 64 --repeat 3 \
            --draft-model "$d" --speculative always 2>&1 |
            tee "$out/ab-$m-$bin-$round-draft.txt" | grep -E '^decode'
        done
      done
    elif [ "$what" = ttft ]; then
      for bin in splash splash-before; do
        [ -x ".device/$bin" ] || continue
        echo "== ttft $m, $bin"
        timeout 300 python3 bench/ttft_behind_prefill.py --bin ".device/$bin" --model "$f" --device cuda \
          --tokens 32000 --timeout 240 2>&1 | tee "$out/ttft-$m-$bin.txt" | tail -3
      done
    elif [ "$what" = ttft-image ]; then
      hidden=$(python3 -c "import json; print(json.load(open('.device/cfg-$m/config.json'))['hidden_size'])")
      p=/tmp/mmproj-$m-F16.gguf
      [ -f "$p" ] || python3 bench/make_synthetic.py "/tmp/mmproj-cfg-$m" --size tiny --vision --vision-out "$hidden" \
        --mmproj "$p" --config-only | grep '^wrote /'
      echo "== ttft-image $m"
      timeout 400 python3 bench/ttft_image.py --bin .device/splash --model "$f" --mmproj "$p" --device cuda \
        --repeat 3 2>&1 | tee "$out/ttft-image-$m.txt" | tail -5
      if [ -n "${PEER_PREFILL:-}" ]; then
        for n in $(grep -oE '^[^:]+: [0-9]+ prompt tokens' "$out/ttft-image-$m.txt" | awk '{print $(NF-2)}' | sort -un); do
          echo "== transformers bf16 $m, prefill $n"
          timeout 300 python3 bench/peers/transformers_bench.py ".device/cfg-$m" --prompt-tokens "$n" --decode-tokens 1 \
            --repeat 3 2>&1 | tee "$out/ttft-image-$m-transformers-$n.txt" | grep -E '^prefill'
        done
      fi
    elif [ "$what" = serve ]; then
      echo "== serve $m"
      serve_once "$f" "$m"
    elif [ "$what" = table ]; then
      echo "== table $m: transformers bf16, prefill 2,048 tokens, decode 64 after it"
      python3 bench/peers/transformers_bench.py ".device/cfg-$m" --prompt-tokens 2048 --decode-tokens 64 --repeat 3 2>&1 |
        tee "$out/table-$m-transformers.txt" | grep -E '^(prefill|decode|peak)'
      for run in 1024:1024:128:3 2048:2048:8:3 8192:2048:8:2 32768:2048:64:2; do
        IFS=: read -r n chunk dec rep <<<"$run"
        echo "== table $m: splash, prompt $n in passes of $chunk, decode $dec, 1- and 16-row passes"
        memory_watch "$out/table-$m-$n-mem.txt"
        ./.device/splash bench --model "$f" --device cuda --prompt-tokens "$n" --prefill-chunk "$chunk" \
          --decode-tokens "$dec" --repeat "$rep" --speculative off --verify-rows 16 2>&1 |
          tee "$out/table-$m-$n.txt" | grep -E '^(prefill|decode|pass)'
        memory_peak "$out/table-$m-$n-mem.txt"
      done
    elif [ "$what" = serving ]; then
      echo "== serving $m"
      ./.device/splash bench --model "$f" --device cuda --prompt-tokens 1024 --decode-tokens 64 --repeat 3 \
        --speculative off --replay-tokens "${REPLAY:-32K}" --concurrency 1,4,16 2>&1 | tee "$out/serving-$m.txt" | tail -12
    elif [ "$what" = draft-profile ]; then
      for kind in ${DRAFTS:-dflash2}; do
        d=$(synthetic_draft "$m" "$kind")
        for dw in ${DRAFT_WEIGHTS:-auto}; do
          echo "== draft profile $m, $kind draft, weights $dw"
          SPLASH_GPU_PROFILE=1 ./.device/splash bench --model "$f" --device cuda --prompt-tokens 256 --decode-tokens 2 \
            --repeat 1 --draft-model "$d" --draft-weights "$dw" --speculative always > "$out/draft-profile-$m-$kind-$dw.txt" 2>&1
          # The draft block's table comes before the whole run's.
          grep -A40 'one draft block' "$out/draft-profile-$m-$kind-$dw.txt" | head -60
        done
      done
    elif [ "$what" = profile ]; then
      # GPU time and DRAM bytes per kernel from Nsight Compute, graphs replayed as in decoding
      # (each graph node is profiled as a kernel): prefill of PROFILE_CONTEXT tokens (16), then 8
      # decode steps; the last but one decode pass kernel by kernel, with the bandwidth each
      # reached. PROFILE_KERNELS (a regex, e.g. 'attention_part|attention_combine') profiles
      # those kernels only, caches as they are (ncu flushes them around each kernel otherwise,
      # and the heads of a group share their keys through L2), and lists the last 64 launches.
      echo "== profile $m (ncu: GPU time and DRAM bytes per kernel, no launch gaps)"
      only=()
      [ -n "${PROFILE_KERNELS:-}" ] && only=(-k "regex:$PROFILE_KERNELS" --cache-control none)
      # PROFILE_AS_RUN=1: the GPU's own clocks and warm caches (each kernel as the pass runs it).
      [ -n "${PROFILE_AS_RUN:-}" ] && only+=(--clock-control none --cache-control none)
      # PROFILE_LAUNCHES=N: the first N launches only (the prefill's and a few decode passes').
      [ -n "${PROFILE_LAUNCHES:-}" ] && only+=(-c "$PROFILE_LAUNCHES")
      # PROFILE_VERIFY_ROWS=N: then the pass costs of one token and of N rows (three passes
      # each after two warm-up ones, each after a prefill), whose last launches PROFILE_SKIP=K
      # (ncu -s: the first K launches run unprofiled) leaves to the profile.
      [ -n "${PROFILE_SKIP:-}" ] && only+=(-s "$PROFILE_SKIP")
      rows=()
      [ -n "${PROFILE_VERIFY_ROWS:-}" ] && rows=(--verify-rows "$PROFILE_VERIFY_ROWS")
      # PROFILE_BIN=splash-before: profile the earlier build staged beside this one.
      p=$out/profile-$m${PROFILE_BIN:+-$PROFILE_BIN}
      /usr/local/cuda/bin/ncu "${only[@]}" --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --csv --log-file "$p.csv" "./.device/${PROFILE_BIN:-splash}" bench --model "$f" --device cuda \
        --prompt-tokens "${PROFILE_CONTEXT:-16}" --decode-tokens 8 --repeat 1 --speculative off "${rows[@]}" \
        > "$p.txt" 2>&1
      if [ -n "${PROFILE_KERNELS:-}" ]; then
        python3 bench/ncu_passes.py "$p.csv" --tail 64 | tee "$p-pass.txt" | tail -80
      else
        python3 bench/ncu_passes.py "$p.csv" -2 | tee "$p-pass.txt" | tail -60
      fi
    else
      # Random drafts of the published shapes, 5 layers, block 16: DFlash (v1), and DFlash2
      # (dynamic convolutions on the GPU, its selector on the host). DRAFTS picks; CONTEXT sets
      # the prompt (1,024 tokens).
      for kind in ${DRAFTS:-dflash dflash2}; do
        d=$(synthetic_draft "$m" "$kind")
        # DRAFT_WEIGHTS: the draft's matrices as held (`--draft-weights`), one run each.
        for dw in ${DRAFT_WEIGHTS:-auto}; do
          echo "== bench $m, $kind draft, weights $dw"
          memory_watch "$out/mem-$m-$kind-$dw.txt"
          ./.device/splash bench --model "$f" --device cuda --prompt-tokens "${CONTEXT:-1024}" --decode-tokens 64 --repeat 3 \
            --verify-rows 16 --draft-model "$d" --draft-weights "$dw" --speculative always 2>&1 |
            tee "$out/bench-$m-$kind-$dw-${CONTEXT:-1024}.txt" | tail -16
          memory_peak "$out/mem-$m-$kind-$dw.txt"
        done
      done
    fi
  done
fi
