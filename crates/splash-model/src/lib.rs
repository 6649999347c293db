//! Checkpoints, tokenizer, chat template and the model graphs of splash.
//!
//! [`load`] opens a checkpoint (a HF or MLX safetensors directory, or a GGUF file) and returns a
//! [`Model`]: the parsed [`ModelConfig`], the weights of the Qwen3.5 hybrid graph ([`Qwen35`],
//! dense or MoE), the [`Tokenizer`] and the [`ChatTemplate`]. Per-sequence state lives in [`SequenceState`];
//! [`Qwen35::forward`] advances one sequence by any number of tokens.

mod chat_template;
mod checkpoint;
mod config;
mod device;
pub mod dflash;
mod error;
pub mod gguf;
mod graph_cache;
mod image;
mod memory;
mod qwen35;
mod tokenizer;
pub mod vision;

use std::path::{Path, PathBuf};

pub use chat_template::{ChatTemplate, TemplateInputs};
pub use checkpoint::{Checkpoint, Format};
pub use config::{GenerationDefaults, LayerKind, ModelConfig, MoeConfig};
pub use dflash::{DFlashDraft, DraftBlock, DraftConfig, DraftContext, DraftKind};
pub use error::ModelError;
pub use qwen35::gguf::ARCHITECTURES as GGUF_ARCHITECTURES;
pub use qwen35::state::SequenceState;
pub use qwen35::{BatchItem, ImageSpan, Logits, PassOutput, Qwen35};
pub use splash_backend::cpu::KvFormat;
pub use tokenizer::{StreamDecoder, Tokenizer};

/// Everything loaded from one checkpoint.
pub struct Model {
    /// Where the checkpoint was read from (a directory, or the first GGUF file).
    pub dir: PathBuf,
    /// The weights' file format.
    pub format: Format,
    /// Size of the weight files (memory-mapped, not copied).
    pub weight_bytes: u64,
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

/// Loads the checkpoint at `path`: a safetensors directory (config, weights memory-mapped,
/// tokenizer and template), a `.gguf` file (the other parts of a split file are found next to
/// it), or a directory holding the GGUF file(s) of one model.
pub fn load(path: &Path) -> Result<Model, ModelError> {
    if path.is_file() {
        return load_gguf(&gguf_parts(path)?);
    }
    if !path.is_dir() {
        return Err(ModelError::NotADirectory(path.to_path_buf()));
    }
    if !path.join("config.json").exists() {
        if let Some(first) = gguf_in_dir(path)? {
            return load_gguf(&gguf_parts(&first)?);
        }
    }
    let dir = path;
    let config = ModelConfig::from_dir(dir)?;
    let generation = GenerationDefaults::from_dir(dir, &config)?;
    let checkpoint = Checkpoint::open(dir)?;
    let graph = Qwen35::load(&config, &checkpoint)?;
    let tokenizer = Tokenizer::from_dir(dir)?;
    let template = ChatTemplate::from_dir(dir)?;
    Ok(Model {
        dir: dir.to_path_buf(),
        format: Format::Safetensors,
        weight_bytes: checkpoint.file_bytes(),
        config,
        generation,
        graph,
        tokenizer,
        template,
    })
}

/// Loads a GGUF model from its file(s): config, tokenizer and template from the metadata.
fn load_gguf(parts: &[PathBuf]) -> Result<Model, ModelError> {
    let first = &parts[0];
    // The config (and with it the layer count that skips the MTP block) comes from the first
    // header, before the tensors are renamed.
    let mut config = None;
    let (checkpoint, header) = Checkpoint::open_gguf(parts, |h| {
        let mut c = ModelConfig::from_value(first, &qwen35::gguf::config_json(first, h)?)?;
        c.gdn.v_order = splash_backend::cpu::VHeadOrder::Tiled;
        let layers = c.num_layers();
        config = Some(c);
        Ok(move |name: &str, shape: &[usize]| qwen35::gguf::hf_tensor(name, shape, layers))
    })?;
    let mut config = config.expect("set by the plan");
    let tokenizer = Tokenizer::from_gguf(first, &header)?;
    // The text GGUF names no image token; its `mmproj` file's images take Qwen's placeholder.
    config.image_token_id = tokenizer.token_to_id("<|image_pad|>");
    let graph = Qwen35::load(&config, &checkpoint)?;
    let template = match header
        .get("tokenizer.chat_template")
        .and_then(gguf::Value::as_str)
    {
        Some(source) => {
            let mut t = ChatTemplate::new(source.to_string())?;
            for (key, meta) in [
                ("bos_token", "tokenizer.ggml.bos_token_id"),
                ("eos_token", "tokenizer.ggml.eos_token_id"),
                ("pad_token", "tokenizer.ggml.padding_token_id"),
            ] {
                let token = header
                    .get(meta)
                    .and_then(gguf::Value::as_u64)
                    .and_then(|id| tokenizer.id_to_token(id as u32));
                if let Some(token) = token {
                    t.set_special_token(key, &token);
                }
            }
            Some(t)
        }
        None => None,
    };
    let generation = GenerationDefaults::from_gguf(&header, &config);
    Ok(Model {
        dir: first.clone(),
        format: Format::Gguf,
        weight_bytes: checkpoint.file_bytes(),
        config,
        generation,
        graph,
        tokenizer,
        template,
    })
}

/// All parts of the GGUF model whose (first or any) file is `path`: llama.cpp names split
/// files `NAME-00001-of-00003.gguf`.
fn gguf_parts(path: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if !name.ends_with(".gguf") {
        return Err(ModelError::config(
            path,
            "not a checkpoint: --model takes a directory (config.json + *.safetensors, or *.gguf), a .gguf file, or `demo`",
        ));
    }
    let stem = &name[..name.len() - 5];
    let split = stem.rsplit_once("-of-").and_then(|(head, total)| {
        let (base, _) = head.rsplit_once('-')?;
        Some((base, total, total.parse::<usize>().ok()?))
    });
    let Some((base, total_text, total)) = split else {
        return Ok(vec![path.to_path_buf()]);
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    (1..=total)
        .map(|i| {
            let width = total_text.len();
            let part = dir.join(format!("{base}-{i:0width$}-of-{total_text}.gguf"));
            if part.is_file() {
                Ok(part)
            } else {
                Err(ModelError::config(
                    &part,
                    format!("part {i} of {total} of this split GGUF model is missing; download every part"),
                ))
            }
        })
        .collect()
}

/// The vision projector (`mmproj*.gguf`) beside a GGUF model file, or in the folder above
/// (repositories that keep each quantisation in its own folder keep the projector at the
/// top), preferring BF16, then F32, then F16 (by file name), as llama.cpp's repositories name
/// them.
pub fn mmproj_beside(model: &Path) -> Option<PathBuf> {
    let dir = model.parent()?;
    let beside = mmproj_in(dir);
    beside.or_else(|| mmproj_in(dir.parent()?))
}

fn mmproj_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mmproj") && n.ends_with(".gguf"))
        })
        .collect();
    found.sort();
    let rank = |p: &PathBuf| {
        let n = p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_ascii_lowercase();
        ["bf16", "f32", "f16"]
            .iter()
            .position(|k| n.contains(k))
            .unwrap_or(3)
    };
    found.into_iter().min_by_key(rank)
}

/// The (first) GGUF model file in `dir`, ignoring vision projectors (`mmproj*`); an error if
/// the directory holds several different models.
fn gguf_in_dir(dir: &Path) -> Result<Option<PathBuf>, ModelError> {
    let rd = std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))?;
    let mut names: Vec<String> = Vec::new();
    for entry in rd {
        let name = entry.map_err(|e| ModelError::io(dir, e))?.file_name();
        let name = name.to_string_lossy().into_owned();
        if name.ends_with(".gguf") && !name.starts_with("mmproj") {
            names.push(name);
        }
    }
    names.sort();
    // Parts 2..n of a split model belong to part 1.
    names.retain(|n| !n.contains("-of-") || n.contains("-00001-of-"));
    match names.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(dir.join(one))),
        many => Err(ModelError::config(
            dir,
            format!(
                "holds several GGUF models ({}); pass the file you want to --model",
                many.join(", ")
            ),
        )),
    }
}
