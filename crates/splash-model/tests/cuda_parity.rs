//! The CUDA forward pass reproduces the CPU forward pass on the fixtures (dense, MoE, MLX
//! 4-bit, and the GGUFs generated from them), for prefill and token-by-token decode and every KV format. Needs a
//! GPU: skipped without one unless `SPLASH_REQUIRE_GPU` is set.
#![cfg(feature = "cuda")]

use splash_backend::cuda::{Gpu, GpuOptions, TiledGemv};

mod common;
use common::{argmax, dir, fixture, gguf, max_rel, ragged_batches, FOR_THE_GPU};
use splash_model::{load, BatchItem, DFlashDraft, DraftBlock, ImageSpan, KvFormat, Logits, Model};

/// The same checkpoint twice: on the CPU and on GPU 0 (None without a GPU).
fn pair(name: &str) -> Option<(Model, Model)> {
    pair_on_gpu(name).map(|(cpu, gpu, _)| (cpu, gpu))
}

/// [`pair`], and the GPU.
fn pair_on_gpu(name: &str) -> Option<(Model, Model, std::sync::Arc<Gpu>)> {
    // The SPLASH_* variables choose kernel variants here as for `splash` (SPLASH_FOLD_LAUNCHES...).
    let options = GpuOptions::from_env().expect("the SPLASH_* variables");
    let gpu = match Gpu::with_options(0, options) {
        Ok(g) => g,
        Err(e) => {
            assert!(
                std::env::var_os("SPLASH_REQUIRE_GPU").is_none(),
                "SPLASH_REQUIRE_GPU is set but no GPU is usable: {e}"
            );
            eprintln!("skipped: {e}");
            return None;
        }
    };
    // f32 arithmetic: these tiny random models amplify int8/bf16 activation rounding beyond
    // any useful tolerance (those paths are checked op by op in splash-backend's cuda_ops).
    gpu.set_exact(true);
    let cpu = load(&checkpoint(name)).unwrap();
    let mut on_gpu = load(&checkpoint(name)).unwrap();
    on_gpu.graph.to_gpu(gpu.clone()).unwrap();
    assert!(on_gpu.graph.device().starts_with("cuda"));
    Some((cpu, on_gpu, gpu))
}

/// A checkpoint by name: a generated GGUF fixture (`qwen35-dense-gguf/model-Q4_mix.gguf`), else
/// a committed one under `tests/fixtures/` (an absolute path as it is).
fn checkpoint(name: &str) -> std::path::PathBuf {
    if name.contains("-gguf/") {
        gguf(name)
    } else {
        fixture(name)
    }
}

/// Not a GPU test: `scripts/gpu-check.sh` runs it (`--ignored`) where the tests are built, to
/// make the generated fixtures the GPU tests read (the GPU machine has no Python packages) and
/// print their directories, which it stages for the GPU machine (see `FOR_THE_GPU`).
#[test]
#[ignore]
fn derived_fixtures_for_the_gpu_machine() {
    for set in FOR_THE_GPU {
        println!("derived fixtures: {}", dir(set).display());
    }
}

const CHECKPOINTS: [&str; 6] = [
    "qwen35-dense",
    "qwen35-moe",
    "qwen35-dense-mlx4",
    "qwen35-moe-mlx4",
    "qwen35-dense-gguf/model-Q4_mix.gguf",
    "qwen35-moe-gguf/model-Q8_0.gguf",
];

#[test]
fn prefill_logits_match_the_cpu() {
    for name in CHECKPOINTS {
        let Some((cpu, gpu)) = pair(name) else { return };
        let text = std::fs::read_to_string(fixture("qwen35-dense/ppl.txt")).unwrap();
        let ids = cpu.tokenizer.encode(&text).unwrap();
        for kv in [KvFormat::F32, KvFormat::Bf16, KvFormat::Int8] {
            let lc = cpu
                .graph
                .forward(&mut cpu.graph.new_state_with(kv), &ids, Logits::All)
                .unwrap();
            let lg = gpu
                .graph
                .forward(&mut gpu.graph.new_state_with(kv), &ids, Logits::All)
                .unwrap();
            let err = max_rel(&lg, &lc);
            let v = cpu.config.vocab_size;
            let agree = lg
                .chunks_exact(v)
                .zip(lc.chunks_exact(v))
                .filter(|(a, b)| argmax(a) == argmax(b))
                .count();
            println!(
                "{name} {kv:?}: GPU vs CPU logits {err:.2e}, top-1 agreement {agree}/{}",
                ids.len()
            );
            assert!(
                err < 1e-3,
                "{name} {kv:?}: GPU logits differ from the CPU by {err}"
            );
        }
    }
}

/// Image prompts (`qwen35-vl-tied`'s interleaved case, with the tower rows transformers made):
/// a prefill in chunks cut inside both images and the decode after them (rows whose rotary
/// position is not their cache row, so no graphs) match the CPU, and the greedy tokens are
/// transformers'.
#[test]
fn image_prompts_match_the_cpu() {
    let Some((cpu, gpu)) = pair("qwen35-vl-tied") else {
        return;
    };
    let bytes = std::fs::read(fixture("qwen35-vl-tied/reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let raw = |name: &str| st.tensor(name).unwrap().data().to_vec();
    let ids: Vec<u32> = raw("interleaved.ids")
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let want: Vec<u32> = raw("interleaved.greedy")
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let merged: Vec<f32> = raw("interleaved.merged")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let h = cpu.config.hidden_size;
    let mut spans = Vec::new();
    let (mut from, mut row) = (0, 0);
    for grid in [(2, 4), (3, 2)] {
        let start = from + ids[from..].iter().position(|&t| t == 514).unwrap();
        let n = grid.0 * grid.1;
        spans.push(ImageSpan {
            start,
            grid,
            embeddings: merged[row * h..(row + n) * h].into(),
        });
        (from, row) = (start + n, row + n);
    }
    let cuts = [spans[0].start + 3, spans[1].start + 2, ids.len()];
    let run = |m: &Model| {
        let mut state = m.graph.new_state_with(KvFormat::F32);
        let (mut logits, mut at) = (Vec::new(), 0);
        for cut in cuts {
            let mut item = [BatchItem {
                state: &mut state,
                tokens: &ids[at..cut],
                images: &spans,
            }];
            logits.extend(
                m.graph
                    .forward_batch(&mut item, Logits::All, &[])
                    .unwrap()
                    .remove(0)
                    .logits,
            );
            at = cut;
        }
        let v = m.config.vocab_size;
        let mut tokens = vec![argmax(&logits[logits.len() - v..]) as u32];
        let mut rows = Vec::new();
        while tokens.len() < want.len() {
            let row = m
                .graph
                .forward(&mut state, &tokens[tokens.len() - 1..], Logits::Last)
                .unwrap();
            tokens.push(argmax(&row) as u32);
            rows.extend(row);
        }
        (logits, rows, tokens, state)
    };
    let (lc, dc, tc, sc) = run(&cpu);
    let (lg, dg, tg, mut sg) = run(&gpu);
    println!(
        "image prompt: prefill {:.2e}, decode {:.2e}",
        max_rel(&lg, &lc),
        max_rel(&dg, &dc)
    );
    assert!(max_rel(&lg, &lc) < 1e-4, "prefill: {}", max_rel(&lg, &lc));
    assert!(max_rel(&dg, &dc) < 1e-4, "decode: {}", max_rel(&dg, &dc));
    assert_eq!((sg.rotary_shift(), sc.rotary_shift()), (-7, -7));
    assert_eq!(tc, want, "CPU greedy tokens");
    assert_eq!(tg, want, "GPU greedy tokens");
    // Batched with a text-only sequence: each row turns by its own positions.
    let text = [5u32, 17, 42, 99, 7];
    let mut other = gpu.graph.new_state_with(KvFormat::F32);
    let (mut sg2, mut other2) = (sg.try_clone().unwrap(), other.try_clone().unwrap());
    let alone = [
        gpu.graph.forward(&mut sg2, &[3], Logits::All).unwrap(),
        gpu.graph.forward(&mut other2, &text, Logits::All).unwrap(),
    ];
    let mut items = [
        BatchItem::text(&mut sg, &[3]),
        BatchItem::text(&mut other, &text),
    ];
    let batched = gpu
        .graph
        .forward_batch(&mut items, Logits::All, &[])
        .unwrap();
    for (b, a) in batched.iter().zip(&alone) {
        assert!(
            max_rel(&b.logits, a) < 1e-5,
            "batched: {}",
            max_rel(&b.logits, a)
        );
    }
}

#[test]
fn greedy_decode_matches_the_cpu() {
    for name in CHECKPOINTS {
        let Some((cpu, gpu)) = pair(name) else { return };
        let prompt = cpu
            .tokenizer
            .encode("The quick brown fox jumps over the lazy dog.")
            .unwrap();
        let (mut sc, mut sg) = (cpu.graph.new_state(), gpu.graph.new_state());
        let mut lc = cpu.graph.forward(&mut sc, &prompt, Logits::Last).unwrap();
        let mut lg = gpu.graph.forward(&mut sg, &prompt, Logits::Last).unwrap();
        for step in 0..40 {
            let err = max_rel(&lg, &lc);
            assert!(err < 1e-3, "{name} step {step}: {err}");
            let mut sorted = lc.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let (tc, tg) = (argmax(&lc), argmax(&lg));
            // A near-tie may flip on summation order; anything else must agree.
            if sorted[0] - sorted[1] > 1e-3 {
                assert_eq!(tg, tc, "{name} step {step}: GPU picked another token");
            }
            lc = cpu
                .graph
                .forward(&mut sc, &[tc as u32], Logits::Last)
                .unwrap();
            lg = gpu
                .graph
                .forward(&mut sg, &[tc as u32], Logits::Last)
                .unwrap();
        }
        // The state reports device memory.
        assert!(sg.memory_bytes() > 0);
    }
}

#[test]
fn long_sequences_grow_the_device_cache() {
    let Some((cpu, gpu)) = pair("qwen35-dense") else {
        return;
    };
    // Past the initial 1024-position capacity of the device KV cache, in chunks.
    let ids: Vec<u32> = (0..1500u32).map(|i| (i * 37 + 11) % 500).collect();
    let (mut sc, mut sg) = (
        cpu.graph.new_state_with(KvFormat::Int8),
        gpu.graph.new_state_with(KvFormat::Int8),
    );
    let mut last = (Vec::new(), Vec::new());
    for chunk in ids.chunks(300) {
        last.0 = cpu.graph.forward(&mut sc, chunk, Logits::Last).unwrap();
        last.1 = gpu.graph.forward(&mut sg, chunk, Logits::Last).unwrap();
    }
    let err = max_rel(&last.1, &last.0);
    assert!(err < 1e-3, "after 1500 tokens: {err}");
}

/// A fixture target and its DFlash v1 and DFlash2 drafts, or the demo model and its trained
/// draft.
const DRAFTED: [(&str, &str); 5] = [
    ("qwen35-dense", "dflash/dense-dflash"),
    ("qwen35-moe", "dflash/moe-dflash"),
    ("qwen35-dense", "dflash/dense-dflash2"),
    ("qwen35-moe", "dflash/moe-dflash2"),
    ("../../models/demo", "../../models/demo/draft"),
];

/// The target's taps and the draft's block logits on the GPU match the CPU's, the context
/// appended in uneven pieces (the sliding windows mask by position on the device); drafts
/// with 256-wide rows (the demo's) also quantised to Q4_K on load on both sides.
#[test]
fn draft_and_taps_match_the_cpu() {
    for ((target, draft_dir), quantize) in DRAFTED.iter().flat_map(|&d| [(d, false), (d, true)]) {
        let Some((cpu, gpu, device)) = pair_on_gpu(target) else {
            return;
        };
        let mut cpu_draft = DFlashDraft::load(&fixture(draft_dir)).unwrap();
        let mut gpu_draft = DFlashDraft::load(&fixture(draft_dir)).unwrap();
        if quantize && cpu_draft.quantize_weights() == 0 {
            continue;
        }
        if quantize {
            gpu_draft.quantize_weights();
        }
        gpu_draft.to_gpu(&gpu.graph).unwrap();
        assert_eq!(gpu_draft.device(), "cuda");
        let taps = cpu_draft.config().target_layer_ids.clone();
        let prompt: Vec<u32> = (0..45u32).map(|i| (i * 37 + 5) % 400).collect();
        let fc = cpu
            .graph
            .forward_with_taps(&mut cpu.graph.new_state(), &prompt, Logits::None, &taps)
            .unwrap()
            .features;
        let fg = gpu
            .graph
            .forward_with_taps(&mut gpu.graph.new_state(), &prompt, Logits::None, &taps)
            .unwrap()
            .features;
        let err = max_rel(&fg, &fc);
        println!("{target}: GPU vs CPU taps {err:.2e}");
        assert!(err < 1e-4, "{target}: taps differ by {err}");
        let (mut cc, mut gc) = (cpu_draft.new_context(), gpu_draft.new_context());
        cpu_draft.append_context(&mut cc, &fc).unwrap();
        let width = fc.len() / prompt.len();
        for piece in [
            &fg[..17 * width],
            &fg[17 * width..18 * width],
            &fg[18 * width..],
        ] {
            gpu_draft.append_context(&mut gc, piece).unwrap();
        }
        assert_eq!(gc.len(), cc.len());
        let block = cpu_draft.config().block_size;
        let want = cpu_draft
            .draft_block(&mut cc, &cpu.graph, 7, block)
            .unwrap();
        let got = gpu_draft
            .draft_block(&mut gc, &gpu.graph, 7, block)
            .unwrap();
        // A DFlash2 draft's scores are its selector's candidates, picked on the device.
        let values = |b: &DraftBlock| b.candidates.iter().map(|c| c.1).collect::<Vec<_>>();
        let (eh, el, ec) = (
            max_rel(&got.hidden, &want.hidden),
            max_rel(&got.logits, &want.logits),
            max_rel(&values(&got), &values(&want)),
        );
        println!(
            "{draft_dir} (Q4_K: {quantize}): GPU vs CPU draft hidden {eh:.2e}, logits {el:.2e} ({}), candidates {ec:.2e} ({})",
            got.logits.len(),
            got.candidates.len()
        );
        assert!(
            eh < 1e-4 && el < 1e-4 && ec < 1e-4,
            "{draft_dir}: draft differs ({eh}, {el}, {ec})"
        );
        assert_eq!(got.logits.is_empty(), want.logits.is_empty());
        assert_eq!(got.candidates.len(), want.candidates.len());
        let v = cpu.config.vocab_size;
        let top = |l: &[f32]| l.chunks_exact(v).map(argmax).collect::<Vec<_>>();
        assert_eq!(top(&got.logits), top(&want.logits));
        let ids = |b: &DraftBlock| b.candidates.iter().map(|c| c.0).collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want));
        // Drafting leaves the context as it was: a second block is the same, and a third (the
        // second is captured as a graph, the third replays it; the first ran kernel by kernel).
        let before = device.replays();
        for _ in 0..2 {
            let again = gpu_draft
                .draft_block(&mut gc, &gpu.graph, 7, block)
                .unwrap();
            assert_eq!(again.hidden, got.hidden);
            assert_eq!(again.logits, got.logits);
            assert_eq!(again.candidates, got.candidates);
        }
        assert_eq!(
            device.replays() - before,
            2,
            "{draft_dir}: draft graph replays"
        );
    }
}

/// A verify pass rolled back to `keep` rows on the GPU leaves the state a plain pass over
/// those rows gives: the next token's logits agree.
#[test]
fn rollback_matches_a_plain_pass_on_the_gpu() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let Some((_, gpu)) = pair(name) else { return };
        let g = &gpu.graph;
        let prompt: Vec<u32> = (0..70).map(|i| (i * 37 % 500) as u32).collect();
        let block: Vec<u32> = vec![11, 22, 33, 44, 55, 66, 77];
        for keep in [0, 1, 3, 7] {
            let mut spec = g.new_state();
            g.forward(&mut spec, &prompt, Logits::None).unwrap();
            spec.checkpoint();
            g.forward(&mut spec, &block, Logits::All).unwrap();
            spec.rollback(keep).unwrap();
            assert_eq!(spec.len(), prompt.len() + keep);
            let mut plain = g.new_state();
            g.forward(&mut plain, &prompt, Logits::None).unwrap();
            g.forward(&mut plain, &block[..keep], Logits::None).unwrap();
            let a = g.forward(&mut spec, &[99], Logits::Last).unwrap();
            let b = g.forward(&mut plain, &[99], Logits::Last).unwrap();
            let err = max_rel(&a, &b);
            println!("{name} keep {keep}: rolled back vs plain {err:.2e}");
            assert!(err < 1e-5, "{name} keep {keep}: {err}");
        }
    }
}

/// Several sequences in one GPU pass (ragged: one token, a few, none; three blocks of 9 = 27
/// rows, past the size where a lone product goes to cuBLAS) give each, bit for bit, what a
/// pass of its own gives, in f32 and with the integer GEMV kernels; a recorded item rolls
/// back as alone. `SPLASH_SYNTHETIC_GGUF` (paths separated by `:`, made by
/// `scripts/gpu-run.sh tests`) adds Q4_K_M checkpoints whose rows the committed fixtures are too
/// narrow for: the tensor-core GEMV and the device-side MoE routing.
/// Checkpoints with the arithmetic to run them in (exact f32, or the fast kernels): the
/// fixtures, and the Q4_K_M checkpoints named by `SPLASH_SYNTHETIC_GGUF` (colon-separated;
/// `scripts/gpu-run.sh tests` makes 0.5B dense and MoE ones, wide enough for the tensor-core
/// GEMV and device MoE routing).
fn exact_and_fast_cases() -> Vec<(String, bool)> {
    let synthetic = std::env::var("SPLASH_SYNTHETIC_GGUF").unwrap_or_default();
    [
        ("qwen35-dense", true),
        ("qwen35-moe", true),
        ("qwen35-dense-gguf/model-Q4_mix.gguf", false),
        ("qwen35-moe-gguf/model-Q8_0.gguf", false),
    ]
    .into_iter()
    .chain(
        synthetic
            .split(':')
            .filter(|p| !p.is_empty())
            .map(|p| (p, false)),
    )
    .map(|(p, exact)| (p.to_string(), exact))
    .collect()
}

#[test]
fn a_batched_gpu_pass_matches_separate_passes() {
    use splash_model::BatchItem;
    for (name, exact) in exact_and_fast_cases() {
        let name = name.as_str();
        let Some((_, gpu)) = pair(name) else { return };
        gpu.graph.gpu().unwrap().set_exact(exact);
        let g = &gpu.graph;
        let (prompts, steps) = ragged_batches();
        let (mut alone, mut together): (Vec<_>, Vec<_>) = (Vec::new(), Vec::new());
        for p in &prompts {
            for states in [&mut alone, &mut together] {
                let mut s = g.new_state_with(KvFormat::Int8);
                g.forward(&mut s, p, Logits::None).unwrap();
                states.push(s);
            }
        }
        for (step, next) in steps.into_iter().enumerate() {
            // The second sequence verifies a block: recorded, then rolled back to 2 rows.
            for s in [&mut alone[1], &mut together[1]] {
                s.checkpoint();
            }
            let want: Vec<Vec<f32>> = alone
                .iter_mut()
                .zip(&next)
                .map(|(s, t)| g.forward(s, t, Logits::All).unwrap())
                .collect();
            let mut items: Vec<BatchItem> = together
                .iter_mut()
                .zip(&next)
                .map(|(state, tokens)| BatchItem::text(state, tokens))
                .collect();
            // Every other step asks only each row's argmax (picked on the device).
            let v = gpu.config.vocab_size;
            let want_argmax = step % 2 == 1;
            let scores = if want_argmax {
                Logits::Argmax
            } else {
                Logits::All
            };
            let got = g.forward_batch(&mut items, scores, &[]).unwrap();
            for (i, (out, w)) in got.iter().zip(&want).enumerate() {
                if want_argmax {
                    let rows: Vec<u32> = w.chunks_exact(v).map(|r| argmax(r) as u32).collect();
                    assert_eq!(out.argmax, rows, "{name} step {step} item {i}: argmax");
                    continue;
                }
                let l = &out.logits;
                assert!(
                    l == w,
                    "{name} step {step} item {i}: batched differs by {:e}",
                    max_rel(l, w)
                );
            }
            let keep = next[1].len().min(2);
            alone[1].rollback(keep).unwrap();
            together[1].rollback(keep).unwrap();
        }
        let a = g.forward(&mut alone[1], &[99], Logits::Last).unwrap();
        let b = g.forward(&mut together[1], &[99], Logits::Last).unwrap();
        assert!(a == b, "{name}: rolled back after batched passes");
        println!("{name}: batched GPU passes bit-exact (exact arithmetic: {exact})");
    }
}

/// The shared expert routed as one more pair of the grouped expert products
/// (`GpuOptions::shared_expert_grouped`) gives the bits of running it on its own when both run
/// on the f16 tensor cores (a pair's product has the bits of its token's GEMV alone, and the
/// weighted sum starts from the gated shared output either way), in fewer launches: the fast
/// MoE checkpoints, a short prompt and three decode steps, each setting on its own GPU context.
#[test]
fn the_shared_expert_grouped_with_the_routed_ones_gives_its_bits() {
    for (name, exact) in exact_and_fast_cases() {
        if exact || !name.contains("moe") {
            continue;
        }
        let run = |grouped: bool| -> Option<(Vec<f32>, u64)> {
            let mut options = GpuOptions::from_env().expect("the SPLASH_* variables");
            options.shared_expert_grouped = grouped;
            options.tiled_gemv = TiledGemv::TensorCores;
            options.profile = true;
            let gpu = Gpu::with_options(0, options).ok()?;
            let mut model = load(&checkpoint(&name)).unwrap();
            model.graph.to_gpu(gpu).unwrap();
            let g = &model.graph;
            let mut s = g.new_state_with(KvFormat::Int8);
            let prompt: Vec<u32> = (0..12).map(|i| 7 + 31 * i).collect();
            let mut all = g.forward(&mut s, &prompt, Logits::All).unwrap();
            for t in [5, 17, 99] {
                all.extend(g.forward(&mut s, &[t], Logits::All).unwrap());
            }
            let launches = g
                .gpu_profile()
                .unwrap_or_default()
                .iter()
                .map(|r| r.1)
                .sum();
            Some((all, launches))
        };
        let (Some(apart), Some(grouped)) = (run(false), run(true)) else {
            assert!(std::env::var_os("SPLASH_REQUIRE_GPU").is_none(), "no GPU");
            return;
        };
        println!(
            "{name}: shared expert grouped vs apart: {} vs {} launches, logits within {:.2e}",
            grouped.1,
            apart.1,
            max_rel(&grouped.0, &apart.0)
        );
        assert!(
            grouped.0 == apart.0,
            "{name}: the grouped shared expert differs by {:e}",
            max_rel(&grouped.0, &apart.0)
        );
        if name.contains("Q4_K_M") {
            assert!(
                grouped.1 < apart.1,
                "{name}: the shared expert was not grouped ({} launches, {} apart)",
                grouped.1,
                apart.1
            );
        }
    }
}

/// Passes replayed from captured CUDA graphs give the bits of the same passes launched kernel
/// by kernel: two sequences decoding in turn (a graph each), then together in batched passes,
/// past the device cache's first growth at 1,024 positions (which moves the caches: captured
/// again), then 16-token verify blocks with taps, each rolled back to a few tokens.
#[test]
fn graphs_replay_decode_and_verify_passes() {
    use splash_model::BatchItem;
    for (name, exact) in exact_and_fast_cases() {
        let Some((_, model)) = pair(&name) else {
            return;
        };
        let gpu = model.graph.gpu().unwrap().clone();
        gpu.set_exact(exact);
        let g = &model.graph;
        let prompts: Vec<Vec<u32>> = (0..2u32)
            .map(|s| (0..1000u32).map(|i| (i * 37 + 11 + s) % 500).collect())
            .collect();
        let run = |graphs: bool| -> Vec<Vec<f32>> {
            gpu.set_graphs(graphs);
            let (mut states, mut next): (Vec<_>, Vec<u32>) = prompts
                .iter()
                .map(|p| {
                    let mut s = g.new_state_with(KvFormat::Int8);
                    let l = g.forward(&mut s, p, Logits::Last).unwrap();
                    (s, argmax(&l) as u32)
                })
                .unzip();
            let mut out = Vec::new();
            for step in 0..40 {
                let logits: Vec<Vec<f32>> = if step < 20 {
                    states
                        .iter_mut()
                        .zip(&next)
                        .map(|(s, &t)| g.forward(s, &[t], Logits::Last).unwrap())
                        .collect()
                } else {
                    let tokens: Vec<[u32; 1]> = next.iter().map(|&t| [t]).collect();
                    let mut items: Vec<BatchItem> = states
                        .iter_mut()
                        .zip(&tokens)
                        .map(|(state, tokens)| BatchItem::text(state, tokens))
                        .collect();
                    let got = g.forward_batch(&mut items, Logits::Last, &[]).unwrap();
                    got.into_iter().map(|o| o.logits).collect()
                };
                next = logits.iter().map(|l| argmax(l) as u32).collect();
                out.extend(logits);
            }
            for step in 0..6u32 {
                let s = &mut states[0];
                s.checkpoint();
                let block: Vec<u32> = (0..16).map(|i| (next[0] + 7 * i + step) % 500).collect();
                let mut items = [BatchItem::text(s, &block)];
                // Odd blocks ask only each row's argmax (as greedy verification does).
                let scores = if step % 2 == 1 {
                    Logits::Argmax
                } else {
                    Logits::All
                };
                let got = g
                    .forward_batch(&mut items, scores, &[0, 1])
                    .unwrap()
                    .remove(0);
                s.rollback(3).unwrap();
                let ids = got.argmax.iter().map(|&i| i as f32).collect();
                out.extend([got.logits, ids, got.features]);
            }
            out
        };
        let plain = run(false);
        let before = gpu.replays();
        let graphed = run(true);
        let replays = gpu.replays() - before;
        for (i, (a, b)) in graphed.iter().zip(&plain).enumerate() {
            assert!(
                a == b,
                "{name} output {i}: the graph's numbers differ by {:e}",
                max_rel(a, b)
            );
        }
        println!("{name}: {replays} of 66 passes replayed from graphs, bit-exact (exact arithmetic: {exact})");
        // A pass is captured the second time it comes. MoE layers route on the device only
        // for tensor-core expert formats outside the exact mode; routed on the host, a pass
        // cannot be captured.
        let device_routed = !name.contains("moe") || (!exact && name.contains("Q4_K"));
        if device_routed {
            assert!(replays >= 55, "{name}: {replays} replays");
        } else {
            assert_eq!(replays, 0, "{name}");
        }
    }
}

/// GPU states copy (trimmed), save and load: a copy or a loaded image continues like the
/// original, and images move between the CPU and the GPU.
#[test]
fn gpu_states_copy_save_and_load() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let Some((cpu, gpu)) = pair(name) else { return };
        let (c, g) = (&cpu.graph, &gpu.graph);
        let prompt: Vec<u32> = (0..1100).map(|i| (i * 37 % 400) as u32).collect();
        let next = [3u32, 1, 4, 1, 5];
        let mut original = g.new_state_with(KvFormat::Int8);
        g.forward(&mut original, &prompt, Logits::None).unwrap();
        let mut copy = original.try_clone().unwrap();
        assert!(
            copy.memory_bytes() < original.memory_bytes(),
            "the copy is trimmed"
        );
        let image = original.save_image().unwrap();
        let mut loaded = g.load_state(&image).unwrap();
        let mut on_cpu = c.load_state(&image).unwrap();
        let want = g.forward(&mut original, &next, Logits::All).unwrap();
        assert!(
            g.forward(&mut copy, &next, Logits::All).unwrap() == want,
            "{name}: copy"
        );
        assert!(
            g.forward(&mut loaded, &next, Logits::All).unwrap() == want,
            "{name}: loaded"
        );
        let cpu_logits = c.forward(&mut on_cpu, &next, Logits::All).unwrap();
        let err = max_rel(&cpu_logits, &want);
        println!("{name}: GPU image continued on the CPU: {err:.2e}");
        assert!(err < 1e-3, "{name}: {err}");
        // And back: a CPU image on the GPU.
        let mut cpu_state = c.new_state_with(KvFormat::Int8);
        c.forward(&mut cpu_state, &prompt, Logits::None).unwrap();
        let mut back = g.load_state(&cpu_state.save_image().unwrap()).unwrap();
        let a = c.forward(&mut cpu_state, &next, Logits::All).unwrap();
        let b = g.forward(&mut back, &next, Logits::All).unwrap();
        let err = max_rel(&b, &a);
        println!("{name}: CPU image continued on the GPU: {err:.2e}");
        assert!(err < 1e-3, "{name}: {err}");
    }
    // A draft context on the GPU: copied and reloaded, it drafts the same block.
    let (target, draft_dir) = DRAFTED[0];
    let Some((_, gpu)) = pair(target) else { return };
    let mut draft = DFlashDraft::load(&fixture(draft_dir)).unwrap();
    draft.to_gpu(&gpu.graph).unwrap();
    let taps = draft.config().target_layer_ids.clone();
    let prompt: Vec<u32> = (0..45u32).map(|i| (i * 37 + 5) % 400).collect();
    let f = gpu
        .graph
        .forward_with_taps(&mut gpu.graph.new_state(), &prompt, Logits::None, &taps)
        .unwrap()
        .features;
    let mut ctx = draft.new_context();
    draft.append_context(&mut ctx, &f).unwrap();
    let mut copy = draft.try_clone_context(&ctx).unwrap();
    let mut loaded = draft
        .load_context(&draft.save_context(&ctx).unwrap())
        .unwrap();
    let block = draft.config().block_size;
    let want = draft.draft_block(&mut ctx, &gpu.graph, 7, block).unwrap();
    for (what, c) in [("copy", &mut copy), ("loaded", &mut loaded)] {
        let got = draft.draft_block(c, &gpu.graph, 7, block).unwrap();
        assert!(got.logits == want.logits, "GPU draft context {what}");
    }
}

/// The vision tower on the GPU (bf16 products, f16 attention) against the CPU's f32 tower on
/// `qwen35-vl-tied`, for grids that fill neither a query block nor a key tile, a square and
/// a wide one: within bf16 rounding of the largest embedding.
#[test]
fn the_vision_tower_on_the_gpu_matches_the_cpu() {
    let Some((_, text)) = pair("qwen35-vl-tied") else {
        return;
    };
    let dir = fixture("qwen35-vl-tied");
    let cpu = splash_model::vision::VisionTower::load(&dir)
        .unwrap()
        .unwrap();
    let mut gpu = splash_model::vision::VisionTower::load(&dir)
        .unwrap()
        .unwrap();
    gpu.place_like(&text.graph).unwrap();
    assert_ne!(gpu.device(), "cpu");
    for (gh, gw) in [(2, 2), (6, 10), (16, 16), (4, 64)] {
        let width = cpu.config().patch_len();
        let rows: Vec<f32> = (0..gh * gw)
            .flat_map(|i| (0..width).map(move |j| ((i * 131 + j * 71) % 255) as f32 / 127.5 - 1.0))
            .collect();
        let image = splash_model::vision::PreparedImage {
            grid: (gh, gw),
            rows,
        };
        let (want, got) = (cpu.encode(&image).unwrap(), gpu.encode(&image).unwrap());
        assert_eq!(got.len(), want.len());
        let err = max_rel(&got, &want);
        println!("grid {gh}×{gw}: off by {err:.2e} of the largest embedding");
        assert!(err <= 2e-2, "grid {gh}×{gw}: off by {err}");
    }
}
