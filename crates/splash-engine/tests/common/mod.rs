//! Helpers shared by the engine's integration tests (each test file uses some of them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use splash_engine::{
    DFlashDrafter, DraftSession, Drafter, Proposal, Request, Sampler, SamplingParams,
};
use splash_model::{load, DFlashDraft, Model, ModelError};

/// A path in the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// Fixtures generated at test time: the GGUFs (`gguf("qwen35-moe-gguf/model-Q8_0.gguf")`).
#[path = "../../../../tests/fixtures/derived.rs"]
mod derived;
#[allow(unused_imports)] // each test binary uses some
pub use derived::gguf;

/// A committed fixture under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    repo("tests/fixtures").join(name)
}

/// A greedy request for `max_tokens` tokens that ignores EOS.
pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        grammar: None,
        images: Vec::new(),
    }
}

/// The bundled demo model and its draft, on the CPU.
pub fn demo() -> (Arc<Model>, Arc<dyn Drafter>) {
    let model = Arc::new(load(&repo("models/demo")).unwrap());
    (model, demo_draft(false))
}

/// The demo's draft on the CPU, its matrices quantised to Q4_K on load when `quantize`.
pub fn demo_draft(quantize: bool) -> Arc<dyn Drafter> {
    let mut draft = DFlashDraft::load(&repo("models/demo/draft")).unwrap();
    if quantize {
        assert!(
            draft.quantize_weights() > 0,
            "the demo draft has Q4_K-sized rows"
        );
    }
    Arc::new(DFlashDrafter::new(draft.into()))
}

/// GPU 0, or `None` (the test is skipped) without one unless `SPLASH_REQUIRE_GPU` is set.
#[cfg(feature = "cuda")]
pub fn gpu() -> Option<Arc<splash_backend::cuda::Gpu>> {
    // The SPLASH_* variables choose kernel variants here as for `splash` (SPLASH_FOLD_LAUNCHES...).
    let options = splash_backend::cuda::GpuOptions::from_env().expect("the SPLASH_* variables");
    match splash_backend::cuda::Gpu::with_options(0, options) {
        Ok(g) => Some(g),
        Err(e) => {
            assert!(
                std::env::var_os("SPLASH_REQUIRE_GPU").is_none(),
                "SPLASH_REQUIRE_GPU is set but no GPU is usable: {e}"
            );
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// The target at repository path `target` (or an absolute path) on `gpu`, and the draft at
/// `draft` there too.
#[cfg(feature = "cuda")]
pub fn on_gpu(
    gpu: &Arc<splash_backend::cuda::Gpu>,
    target: &str,
    draft: &str,
) -> (Arc<Model>, Arc<dyn Drafter>) {
    on_gpu_with(gpu, target, draft, false)
}

/// [`on_gpu`], the draft's matrices quantised to Q4_K on load when `quantize`.
#[cfg(feature = "cuda")]
pub fn on_gpu_with(
    gpu: &Arc<splash_backend::cuda::Gpu>,
    target: &str,
    draft: &str,
    quantize: bool,
) -> (Arc<Model>, Arc<dyn Drafter>) {
    let mut m = load(&repo(target)).unwrap();
    m.graph.to_gpu(gpu.clone()).unwrap();
    let mut d = DFlashDraft::load(&repo(draft)).unwrap();
    if quantize {
        assert!(d.quantize_weights() > 0, "{draft}: nothing to quantise");
    }
    d.to_gpu(&m.graph).unwrap();
    (Arc::new(m), Arc::new(DFlashDrafter::new(Arc::new(d))))
}

/// Proposes the known greedy continuation of each prompt, with a slot replaced by a wrong
/// token at pseudo-random places when `error_every` is set.
pub struct Oracle {
    pub sequences: Vec<Vec<u32>>,
    pub block: usize,
    pub error_every: Option<u64>,
}

struct OracleSession {
    sequences: Vec<Vec<u32>>,
    error_every: Option<u64>,
    calls: u64,
}

impl Drafter for Oracle {
    fn block_size(&self) -> usize {
        self.block
    }
    fn tap_layers(&self) -> &[usize] {
        &[]
    }
    fn session(&self) -> Box<dyn DraftSession> {
        Box::new(OracleSession {
            sequences: self.sequences.clone(),
            error_every: self.error_every,
            calls: 0,
        })
    }
}

impl DraftSession for OracleSession {
    fn commit(&mut self, features: &[f32]) -> Result<(), ModelError> {
        assert!(features.is_empty(), "the oracle asked for no taps");
        Ok(())
    }
    fn propose(
        &mut self,
        _: &Model,
        history: &[u32],
        len: usize,
        _: &mut Sampler,
    ) -> Result<Proposal, ModelError> {
        let known = self
            .sequences
            .iter()
            .find(|s| s.len() >= history.len() && s[..history.len()] == *history)
            .unwrap_or_else(|| {
                let best = self
                    .sequences
                    .iter()
                    .map(|s| s.iter().zip(history).take_while(|(a, b)| a == b).count())
                    .max();
                panic!(
                    "the oracle does not know this history of {} tokens (longest match {best:?})",
                    history.len()
                )
            });
        let mut tokens: Vec<u32> = (0..len)
            .map(|i| known.get(history.len() + i).copied().unwrap_or(0))
            .collect();
        if let Some(every) = self.error_every {
            self.calls += 1;
            // Slot (calls · 7) mod every gets a wrong token when it falls inside the block.
            let slot = ((self.calls * 7) % every) as usize;
            if slot < len {
                tokens[slot] = (tokens[slot] + 1) % 500;
            }
        }
        Ok(Proposal {
            tokens,
            q: Vec::new(),
        })
    }
}
