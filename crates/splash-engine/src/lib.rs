//! The generation engine of splash: sequences, sampling, stop rules and the step loop.
//!
//! An [`Engine`] owns a loaded model and any number of [`Sequence`]s. [`Engine::step`]
//! advances every running sequence by one unit of work — a prefill chunk or one decoded
//! token — and returns the text each produced; [`Engine::generate`] runs one request to the
//! end. [`perplexity`] scores a token stream teacher-forced. A request may carry a
//! [`GrammarRequest`]: its output is then constrained token by token (llguidance).

mod engine;
mod grammar;
mod memory_plan;
mod perplexity;
mod prefix_cache;
mod request;
mod sampling;
mod sequence;
mod speculative;
mod stop;

pub use engine::{prefill_chunk_for, BatchStats, Engine};
pub use grammar::{
    with_json_layout, Constraint, GrammarFactory, GrammarRequest, GrammarState, GrammarTables,
};
pub use memory_plan::{MemoryPlan, PlanError, PlanInputs};
pub use perplexity::{perplexity, Baseline, Perplexity, PerplexityOptions};
pub use prefix_cache::{free_disk_bytes, DiskCacheConfig, DiskCacheStats, PrefixCacheStats};
pub use request::{
    Completion, EngineError, Event, FinishReason, PromptImage, Request, ScoreRequest, SeqId,
};
pub use sampling::{random_seed, Distribution, Sampler, SamplingParams, GREEDY_TEMPERATURE};
pub use sequence::Sequence;
pub use speculative::{
    accept_greedy, accept_sampled, verify_lengths, Accepted, DFlashDrafter, DraftMemory,
    DraftSession, Drafter, Proposal, SpecStats,
};
pub use stop::StopMatcher;
