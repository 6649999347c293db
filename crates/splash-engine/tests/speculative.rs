//! Speculative decoding through the engine's real path on the fixture targets: greedy output
//! with a draft is identical token for token to output without it (random DFlash / DFlash2
//! drafts that reject often, oracle drafts that propose the target's own tokens, and oracle
//! drafts with injected errors for every partial acceptance length), stop tokens and stop
//! strings inside an accepted span, an output constraint that starts inside one, sampled
//! output that follows the target's distribution (chi-square), and seeded sampled output that
//! does not depend on step times.

use std::path::PathBuf;
use std::sync::Arc;

use splash_engine::{
    Constraint, DFlashDrafter, DraftSession, Drafter, Engine, FinishReason, GrammarRequest,
    Proposal, Request, Sampler, SamplingParams, SpecStats,
};
use splash_model::{load, DFlashDraft, KvFormat, Logits, Model, ModelError};

mod common;
use common::{demo, demo_draft, fixture, greedy, Oracle};

fn json(path: PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn target(name: &str) -> Arc<Model> {
    Arc::new(load(&fixture(name)).unwrap())
}

fn dflash(name: &str) -> Arc<dyn Drafter> {
    Arc::new(DFlashDrafter::new(Arc::new(
        DFlashDraft::load(&fixture(&format!("dflash/{name}"))).unwrap(),
    )))
}

/// Prompts of the target fixture, the long one (147 tokens) included.
fn prompts(target: &str) -> Vec<Vec<u32>> {
    let r = json(fixture(target).join("reference.json"));
    r["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| ids(&p["ids"]))
        .collect()
}

fn run(
    m: &Arc<Model>,
    drafter: Option<Arc<dyn Drafter>>,
    req: Request,
    kv: KvFormat,
) -> splash_engine::Completion {
    // Every step drafted: the tests compare with loops that draft every block.
    let mut engine = Engine::new(m.clone())
        .with_kv_format(kv)
        .with_prefill_chunk(64)
        .with_draft_every_step(true);
    if let Some(d) = drafter {
        engine = engine.with_drafter(d);
    }
    engine.generate(req, |_| {}).unwrap()
}

/// Each prompt's greedy output without a draft (`max_tokens` tokens, f32 cache), and each
/// prompt followed by its output (what an [`Oracle`] proposes from).
fn plain_runs(
    m: &Arc<Model>,
    prompts: &[Vec<u32>],
    max_tokens: usize,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
    let plain: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| run(m, None, greedy(p.clone(), max_tokens), KvFormat::F32).tokens)
        .collect();
    let sequences = prompts
        .iter()
        .zip(&plain)
        .map(|(p, o)| p.iter().chain(o).copied().collect())
        .collect();
    (plain, sequences)
}

#[test]
fn greedy_with_random_drafts_is_lossless_and_matches_the_reference_loop() {
    for name in ["dense-dflash", "dense-dflash2", "moe-dflash", "moe-dflash2"] {
        let r = json(fixture(&format!("dflash/{name}/reference.json")));
        let m = target(r["target"].as_str().unwrap());
        let d = dflash(name);
        let want = ids(&r["output_ids"]);
        // The reference loop (transformers + z-lab draft, no caches) on the same prompt.
        let c = run(
            &m,
            Some(d.clone()),
            greedy(ids(&r["prompt_ids"]), want.len()),
            KvFormat::F32,
        );
        assert_eq!(
            c.tokens, want,
            "{name}: differs from the reference speculative loop"
        );
        let accepted: u64 = r["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["accepted"].as_u64().unwrap())
            .sum();
        let st = c.speculation.unwrap();
        println!("{name}: reference {accepted} accepted drafts, splash {st:?}");
        assert_eq!(
            st.accepted, accepted,
            "{name}: acceptances differ from the reference loop"
        );
        // Long outputs over every fixture prompt: identical to decoding without the draft.
        let tname = r["target"].as_str().unwrap();
        let mut total = SpecStats::default();
        for (i, prompt) in prompts(tname).into_iter().enumerate() {
            let kv = if i == 3 {
                KvFormat::Int8
            } else {
                KvFormat::F32
            };
            let plain = run(&m, None, greedy(prompt.clone(), 160), kv);
            let spec = run(&m, Some(d.clone()), greedy(prompt, 160), kv);
            assert_eq!(spec.tokens, plain.tokens, "{name} prompt {i}: not lossless");
            assert_eq!(spec.text, plain.text);
            total.add(&spec.speculation.unwrap());
        }
        println!(
            "{name}: 4 prompts × 160 tokens, {total:?}, τ = {:.3}",
            total.acceptance_length()
        );
        assert!(total.target_passes > 100);
    }
}

#[test]
fn greedy_with_oracle_drafts_is_lossless_over_full_and_partial_blocks() {
    for tname in ["qwen35-dense", "qwen35-moe"] {
        let m = target(tname);
        let prompts = prompts(tname);
        let (plain, sequences) = plain_runs(&m, &prompts, 200);
        for (block, error_every) in [(8, None), (16, None), (8, Some(9)), (5, Some(4))] {
            let oracle: Arc<dyn Drafter> = Arc::new(Oracle {
                sequences: sequences.clone(),
                block,
                error_every,
            });
            let mut total = SpecStats::default();
            let mut lengths = std::collections::BTreeSet::new();
            for (prompt, want) in prompts.iter().zip(&plain) {
                let c = run(
                    &m,
                    Some(oracle.clone()),
                    greedy(prompt.clone(), 200),
                    KvFormat::F32,
                );
                assert_eq!(
                    &c.tokens, want,
                    "{tname} block {block} errors {error_every:?}: not lossless"
                );
                let st = c.speculation.unwrap();
                total.add(&st);
                lengths.insert(st.accepted);
            }
            println!(
                "{tname} oracle block {block}, error every {error_every:?}: {total:?}, τ = {:.3}",
                total.acceptance_length()
            );
            match error_every {
                None => {
                    // Every proposal is the target's token: full blocks (the last may be cut
                    // by the budget).
                    assert_eq!(
                        total.accepted, total.drafted,
                        "{tname}: a perfect draft was rejected"
                    );
                    assert!(total.acceptance_length() > block as f64 - 1.0);
                }
                Some(_) => assert!(total.accepted < total.drafted && total.accepted > 0),
            }
        }
    }
}

/// The default speculation chooses how many rows each step verifies (the anchor alone, or the
/// first quarter, half or whole of a drafted block) from the speeds it measures: whatever it
/// picks, greedy output is the output without the draft (oracle drafts with errors, random
/// DFlash and DFlash2 drafts), and blocks shorter than the draft's are verified.
#[test]
fn greedy_with_chosen_verify_lengths_is_lossless() {
    let m = target("qwen35-dense");
    let prompts = prompts("qwen35-dense");
    let (plain, sequences) = plain_runs(&m, &prompts, 120);
    let oracle: Arc<dyn Drafter> = Arc::new(Oracle {
        sequences,
        block: 16,
        error_every: Some(5),
    });
    for (name, d) in [
        ("dense-dflash", dflash("dense-dflash")),
        ("dense-dflash2", dflash("dense-dflash2")),
        ("oracle", oracle),
    ] {
        let mut total = SpecStats::default();
        for (prompt, want) in prompts.iter().zip(&plain) {
            let mut engine = Engine::new(m.clone())
                .with_kv_format(KvFormat::F32)
                .with_prefill_chunk(64)
                .with_drafter(d.clone());
            let c = engine
                .generate(greedy(prompt.clone(), 120), |_| {})
                .unwrap();
            let same = c
                .tokens
                .iter()
                .zip(want)
                .take_while(|(a, b)| a == b)
                .count();
            assert_eq!(
                &c.tokens,
                want,
                "{name}: not lossless from output token {same} (prompt of {})",
                prompt.len()
            );
            total.add(&c.speculation.unwrap());
        }
        println!("{name}: chosen lengths, {total:?}");
        // The first steps try 16, 8 and 4 rows: fewer than 15 proposals a pass on average.
        assert!(total.target_passes > 0, "{name}: never drafted");
        assert!(
            total.drafted < 15 * total.target_passes,
            "{name}: {total:?}"
        );
    }
}

#[test]
fn stop_tokens_and_strings_inside_an_accepted_span() {
    for tname in ["qwen35-dense", "qwen35-moe"] {
        let m = target(tname);
        for prompt in prompts(tname) {
            let plain = run(&m, None, greedy(prompt.clone(), 60), KvFormat::F32);
            let seq: Vec<u32> = prompt.iter().chain(&plain.tokens).copied().collect();
            let oracle: Arc<dyn Drafter> = Arc::new(Oracle {
                sequences: vec![seq],
                block: 16,
                error_every: None,
            });
            // EOS: the fixture's eos (505) shows up mid-output for some MoE prompts.
            let mut req = greedy(prompt.clone(), 60);
            req.ignore_eos = false;
            let a = run(&m, None, req.clone(), KvFormat::F32);
            let b = run(&m, Some(oracle.clone()), req, KvFormat::F32);
            assert_eq!((&a.tokens, &a.finish_reason), (&b.tokens, &b.finish_reason));
            // A stop string taken from the middle of the output.
            let text = &plain.text;
            let chars: Vec<char> = text.chars().collect();
            if chars.len() < 30 {
                continue;
            }
            let stop: String = chars[chars.len() / 2..chars.len() / 2 + 3].iter().collect();
            let mut req = greedy(prompt.clone(), 60);
            req.stop = vec![stop.clone()];
            let a = run(&m, None, req.clone(), KvFormat::F32);
            let b = run(&m, Some(oracle), req, KvFormat::F32);
            assert_eq!(a.text, b.text, "{tname}: stop {stop:?}");
            assert_eq!(a.tokens, b.tokens);
            assert_eq!(a.finish_reason, FinishReason::StopString(stop.clone()));
            assert_eq!(b.finish_reason, a.finish_reason);
        }
    }
}

/// Drafts from the target's own distribution mixed with mass on tokens the target never
/// picks (so both acceptance and the residual draw are exercised).
struct Noisy;

struct NoisySession;

impl Drafter for Noisy {
    fn block_size(&self) -> usize {
        4
    }
    fn tap_layers(&self) -> &[usize] {
        &[]
    }
    fn session(&self) -> Box<dyn DraftSession> {
        Box::new(NoisySession)
    }
}

impl DraftSession for NoisySession {
    fn commit(&mut self, _: &[f32]) -> Result<(), ModelError> {
        Ok(())
    }
    fn propose(
        &mut self,
        target: &Model,
        history: &[u32],
        len: usize,
        sampler: &mut Sampler,
    ) -> Result<Proposal, ModelError> {
        let mut st = target.graph.new_state();
        let mut logits = target.graph.forward(&mut st, history, Logits::Last)?;
        let mut proposal = Proposal::default();
        for _ in 0..len {
            let p = sampler.truncated(&logits).normalized();
            let mut entries: Vec<(u32, f64)> =
                p.entries.iter().map(|&(t, x)| (t, 0.6 * x)).collect();
            let others: Vec<u32> = p
                .entries
                .iter()
                .map(|e| (e.0 + 1) % 500)
                .filter(|t| p.prob(*t) == 0.0)
                .collect();
            let support = p.entries.len() + others.len();
            for e in entries.iter_mut() {
                e.1 += 0.4 / support as f64;
            }
            entries.extend(others.iter().map(|&t| (t, 0.4 / support as f64)));
            let q = splash_engine::Distribution { entries };
            let d = sampler.draw(&q);
            proposal.tokens.push(d);
            proposal.q.push(q);
            logits = target.graph.forward(&mut st, &[d], Logits::Last)?;
        }
        Ok(proposal)
    }
}

/// A constraint that starts at a token (a call grammar after `<tool_call>`): the draft
/// speculates until that token, an accepted span is cut right after it (the tokens after it
/// were chosen unmasked), and the proposals after it are accepted under the mask; the output
/// is what decoding without a draft gives, and the text after the token matches the grammar.
#[test]
fn a_constraint_starting_inside_an_accepted_span() {
    let m = target("qwen35-dense");
    let prompt = prompts("qwen35-dense").remove(0);
    let free = run(&m, None, greedy(prompt.clone(), 60), KvFormat::F32).tokens;
    let trigger = free[12];
    let at = free.iter().position(|&t| t == trigger).unwrap();
    let constrained = |p: Vec<u32>| Request {
        grammar: Some(GrammarRequest {
            constraint: Constraint::Lark("start: \"abc\" /[0-9]{3}/\n".into()),
            after: vec![trigger],
        }),
        ..greedy(p, 60)
    };
    let plain = run(&m, None, constrained(prompt.clone()), KvFormat::F32);
    assert_eq!(plain.finish_reason, FinishReason::GrammarEnd);
    assert_eq!(plain.tokens[..=at], free[..=at]);
    let after = m.tokenizer.decode(&plain.tokens[at + 1..], false).unwrap();
    assert!(
        after.len() == 6
            && after.starts_with("abc")
            && after[3..].bytes().all(|b| b.is_ascii_digit()),
        "{after:?}"
    );
    // The oracle proposes the unconstrained continuation, past the trigger, while it can.
    let sequences = [&free, &plain.tokens].map(|o| [prompt.clone(), o.clone()].concat());
    for error_every in [None, Some(5)] {
        let oracle: Arc<dyn Drafter> = Arc::new(Oracle {
            sequences: sequences.to_vec(),
            block: 8,
            error_every,
        });
        let spec = run(&m, Some(oracle), constrained(prompt.clone()), KvFormat::F32);
        assert_eq!(spec.tokens, plain.tokens, "errors {error_every:?}");
        assert_eq!(spec.finish_reason, FinishReason::GrammarEnd);
        let st = spec.speculation.unwrap();
        assert!(st.accepted > 0, "no speculation before the trigger: {st:?}");
    }
    // An oracle that knows the constrained output: its proposals are accepted under the mask
    // too, so the constrained tokens come in blocks as well; it goes on with the end-of-text
    // token, the one a complete grammar allows, which the span may accept past the end.
    let eos = m.generation.eos_token_ids[0];
    let oracle: Arc<dyn Drafter> = Arc::new(Oracle {
        sequences: vec![[sequences[1].clone(), vec![eos; 8]].concat()],
        block: 8,
        error_every: None,
    });
    let spec = run(&m, Some(oracle), constrained(prompt.clone()), KvFormat::F32);
    assert_eq!(spec.tokens, plain.tokens);
    let st = spec.speculation.unwrap();
    assert!(
        st.target_passes as usize * 3 <= plain.tokens.len(),
        "{} tokens in {st:?}",
        plain.tokens.len()
    );
}

/// Upper tail of chi-square at 99.9 % (Wilson–Hilferty).
fn chi2_critical(dof: f64) -> f64 {
    let z = 3.09;
    let a = 2.0 / (9.0 * dof);
    dof * (1.0 - a + z * a.sqrt()).powi(3)
}

#[test]
fn sampled_speculation_follows_the_target_distribution() {
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 3,
        ..Default::default()
    };
    for (name, noisy) in [
        ("dense-dflash", false),
        ("moe-dflash2", false),
        ("dense-dflash", true),
        ("moe-dflash2", true),
    ] {
        let r = json(fixture(&format!("dflash/{name}/reference.json")));
        let m = target(r["target"].as_str().unwrap());
        let d: Arc<dyn Drafter> = if noisy { Arc::new(Noisy) } else { dflash(name) };
        let prompt = ids(&r["prompt_ids"]);
        // Exact probabilities of every 3-token output under the target alone.
        let shaper = Sampler::new(params.clone());
        let dist = |ctx: &[u32]| {
            let mut st = m.graph.new_state();
            let mut logits = m.graph.forward(&mut st, ctx, Logits::Last).unwrap();
            shaper.distribution(&mut logits, ctx, &[]).normalized()
        };
        let mut exact = std::collections::HashMap::new();
        for &(a, pa) in &dist(&prompt).entries {
            let ctx_a: Vec<u32> = prompt.iter().copied().chain([a]).collect();
            for &(b, pb) in &dist(&ctx_a).entries {
                let ctx_b: Vec<u32> = ctx_a.iter().copied().chain([b]).collect();
                for &(c, pc) in &dist(&ctx_b).entries {
                    exact.insert(vec![a, b, c], pa * pb * pc);
                }
            }
        }
        let n = 2000;
        let mut counts = std::collections::HashMap::<Vec<u32>, usize>::new();
        let mut engine = Engine::new(m.clone())
            .with_kv_format(KvFormat::F32)
            .with_drafter(d);
        for seed in 0..n {
            let mut req = greedy(prompt.clone(), 3);
            req.sampling = SamplingParams {
                seed: Some(seed),
                ..params.clone()
            };
            let c = engine.generate(req, |_| {}).unwrap();
            *counts.entry(c.tokens).or_default() += 1;
        }
        assert!(
            counts.keys().all(|k| exact.contains_key(k)),
            "{name}: a sequence outside the target's support"
        );
        let chi2: f64 = exact
            .iter()
            .map(|(k, &p)| {
                let e = p * n as f64;
                let o = *counts.get(k).unwrap_or(&0) as f64;
                (o - e).powi(2) / e
            })
            .sum();
        let dof = (exact.len() - 1) as f64;
        let st = engine.spec_stats();
        println!(
            "{name} (noisy target draft: {noisy}): chi2 = {chi2:.1} over {dof} dof (99.9% critical {:.1}); {st:?}",
            chi2_critical(dof)
        );
        assert!(chi2 < chi2_critical(dof), "{name}: chi-square {chi2}");
        // The random drafts' top-3 rarely meets the target's: only the residual path runs.
        if noisy {
            assert!(
                st.accepted > 0 && st.accepted < st.drafted,
                "{name}: {st:?}"
            );
        }
    }
}

#[test]
fn trained_demo_draft_is_lossless_and_accepts_several_tokens_per_pass() {
    // The bundled demo and its trained draft, as stored and quantised to Q4_K on load: real
    // acceptance, long accepted spans, EOS inside them; greedy output must still equal
    // decoding without the draft, and the quantised draft must still be accepted as often.
    let (m, _) = demo();
    let mut taus = Vec::new();
    for quantize in [false, true] {
        let d = demo_draft(quantize);
        let mut total = SpecStats::default();
        for (i, question) in [
            "What is 486 + 275?",
            "Write a Python function that counts the vowels in a string.",
            "What is the capital of Kenya?",
            "Return a JSON object for: Liam is 29 years old and lives in Lima.\nSchema: {\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}, \"city\": {\"type\": \"string\"}}, \"required\": [\"name\", \"age\", \"city\"]}",
        ]
        .into_iter()
        .enumerate()
        {
            let text = format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>\n");
            let prompt = m.tokenizer.encode(&text).unwrap();
            let kv = if i % 2 == 0 { KvFormat::Int8 } else { KvFormat::F32 };
            let req = Request {
                ignore_eos: false,
                ..greedy(prompt, 200)
            };
            let plain = run(&m, None, req.clone(), kv);
            // The default engine: each step drafts or not by speed, and both kinds interleave.
            let spec = Engine::new(m.clone())
                .with_kv_format(kv)
                .with_drafter(d.clone())
                .generate(req.clone(), |_| {})
                .unwrap();
            assert_eq!(spec.tokens, plain.tokens, "question {i}: not lossless");
            let every = run(&m, Some(d.clone()), req, kv);
            assert_eq!(every.tokens, plain.tokens, "question {i}: not lossless");
            assert!(
                matches!(spec.finish_reason, FinishReason::Eos(_)),
                "question {i} should end at <|im_end|>: {}",
                spec.text
            );
            total.add(&every.speculation.unwrap());
        }
        let tau = total.acceptance_length();
        println!("demo, quantised draft {quantize}, a block every step: {total:?}, τ = {tau:.3}");
        assert!(
            tau > 2.5,
            "the trained draft should be accepted often: τ = {tau:.3} (quantised: {quantize})"
        );
        taus.push(tau);
    }
    assert!(
        taus[1] > 0.85 * taus[0],
        "the Q4_K draft is accepted much less than the stored one: τ {taus:?}"
    );
}

/// Speculating sequences running together verify their blocks in one batched target pass
/// (each from its own checkpoint, with its own rollback); each still gets the tokens it gets
/// alone: random drafts (partial acceptance, dense and MoE) and the trained demo draft (long
/// acceptances), with prompts prefilled while others decode.
#[test]
fn concurrent_speculative_sequences_match_their_solo_runs() {
    let (m_demo, d_demo) = demo();
    let chat = |q: &str| {
        let text = format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n<think>\n");
        m_demo.tokenizer.encode(&text).unwrap()
    };
    let cases = [
        (
            target("qwen35-dense"),
            dflash("dense-dflash"),
            prompts("qwen35-dense"),
        ),
        (
            target("qwen35-moe"),
            dflash("moe-dflash"),
            prompts("qwen35-moe"),
        ),
        (
            m_demo.clone(),
            d_demo,
            vec![
                chat("What is 486 + 275?"),
                chat("Write a Python function that counts the vowels in a string."),
                chat("What is the capital of Kenya?"),
            ],
        ),
    ];
    for (m, d, prompts) in cases {
        let solo: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| run(&m, Some(d.clone()), greedy(p.clone(), 48), KvFormat::Int8).tokens)
            .collect();
        let mut engine = Engine::new(m.clone())
            .with_prefill_chunk(16)
            .with_draft_every_step(true)
            .with_drafter(d.clone());
        let ids: Vec<_> = prompts
            .iter()
            .map(|p| engine.add(greedy(p.clone(), 48)).unwrap())
            .collect();
        while engine.has_work() {
            engine.step().unwrap();
        }
        for (i, id) in ids.into_iter().enumerate() {
            let seq = engine.take_finished(id).unwrap();
            assert_eq!(
                seq.output(),
                &solo[i][..],
                "{}: sequence {i} changed when verified with others",
                m.dir.display()
            );
        }
    }
}

/// A seeded sampled request gives the same tokens whatever the step times: the engine that
/// chooses each step's verify length by measured speed against one that drafts a full block
/// every step (a seeded sequence draws once per verified row, so lengths chosen by speed would
/// make its text depend on the machine's load).
#[test]
fn a_seeded_sampled_request_does_not_depend_on_step_times() {
    let (m, d) = demo();
    let text =
        "<|im_start|>user\nWrite a short poem about rivers.<|im_end|>\n<|im_start|>assistant\n";
    let req = Request {
        sampling: SamplingParams {
            temperature: 0.8,
            seed: Some(11),
            ..Default::default()
        },
        ..greedy(m.tokenizer.encode(text).unwrap(), 40)
    };
    let run = |every_step: bool| {
        Engine::new(m.clone())
            .with_drafter(d.clone())
            .with_draft_every_step(every_step)
            .generate(req.clone(), |_| {})
            .unwrap()
            .tokens
    };
    assert_eq!(run(false), run(true));
}
