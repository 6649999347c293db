//! The one error type of the model layer: every variant names the file, tensor or field.

use std::path::PathBuf;

use splash_backend::WeightError;

/// What went wrong while loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("{0} is not a directory: --model takes a checkpoint directory (config.json, *.safetensors, tokenizer.json) or `demo`")]
    NotADirectory(PathBuf),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("GPU: {0}")]
    Gpu(String),
    /// A state or draft context made for one device was handed to another.
    #[error("a sequence state or draft context made for another device or model was given to the {0} model; make states and contexts with the model that runs them")]
    WrongDevice(String),
    #[error("{path}: not a valid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor `{name}` is missing from the checkpoint in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    #[error("tensor `{name}` ({file}): {source}")]
    TensorLayout {
        name: String,
        file: PathBuf,
        source: WeightError,
    },
    #[error("tensor `{name}` ({file}) has dtype {dtype}; splash reads F32, F16 and BF16 here")]
    TensorDtype {
        name: String,
        file: PathBuf,
        dtype: String,
    },
    #[error("tokenizer {path}: {message}")]
    Tokenizer { path: PathBuf, message: String },
    #[error("chat template: {0}")]
    Template(String),
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("image input: {0}")]
    Image(String),
    #[error("saved state image: {0}")]
    StateImage(String),
    #[error("position {needed} is beyond the model's context limit of {limit} tokens")]
    ContextOverflow { needed: usize, limit: usize },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Config {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Reads and parses a JSON file, naming it in errors.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}
