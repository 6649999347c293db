//! Image prompts through the engine (the vision-language fixture `qwen35-vl-tied`, whose model
//! matches transformers on them in splash-model's `vision_prompts` test): prefill chunks cut
//! inside images, the prefix cache keyed by image digests (the same picture resumes, another
//! one does not), preemption, and the checks on a request's images.

use std::sync::Arc;

use safetensors::SafeTensors;
use splash_engine::{DFlashDrafter, Drafter, Engine, EngineError, PromptImage, Request};
use splash_model::{load, BatchItem, DFlashDraft, ImageSpan, Logits, Model};

mod common;
use common::{fixture, greedy, Oracle};

const IMAGE_PAD: u32 = 514;
const TOKENS: usize = 12;

fn model() -> Arc<Model> {
    Arc::new(load(&fixture("qwen35-vl-tied")).unwrap())
}

/// The fixture's "interleaved" prompt: an image of 2×4 merged rows, text, one of 3×2.
fn prompt() -> Vec<u32> {
    let bytes = std::fs::read(fixture("qwen35-vl-tied").join("reference.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    st.tensor("interleaved.ids")
        .unwrap()
        .data()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect()
}

/// Images over the placeholder runs of `prompt` (grids in order), with embeddings drawn from
/// `seed`: the engine's behaviour does not depend on where the rows came from.
fn images(model: &Model, prompt: &[u32], grids: &[(usize, usize)], seed: u32) -> Vec<PromptImage> {
    let hidden = model.config.hidden_size;
    let mut from = 0;
    grids
        .iter()
        .enumerate()
        .map(|(k, &grid)| {
            let start = from + prompt[from..].iter().position(|&t| t == IMAGE_PAD).unwrap();
            let n = grid.0 * grid.1;
            from = start + n;
            let values: Vec<f32> = (0..n * hidden)
                .map(|i| {
                    let x = (i as u32).wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503);
                    (x % 2001) as f32 / 1000.0 - 1.0
                })
                .collect();
            let mut digest = [0u8; 32];
            digest[..4].copy_from_slice(&seed.to_le_bytes());
            digest[4] = k as u8;
            PromptImage {
                span: ImageSpan {
                    start,
                    grid,
                    embeddings: Arc::from(values),
                },
                digest,
            }
        })
        .collect()
}

const GRIDS: [(usize, usize); 2] = [(2, 4), (3, 2)];

fn request(prompt: &[u32], images: Vec<PromptImage>) -> Request {
    Request {
        images,
        ..greedy(prompt.to_vec(), TOKENS)
    }
}

/// Greedy tokens straight from the model: one prefill with the images, then a token a pass.
fn reference(model: &Model, prompt: &[u32], images: &[PromptImage]) -> Vec<u32> {
    let spans: Vec<ImageSpan> = images.iter().map(|i| i.span.clone()).collect();
    let mut state = model.graph.new_state();
    let mut item = [BatchItem {
        state: &mut state,
        tokens: prompt,
        images: &spans,
    }];
    let mut logits = model
        .graph
        .forward_batch(&mut item, Logits::Last, &[])
        .unwrap()
        .remove(0)
        .logits;
    let mut out = Vec::new();
    while out.len() < TOKENS {
        let next =
            (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b }) as u32;
        out.push(next);
        logits = model
            .graph
            .forward(&mut state, &[next], Logits::Last)
            .unwrap();
    }
    out
}

#[test]
fn chunks_cut_inside_images_decode_what_one_prefill_does() {
    let model = model();
    let prompt = prompt();
    let images = images(&model, &prompt, &GRIDS, 1);
    let want = reference(&model, &prompt, &images);
    for chunk in [3, 5, 64] {
        let mut engine = Engine::new(model.clone()).with_prefill_chunk(chunk);
        let got = engine
            .generate(request(&prompt, images.clone()), |_| {})
            .unwrap();
        assert_eq!(got.tokens, want, "prefill chunks of {chunk}");
    }
    // Without the images the same tokens run as plain embeddings: another output.
    let text_only = reference(&model, &prompt, &[]);
    assert_ne!(text_only, want, "the images made no difference");
}

#[test]
fn the_prefix_cache_resumes_the_same_picture_and_not_another() {
    let model = model();
    let prompt = prompt();
    let first = images(&model, &prompt, &GRIDS, 1);
    let other = images(&model, &prompt, &GRIDS, 2);
    // `<|im_start|>` starts the only turn: keep a state inside the prompt too.
    let mut engine = Engine::new(model.clone())
        .with_prefix_cache(64 << 20)
        .with_prefill_chunk(7);
    let a = engine
        .generate(request(&prompt, first.clone()), |_| {})
        .unwrap();
    assert_eq!(a.tokens, reference(&model, &prompt, &first));
    let again = engine
        .generate(request(&prompt, first.clone()), |_| {})
        .unwrap();
    assert_eq!(again.tokens, a.tokens);
    assert!(
        again.cached_tokens > first[1].span.end(),
        "the same images resumed only {} tokens",
        again.cached_tokens
    );
    let b = engine
        .generate(request(&prompt, other.clone()), |_| {})
        .unwrap();
    assert_eq!(
        b.tokens,
        reference(&model, &prompt, &other),
        "another picture"
    );
    assert!(
        b.cached_tokens <= first[0].span.start,
        "another picture resumed {} tokens, past the first image's start {}",
        b.cached_tokens,
        first[0].span.start
    );
    // The second picture changed only: the cache may resume up to it.
    let mut mixed = first.clone();
    mixed[1] = other[1].clone();
    let c = engine
        .generate(request(&prompt, mixed.clone()), |_| {})
        .unwrap();
    assert_eq!(c.tokens, reference(&model, &prompt, &mixed));
    assert!(c.cached_tokens <= mixed[1].span.start);
}

#[test]
fn preempted_image_prompts_resume_exactly() {
    let model = model();
    let prompt = prompt();
    let sets: Vec<Vec<PromptImage>> = (1..=3)
        .map(|s| images(&model, &prompt, &GRIDS, s))
        .collect();
    let want: Vec<Vec<u32>> = sets.iter().map(|i| reference(&model, &prompt, i)).collect();
    for cache in [0, 64 << 20] {
        let mut engine = Engine::new(model.clone())
            .with_prefill_chunk(8)
            .with_prefix_cache(cache)
            .with_kv_budget(2 * (prompt.len() + TOKENS));
        let ids: Vec<_> = sets
            .iter()
            .map(|i| engine.add(request(&prompt, i.clone())).unwrap())
            .collect();
        let mut most_parked = 0;
        while engine.has_work() {
            engine.step().unwrap();
            most_parked = most_parked.max(engine.num_parked());
        }
        assert!(most_parked > 0, "the budget never forced a preemption");
        for (k, id) in ids.into_iter().enumerate() {
            let seq = engine.take_finished(id).unwrap();
            assert_eq!(seq.output(), &want[k][..], "request {k}, cache {cache}");
        }
    }
}

#[test]
fn images_that_do_not_fit_the_prompt_are_refused() {
    let model = model();
    let prompt = prompt();
    let good = images(&model, &prompt, &GRIDS, 1);
    let mut engine = Engine::new(model.clone());
    let refused = |engine: &mut Engine, images: Vec<PromptImage>, what: &str| match engine
        .add(request(&prompt, images))
    {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("image"), "{what}: {m}"),
        other => panic!("{what}: {other:?}"),
    };
    let mut moved = good.clone();
    moved[0].span.start -= 1;
    refused(&mut engine, moved, "over a non-placeholder token");
    refused(
        &mut engine,
        vec![good[1].clone(), good[0].clone()],
        "out of order",
    );
    let mut short = good.clone();
    short[0].span.embeddings = Arc::from(&short[0].span.embeddings[1..]);
    refused(&mut engine, short, "too few embedding values");
    let mut past = good.clone();
    past[1].span.grid = (30, 30);
    refused(&mut engine, past, "past the prompt's end");
    // A text-only model takes no images.
    let demo = Arc::new(load(&common::repo("models/demo")).unwrap());
    let mut engine = Engine::new(demo);
    let e = engine.add(request(&prompt, good)).unwrap_err();
    assert!(e.to_string().contains("takes no images"), "{e}");
}

/// Speculation on an image prompt stays lossless: with a draft that proposes the right
/// continuation but errs at pseudo-random slots (partial acceptance, rollback after rows whose
/// rotary position is behind their cache row), and with a random DFlash draft (its 1-D
/// positions know nothing of the image), greedy output is the output without a draft.
#[test]
fn speculation_on_an_image_prompt_is_lossless() {
    const LONG: usize = 48;
    let model = model();
    let prompt = prompt();
    let images = images(&model, &prompt, &GRIDS, 1);
    let req = || Request {
        images: images.clone(),
        ..greedy(prompt.clone(), LONG)
    };
    let engine = |d: Option<Arc<dyn Drafter>>| {
        let e = Engine::new(model.clone())
            .with_prefill_chunk(16)
            .with_draft_every_step(true);
        match d {
            Some(d) => e.with_drafter(d),
            None => e,
        }
    };
    let plain = engine(None).generate(req(), |_| {}).unwrap().tokens;
    let sequence: Vec<u32> = prompt.iter().chain(&plain).copied().collect();
    // The dense DFlash fixture's draft fits this target but for the vocabulary's size (512
    // against 516; it shares the target's embeddings and head): a copy that says 516.
    let dir = std::env::temp_dir().join(format!("splash-vl-draft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture("dflash/dense-dflash");
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = 516.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let random: Arc<dyn Drafter> = Arc::new(DFlashDrafter::new(Arc::new(
        DFlashDraft::load(&dir).unwrap(),
    )));
    std::fs::remove_dir_all(&dir).unwrap();
    for (name, drafter, some_accepted) in [
        (
            "oracle with errors",
            Arc::new(Oracle {
                sequences: vec![sequence],
                block: 8,
                error_every: Some(5),
            }) as Arc<dyn Drafter>,
            true,
        ),
        ("random DFlash", random, false),
    ] {
        let got = engine(Some(drafter)).generate(req(), |_| {}).unwrap();
        assert_eq!(got.tokens, plain, "{name}: not lossless");
        let st = got.speculation.unwrap();
        assert!(st.target_passes > 0 && st.drafted > 0, "{name}: {st:?}");
        if some_accepted {
            assert!(
                st.accepted > 0 && st.accepted < st.drafted,
                "{name}: {st:?}"
            );
        }
    }
}
