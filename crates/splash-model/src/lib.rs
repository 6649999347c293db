//! Checkpoints, tokenizer, chat template and the model graphs of splash.
//!
//! [`load`] opens a checkpoint directory (HF safetensors layout) and returns a [`Model`]: the
//! parsed [`ModelConfig`], the weights of the Qwen3.5 hybrid graph ([`Qwen35`], dense or MoE),
//! the [`Tokenizer`] and the [`ChatTemplate`]. Per-sequence state lives in [`SequenceState`];
//! [`Qwen35::forward`] advances one sequence by any number of tokens.

mod chat_template;
mod checkpoint;
mod config;
mod error;
mod qwen35;
mod state;
mod tokenizer;

use std::path::{Path, PathBuf};

pub use chat_template::{ChatTemplate, TemplateInputs};
pub use checkpoint::Checkpoint;
pub use config::{GenerationDefaults, LayerKind, ModelConfig, MoeConfig};
pub use error::ModelError;
pub use qwen35::{Logits, Qwen35};
pub use splash_backend::cpu::KvFormat;
pub use state::SequenceState;
pub use tokenizer::{StreamDecoder, Tokenizer};

/// Everything loaded from one checkpoint directory.
pub struct Model {
    /// Where the checkpoint was read from.
    pub dir: PathBuf,
    /// Architecture hyper-parameters.
    pub config: ModelConfig,
    /// Sampling defaults and stop tokens from `generation_config.json` / `config.json`.
    pub generation: GenerationDefaults,
    /// The model graph with its weights.
    pub graph: Qwen35,
    /// The checkpoint's tokenizer.
    pub tokenizer: Tokenizer,
    /// The checkpoint's chat template, when it has one.
    pub template: Option<ChatTemplate>,
}

/// Loads the checkpoint in `dir`: config, weights (memory-mapped), tokenizer and template.
pub fn load(dir: &Path) -> Result<Model, ModelError> {
    if !dir.is_dir() {
        return Err(ModelError::NotADirectory(dir.to_path_buf()));
    }
    let config = ModelConfig::from_dir(dir)?;
    let generation = GenerationDefaults::from_dir(dir, &config)?;
    let checkpoint = Checkpoint::open(dir)?;
    let graph = Qwen35::load(&config, &checkpoint)?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let template = ChatTemplate::from_dir(dir)?;
    Ok(Model {
        dir: dir.to_path_buf(),
        config,
        generation,
        graph,
        tokenizer,
        template,
    })
}
