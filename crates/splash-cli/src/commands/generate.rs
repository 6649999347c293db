//! `splash generate`: one completion, streamed to stdout.

use std::io::Write;

use anyhow::{bail, Context};
use serde_json::json;
use splash_engine::{Engine, FinishReason, Request, SamplingParams};
use splash_model::TemplateInputs;

use crate::{draft_arg, model_arg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: model_arg::ModelArgs,
    #[command(flatten)]
    draft: draft_arg::DraftArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Answer without a thinking block (with --chat; sets enable_thinking=false).
    #[arg(long, requires = "chat")]
    no_thinking: bool,
    /// Maximum tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// Sampling temperature (0 = greedy). Default: the checkpoint's generation_config, else 1.
    #[arg(long)]
    temperature: Option<f32>,
    /// Top-k truncation (0 = off). Default: the checkpoint's generation_config.
    #[arg(long)]
    top_k: Option<usize>,
    /// Top-p truncation (1 = off). Default: the checkpoint's generation_config.
    #[arg(long)]
    top_p: Option<f32>,
    /// Min-p truncation.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// RNG seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Keep going through end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// KV-cache storage: int8, bf16, or f32 (exact).
    #[arg(long, default_value = "int8")]
    kv_format: splash_model::KvFormat,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let model = model_arg::load(&a.model)?;
    let drafter = draft_arg::load(&a.draft, &a.model, &model)?;
    let text = if a.chat {
        let Some(template) = &model.template else {
            bail!(
                "{} has no chat template (chat_template.jinja or tokenizer_config.json): run without --chat",
                model.dir.display()
            );
        };
        let mut messages = Vec::new();
        if let Some(s) = &a.system {
            messages.push(json!({"role": "system", "content": s}));
        }
        messages.push(json!({"role": "user", "content": a.prompt}));
        let mut extra = serde_json::Map::new();
        if a.no_thinking {
            extra.insert("enable_thinking".into(), json!(false));
        }
        template
            .render(&TemplateInputs {
                messages: json!(messages),
                tools: None,
                add_generation_prompt: true,
                extra,
            })
            .context("rendering the chat template")?
    } else {
        a.prompt.clone()
    };
    let prompt = model.tokenizer.encode(&text)?;
    let g = &model.generation;
    let sampling = SamplingParams {
        temperature: a.temperature.or(g.temperature).unwrap_or(1.0),
        top_k: a.top_k.or(g.top_k).unwrap_or(0),
        top_p: a.top_p.or(g.top_p).unwrap_or(1.0),
        min_p: a.min_p,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        repetition_penalty: a.repetition_penalty,
        seed: a.seed,
    };
    let mut engine = Engine::new(model.clone())
        .with_kv_format(a.kv_format)
        .with_draft_every_step(a.draft.every_step());
    if let Some(d) = drafter {
        engine = engine.with_drafter(d);
    }
    let mut out = std::io::stdout().lock();
    // The chat template opens the reasoning block in the prompt (`<think>\n`): echo it, so
    // the output shows the block whole rather than a bare `</think>`.
    if a.chat && text.ends_with("<think>\n") {
        let _ = out.write_all(b"<think>\n");
    }
    let completion = engine.generate(
        Request {
            prompt,
            sampling,
            max_tokens: a.max_tokens,
            stop: a.stop,
            ignore_eos: a.ignore_eos,
            grammar: None,
            images: Vec::new(),
        },
        |piece| {
            // A closed pipe (`| head`) is not an error worth reporting.
            let _ = out.write_all(piece.as_bytes()).and_then(|_| out.flush());
        },
    )?;
    let _ = writeln!(out);
    let n = completion.tokens.len();
    let reason = match &completion.finish_reason {
        FinishReason::Eos(_)
        | FinishReason::StopString(_)
        | FinishReason::GrammarEnd
        | FinishReason::Scored => "stop",
        FinishReason::Length => "length",
        FinishReason::ContextFull => "context limit",
        FinishReason::Failed(e) => e,
    };
    eprintln!(
        "[{} prompt tokens, {:.1} tok/s prefill; {n} tokens, {:.1} tok/s decode; finished: {reason}]",
        completion.prompt_tokens,
        completion.prompt_tokens as f64 / completion.prefill_time.as_secs_f64().max(1e-9),
        n as f64 / completion.decode_time.as_secs_f64().max(1e-9),
    );
    if let Some(st) = completion.speculation {
        eprintln!(
            "[speculative: {} drafted passes, {} of {} drafted tokens accepted, {:.2} tokens per drafted pass]",
            st.target_passes,
            st.accepted,
            st.drafted,
            st.acceptance_length()
        );
    }
    Ok(())
}
