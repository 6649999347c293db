//! `splash bench`: prefill throughput at a fixed prompt length and single-sequence decode
//! speed, without and (when a draft is available) with speculative decoding, and the cost of
//! one draft pass and one verify pass against a one-token target pass; optionally the prefix
//! cache's time to first token on a long agent prompt ([`replay`]) and the aggregate decode
//! speed of concurrent sequences ([`concurrency`]).

mod concurrency;
mod replay;
mod vision;

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use splash_backend::{profile, timeline};
use splash_engine::{DFlashDrafter, Drafter, Engine, Request, SamplingParams, SpecStats};
use splash_model::{DFlashDraft, Logits, Model};

use crate::{draft_arg, model_arg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: model_arg::ModelArgs,
    #[command(flatten)]
    draft: draft_arg::DraftArgs,
    /// Prompt length for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens per prefill pass, as the server's engine splits a prompt (default: the engine's
    /// chunk for the device, 2,048 on a GPU).
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Tokens to decode for the decode measurement, after the prompt's first 16 tokens (as
    /// llama.cpp's tg starts from an empty context); --verify-rows's 1-token pass cost is the
    /// decode step at the whole prompt's context.
    #[arg(long, default_value_t = 32)]
    decode_tokens: usize,
    /// Repetitions of each measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// KV-cache storage for the decode measurement: int8, bf16, or f32.
    #[arg(long, default_value = "int8")]
    kv_format: splash_model::KvFormat,
    /// Also time one forward pass of this many tokens (a speculative verify block, all rows'
    /// logits) against a one-token pass, after the prompt as context; a list (e.g. 4,8,16)
    /// times each.
    #[arg(long, value_delimiter = ',')]
    verify_rows: Vec<usize>,
    /// Also time the first token of an agent-style prompt of this many tokens: uncached, from
    /// the prefix cache in memory, for the next turn, and from the disk tier.
    #[arg(long, value_parser = splash_server::parse_size)]
    replay_tokens: Option<usize>,
    /// Also measure the aggregate decode speed of this many concurrent sequences (a list,
    /// e.g. 1,4,16), each decoding --decode-tokens.
    #[arg(long, value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Also time the vision tower (the model's, on the model's device) on images of these sizes, e.g.
    /// 512x512,1024x1024.
    #[arg(long, value_delimiter = ',', value_parser = vision::parse_size)]
    image: Vec<(usize, usize)>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let model = model_arg::load(&a.model)?;
    let prompt = pseudo_random_tokens(&model, a.prompt_tokens, 0x2545_F491_4F6C_DD1D);
    let repeat = a.repeat.max(1);

    // Warm-up (thread pool, page cache of the weights).
    model.graph.forward(
        &mut model.graph.new_state_with(a.kv_format),
        &prompt[..prompt.len().min(16)],
        Logits::Last,
    )?;

    let chunk = a
        .prefill_chunk
        .unwrap_or_else(|| splash_engine::prefill_chunk_for(&model))
        .max(1);
    let mut prefill = Vec::new();
    for _ in 0..repeat {
        let mut state = model.graph.new_state_with(a.kv_format);
        let t0 = Instant::now();
        let chunks: Vec<&[u32]> = prompt.chunks(chunk).collect();
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let want = if last { Logits::Last } else { Logits::None };
            model.graph.forward(&mut state, c, want)?;
        }
        prefill.push(prompt.len() as f64 / t0.elapsed().as_secs_f64());
    }
    let decode_prompt = &prompt[..prompt.len().min(16)];
    let decode = |drafter: Option<Arc<dyn Drafter>>| -> anyhow::Result<(f64, Option<SpecStats>)> {
        let (mut speeds, mut stats) = (Vec::new(), None);
        for _ in 0..repeat {
            let mut engine = Engine::new(model.clone())
                .with_kv_format(a.kv_format)
                .with_draft_every_step(a.draft.every_step());
            if let Some(d) = &drafter {
                engine = engine.with_drafter(d.clone());
            }
            let c = engine.generate(
                Request {
                    prompt: decode_prompt.to_vec(),
                    sampling: SamplingParams::greedy(),
                    max_tokens: a.decode_tokens,
                    stop: Vec::new(),
                    ignore_eos: true,
                    grammar: None,
                    images: Vec::new(),
                },
                |_| {},
            )?;
            speeds.push(c.tokens.len() as f64 / c.decode_time.as_secs_f64());
            stats = c.speculation;
        }
        Ok((median(&mut speeds), stats))
    };
    let (d, _) = decode(None)?;
    let draft = draft_arg::load_dflash(&a.draft, &a.model, &model)?;
    let spec = match &draft {
        Some(dr) => {
            let (tok_s, stats) = decode(Some(Arc::new(DFlashDrafter::new(dr.clone()))))?;
            let costs = pass_costs(&model, dr, &prompt, a.kv_format, repeat)?;
            Some((tok_s, stats.unwrap_or_default(), costs))
        }
        None => None,
    };
    let rows = row_costs(&model, &prompt, &a.verify_rows, a.kv_format, repeat)?;
    let replay = a
        .replay_tokens
        .map(|n| replay::run(&model, n, a.kv_format, repeat))
        .transpose()?;
    let drafter: Option<Arc<dyn Drafter>> = draft
        .as_ref()
        .map(|d| Arc::new(DFlashDrafter::new(d.clone())) as Arc<dyn Drafter>);
    let mut concurrent = Vec::new();
    for &n in &a.concurrency {
        for d in std::iter::once(None).chain(drafter.as_ref().map(Some)) {
            concurrent.push((
                d.is_some(),
                concurrency::run(&model, d, n.max(1), a.decode_tokens, a.kv_format)?,
            ));
        }
    }
    let towers = match a.image.is_empty() {
        true => Vec::new(),
        false => vision::run(&model, &a.image, repeat)?,
    };
    let p = median(&mut prefill);
    let threads = rayon::current_num_threads();
    if a.json {
        let mut v = json!({
            "model": model.dir.display().to_string(),
            "parameters": model.graph.num_parameters(),
            "threads": threads,
            "prompt_tokens": a.prompt_tokens,
            "prefill_tok_s": p,
            "prefill_chunk": chunk,
            "decode_tokens": a.decode_tokens,
            "decode_tok_s": d,
        });
        if let Some((tok_s, st, c)) = &spec {
            v["speculative"] = json!({
                "decode_tok_s": tok_s,
                "tokens_per_target_pass": st.acceptance_length(),
                "target_passes": st.target_passes,
                "drafted": st.drafted,
                "accepted": st.accepted,
                "block_size": c.block,
                "target_pass_ms": c.target_ms,
                "verify_pass_ms": c.full_verify_ms(),
                "verify_pass_ms_by_rows": c.verify_ms.iter().map(|&(rows, ms)| json!({"rows": rows, "ms": ms})).collect::<Vec<_>>(),
                "draft_pass_ms": c.draft_ms,
                "by_acceptance": c.by_acceptance().iter().map(|&(tau, rows, tok_s, speedup)| {
                    json!({"tau": tau, "verify_rows": rows, "tok_s": tok_s, "speedup": speedup})
                }).collect::<Vec<_>>(),
            });
        }
        if let Some(RowCosts { one, many }) = &rows {
            let mut costs = json!({"rows_1": one});
            for (n, ms) in many {
                costs[format!("rows_{n}")] = json!(ms);
            }
            v["pass_ms"] = costs;
        }
        if let Some(r) = &replay {
            v["replay"] = json!({
                "prompt_tokens": r.tokens,
                "uncached_ms": r.uncached_ms,
                "memory_ms": r.memory_ms,
                "memory_cached_tokens": r.memory_cached,
                "next_turn_ms": r.next_turn_ms,
                "next_turn_tokens": r.next_turn_tokens,
                "next_turn_cached_tokens": r.next_turn_cached,
                "disk_ms": r.disk_ms,
                "disk_cached_tokens": r.disk_cached,
                "disk_file_bytes": r.disk_bytes,
            });
        }
        if !concurrent.is_empty() {
            v["concurrency"] = concurrent
                .iter()
                .map(|(with_draft, c)| {
                    json!({"sequences": c.sequences, "draft": with_draft, "tok_s": c.tok_s, "rows_per_pass": c.rows_per_pass})
                })
                .collect();
        }
        if !towers.is_empty() {
            v["vision"] = towers
                .iter()
                .map(|t| json!({"width": t.width, "height": t.height, "grid": [t.grid.0, t.grid.1], "tokens": t.tokens, "ms": t.ms, "gflops": t.gflops, "device": t.device}))
                .collect();
        }
        println!("{v}");
    } else {
        println!(
            "{}: {} parameters, {threads} threads\nprefill {:>5} tokens: {p:>9.1} tok/s (passes of {chunk})\ndecode  {:>5} tokens: {d:>9.2} tok/s (speculation off, after {} prompt tokens)",
            model.dir.display(),
            model.graph.num_parameters(),
            a.prompt_tokens,
            a.decode_tokens,
            decode_prompt.len(),
        );
        if let Some(RowCosts { one, many }) = &rows {
            let each: Vec<String> = many
                .iter()
                .map(|(n, ms)| format!("{n} tokens {ms:.2} ms ({:.2}x)", ms / one))
                .collect();
            println!(
                "pass cost (context {}): 1 token {one:.2} ms; {}",
                prompt.len(),
                each.join("; ")
            );
        }
        if let Some((tok_s, st, c)) = &spec {
            println!(
                "decode  {:>5} tokens: {tok_s:>9.2} tok/s with the draft, {:.2} tokens per target pass ({} of {} drafts accepted)\npass cost (context {}): target 1 token {:.2} ms; verify {} tokens {:.2} ms ({:.2}x); draft block {:.2} ms ({:.2}x)",
                a.decode_tokens,
                st.acceptance_length(),
                st.accepted,
                st.drafted,
                prompt.len(),
                c.target_ms,
                c.block,
                c.full_verify_ms(),
                c.full_verify_ms() / c.target_ms,
                c.draft_ms,
                c.draft_ms / c.target_ms,
            );
            let shorter: Vec<String> = c.verify_ms[..c.verify_ms.len() - 1]
                .iter()
                .map(|&(rows, ms)| format!("{rows} tokens {ms:.2} ms ({:.2}x)", ms / c.target_ms))
                .collect();
            if !shorter.is_empty() {
                println!("shorter verify passes: {}", shorter.join("; "));
            }
            println!("decode speed by tokens per target pass τ (draft + the shortest verify that holds τ):");
            for (tau, rows, tok_s, speedup) in c.by_acceptance() {
                println!("  τ = {tau}: {tok_s:>9.1} tok/s, {speedup:.2}x speculation off (verify {rows})");
            }
        }
        if let Some(r) = &replay {
            println!(
                "time to first token, {}-token agent prompt: uncached {:.1} ms; repeated {:.1} ms ({} cached); next turn {:.1} ms ({} of {} cached); from disk {:.1} ms ({} cached, {:.1} MiB file, page cache dropped)",
                r.tokens,
                r.uncached_ms,
                r.memory_ms,
                r.memory_cached,
                r.next_turn_ms,
                r.next_turn_cached,
                r.next_turn_tokens,
                r.disk_ms,
                r.disk_cached,
                r.disk_bytes as f64 / (1 << 20) as f64,
            );
        }
        for t in &towers {
            println!(
                "vision tower {}x{} on {}: {}x{} patches, {} tokens: {:.1} ms ({:.1} GFLOP/s)",
                t.width, t.height, t.device, t.grid.0, t.grid.1, t.tokens, t.ms, t.gflops
            );
        }
        if !concurrent.is_empty() {
            println!(
                "concurrent sequences ({} tokens each): aggregate decode",
                a.decode_tokens
            );
            for &(with_draft, ref c) in &concurrent {
                let one = concurrent
                    .iter()
                    .find(|(d, o)| *d == with_draft && o.sequences == 1)
                    .map(|(_, o)| o.tok_s);
                println!(
                    "  {:>3} sequences{}: {:>9.1} tok/s{}, {:.1} rows per pass",
                    c.sequences,
                    if with_draft { ", with the draft" } else { "" },
                    c.tok_s,
                    one.map_or(String::new(), |o| format!(" ({:.2}x one)", c.tok_s / o)),
                    c.rows_per_pass,
                );
            }
        }
    }
    Ok(())
}

/// Median milliseconds of one pass each, after a `prompt`-long context.
struct PassCosts {
    block: usize,
    target_ms: f64,
    /// Verify passes (with their rollback) of the lengths greedy speculation chooses among
    /// (`splash_engine::verify_lengths`, past the anchor alone): `(rows, ms)`, ascending, the
    /// full block last.
    verify_ms: Vec<(usize, f64)>,
    draft_ms: f64,
}

impl PassCosts {
    /// The full block's verify pass.
    fn full_verify_ms(&self) -> f64 {
        self.verify_ms.last().map_or(0.0, |&(_, ms)| ms)
    }

    /// `(τ, rows, tok/s, speed-up over one-token passes)` for τ = 1..=block: a speculative step
    /// costs one draft and one verify pass, of the shortest length that holds τ tokens (the one
    /// the engine settles on when every step accepts τ - 1 proposals), and emits τ tokens; at
    /// τ = 1 the engine verifies the anchor alone, undrafted (a one-token pass). With a random
    /// draft the measured τ means nothing, so speed is reported for every τ.
    fn by_acceptance(&self) -> Vec<(usize, usize, f64, f64)> {
        (1..=self.block)
            .map(|tau| {
                let (rows, step) = match self.verify_ms.iter().find(|&&(rows, _)| rows >= tau) {
                    _ if tau == 1 => (1, self.target_ms),
                    Some(&(rows, verify)) => (rows, self.draft_ms + verify),
                    None => (self.block, self.draft_ms + self.full_verify_ms()),
                };
                let tok_s = tau as f64 * 1e3 / step;
                (tau, rows, tok_s, tok_s * self.target_ms / 1e3)
            })
            .collect()
    }
}

/// Median milliseconds of a target pass, a verify pass with its rollback and a draft block, in
/// steady state (after [`WARM_UP_PASSES`]), over `prompt`. The verify pass returns each row's
/// argmax, as greedy decoding runs it.
fn pass_costs(
    model: &Model,
    draft: &DFlashDraft,
    prompt: &[u32],
    kv: splash_model::KvFormat,
    repeat: usize,
) -> anyhow::Result<PassCosts> {
    let taps = &draft.config().target_layer_ids;
    let block = draft.config().block_size;
    let mut state = model.graph.new_state_with(kv);
    let features = model
        .graph
        .forward_with_taps(&mut state, prompt, Logits::Last, taps)?
        .features;
    let mut ctx = draft.new_context();
    draft.append_context(&mut ctx, &features)?;
    let tokens: Vec<u32> = prompt[..block].to_vec();
    let lengths: Vec<usize> = splash_engine::verify_lengths(block)
        .into_iter()
        .filter(|&l| l > 1)
        .collect();
    let (mut target, mut drafting) = (Vec::new(), Vec::new());
    let mut verify = vec![Vec::new(); lengths.len()];
    for i in 0..repeat.max(3) + WARM_UP_PASSES {
        if i == WARM_UP_PASSES {
            (target, drafting) = (Vec::new(), Vec::new());
            verify.iter_mut().for_each(Vec::clear);
        }
        // Each pass is rolled back, so every pass sees the same context; the verify time
        // includes its rollback (the GDN replay of the kept row), as in decoding.
        state.checkpoint();
        let t0 = Instant::now();
        model
            .graph
            .forward(&mut state, &tokens[..1], Logits::Last)?;
        target.push(t0.elapsed().as_secs_f64() * 1e3);
        state.rollback(0)?;
        model.graph.synchronize()?;
        for (&rows, times) in lengths.iter().zip(&mut verify) {
            state.checkpoint();
            let t0 = Instant::now();
            model
                .graph
                .forward_with_taps(&mut state, &tokens[..rows], Logits::Argmax, taps)?;
            state.rollback(1)?;
            model.graph.synchronize()?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        let t0 = Instant::now();
        let drafted = draft.draft_block(&mut ctx, &model.graph, tokens[0], block)?;
        std::hint::black_box(drafted.logits);
        drafting.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    if let Some(before) = model.graph.gpu_profile() {
        // SPLASH_GPU_PROFILE: where one more draft block's time goes, launch by launch.
        let t0 = Instant::now();
        draft.draft_block(&mut ctx, &model.graph, tokens[0], block)?;
        let wall = t0.elapsed().as_secs_f64() * 1e3;
        let after = model.graph.gpu_profile().unwrap_or_default();
        let rows = profile::profile_since(&before, &after);
        let in_kernels: f64 = rows.iter().map(|r| r.2).sum();
        eprintln!(
            "one draft block, every launch synchronised: {wall:.2} ms, {:.2} ms in kernels",
            in_kernels * 1e3
        );
        eprint!("{}", profile::profile_text(&rows));
    }
    Ok(PassCosts {
        block,
        target_ms: median(&mut target),
        verify_ms: lengths
            .iter()
            .zip(&mut verify)
            .map(|(&rows, times)| (rows, median(times)))
            .collect(),
        draft_ms: median(&mut drafting),
    })
}

/// Pass costs after a prompt: a one-token pass and passes of several tokens (ms).
struct RowCosts {
    one: f64,
    /// (tokens, ms) for each asked row count.
    many: Vec<(usize, f64)>,
}

/// Median milliseconds of a one-token pass and of a pass of each of `rows` tokens (every row's
/// logits; 0 is skipped), each after `prompt`, in steady state (after [`WARM_UP_PASSES`]);
/// `None` when no row count is asked.
fn row_costs(
    model: &Model,
    prompt: &[u32],
    rows: &[usize],
    kv: splash_model::KvFormat,
    repeat: usize,
) -> anyhow::Result<Option<RowCosts>> {
    let rows: Vec<usize> = rows.iter().copied().filter(|&n| n > 0).collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let most = rows.iter().copied().max().unwrap_or(1);
    let tokens: Vec<u32> = (0..most as u32)
        .map(|i| prompt[i as usize % prompt.len()])
        .collect();
    let cost = |n: usize| -> anyhow::Result<f64> {
        // Passes over one state, as decoding runs them (on the GPU, the first two launch and
        // capture a graph, the others replay it); the context grows by n per pass.
        let mut state = model.graph.new_state_with(kv);
        model.graph.forward(&mut state, prompt, Logits::None)?;
        let mut times = Vec::new();
        for i in 0..repeat.max(3) + WARM_UP_PASSES {
            let t0 = Instant::now();
            model.graph.forward(&mut state, &tokens[..n], Logits::All)?;
            if i >= WARM_UP_PASSES {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        // SPLASH_TIMELINE: one more pass, its launches as they ran.
        if model.graph.gpu_timeline_reset()? {
            model.graph.forward(&mut state, &tokens[..n], Logits::All)?;
            match model.graph.gpu_timeline()? {
                Some(Ok(spans)) => eprint!(
                    "timeline of one {n}-token pass (SPLASH_TIMELINE):\n{}",
                    timeline::timeline_text(&spans)
                ),
                Some(Err(e)) => eprintln!("timeline of one {n}-token pass: {e}"),
                None => {}
            }
        }
        Ok(median(&mut times))
    };
    let one = cost(1)?;
    let many = rows
        .iter()
        .map(|&n| Ok((n, cost(n)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(RowCosts { one, many }))
}

/// A deterministic pseudo-random prompt (xorshift from `seed`): speed does not depend on the ids.
fn pseudo_random_tokens(model: &Model, n: usize, seed: u64) -> Vec<u32> {
    let vocab = model.config.vocab_size as u64;
    let mut x = seed;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab) as u32
        })
        .collect()
}

/// Untimed passes before a pass cost is measured: on the GPU, a pass that comes again is
/// captured as a graph at its second run and replayed from then on, as in decoding.
const WARM_UP_PASSES: usize = 2;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
