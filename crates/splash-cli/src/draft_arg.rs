//! `--draft-model` and `--speculative`: the DFlash draft that speculative decoding runs with.
//! Without `--draft-model`, a checkpoint directory with a `draft/` subdirectory (the bundled
//! demo) uses that draft, a target whose name is in [`KNOWN_DRAFTS`] gets its published
//! draft (from the Hub cache, or downloaded), and any other target decodes without one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use splash_engine::{DFlashDrafter, Drafter};
use splash_hub::{HubSpec, Probe};
use splash_model::{DFlashDraft, DraftConfig, Model};

use crate::model_arg::{self, ModelArgs};

/// The flags that choose the draft.
#[derive(clap::Args, Clone, Debug)]
pub struct DraftArgs {
    /// DFlash / DFlash2 draft: a directory or a Hugging Face repo OWNER/REPO. Default: the
    /// known draft of the target (see the README), if any.
    #[arg(long)]
    pub draft_model: Option<String>,
    /// Speculative decoding with the draft: on (whenever a draft is available; each sequence
    /// verifies as much of a drafted block as pays, or none), always (a full block every
    /// step), or off. `always` and `off` are for measurement.
    #[arg(long, default_value = "on", value_parser = ["on", "off", "always"])]
    pub speculative: String,
    /// The draft's matrices as held: q4_k (quantised on load, as the published BF16 drafts
    /// are: 28 % of the bytes each drafted block reads), stored (as in the checkpoint),
    /// or auto: q4_k when the target runs on a GPU and the draft holds 64 MiB or more, else
    /// stored.
    #[arg(long, default_value = "auto", value_parser = ["auto", "q4_k", "stored"])]
    pub draft_weights: String,
}

impl DraftArgs {
    /// `--speculative always`: draft a full block at every step.
    pub fn every_step(&self) -> bool {
        self.speculative == "always"
    }

    /// Whether a draft of `bytes` for a target on `device` is quantised on load. A small draft
    /// stays as stored: its reads are a sliver of a step, and quantising them only risks
    /// acceptance (the demo's draft loses up to 45 % of it in Q4_K on some prompts).
    fn quantize_on(&self, device: &str, bytes: u64) -> bool {
        match self.draft_weights.as_str() {
            "q4_k" => true,
            "stored" => false,
            _ => device != "cpu" && bytes >= SMALL_DRAFT_BYTES,
        }
    }
}

/// Below this many bytes of weights, `--draft-weights auto` keeps a draft as stored.
const SMALL_DRAFT_BYTES: u64 = 64 << 20;

/// Targets (matched in the model's name, case-insensitively) and their published drafts
/// (model-spec §4.4).
pub const KNOWN_DRAFTS: &[(&str, &str)] = &[
    ("qwen3.8-27b", "z-lab/Qwen3.8-27B-DFlash2"),
    ("qwen3.6-35b-a3b", "incoai/Qwen3.6-35B-A3B-DFlash2"),
    ("qwen3.6-27b", "z-lab/Qwen3.6-27B-DFlash"),
];

/// The subdirectory of a checkpoint that holds its own draft.
pub const BUNDLED_DRAFT: &str = "draft";

/// The published draft of a target named `name` (a repo id or a path).
pub fn known_draft(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    KNOWN_DRAFTS
        .iter()
        .find(|(key, _)| name.contains(key))
        .map(|(_, draft)| *draft)
}

/// Loads the draft for `model` (named by `target`), checked against it. `None` when
/// speculation is off, or when no draft was asked for and none is known or reachable.
pub fn load(
    args: &DraftArgs,
    target: &ModelArgs,
    model: &Model,
) -> anyhow::Result<Option<Arc<dyn Drafter>>> {
    Ok(load_dflash(args, target, model)?
        .map(|d| Arc::new(DFlashDrafter::new(d)) as Arc<dyn Drafter>))
}

/// [`load`], returning the draft model itself.
pub fn load_dflash(
    args: &DraftArgs,
    target: &ModelArgs,
    model: &Model,
) -> anyhow::Result<Option<Arc<DFlashDraft>>> {
    if args.speculative == "off" {
        return Ok(None);
    }
    let (name, explicit) = match &args.draft_model {
        Some(d) => (d.clone(), true),
        None => {
            let bundled = model.dir.join(BUNDLED_DRAFT);
            let target_name = format!("{} {}", target.name(), model.dir.display());
            if bundled.join("config.json").is_file() {
                (bundled.display().to_string(), false)
            } else if let Some(d) = known_draft(&target_name) {
                (d.to_string(), false)
            } else {
                return Ok(None);
            }
        }
    };
    let dir = match resolve(&name, target) {
        Ok(dir) => dir,
        Err(e) if !explicit => {
            tracing::warn!(
                "no speculative decoding: the draft {name} of this model is not available: {e:#}"
            );
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let loaded = DFlashDraft::load(&dir)
        .with_context(|| format!("cannot load the draft `{name}`"))
        .and_then(|d| {
            d.config()
                .check(&model.config)
                .with_context(|| format!("--draft-model {name}"))?;
            Ok(d)
        })
        .map(|mut d| {
            let quantized = if args.quantize_on(&model.graph.device(), d.memory().0) {
                d.quantize_weights()
            } else {
                0
            };
            (d, quantized)
        });
    let (draft, quantized) = match loaded.and_then(|(d, n)| Ok((on_target_device(d, model)?, n))) {
        Ok(d) => d,
        Err(e) if !explicit => {
            tracing::warn!("no speculative decoding: the known draft {name} of this model cannot be used: {e:#}");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let c = draft.config();
    eprintln!(
        "speculative decoding: draft {name} ({:?} on {}, {} layers, block {}, taps {:?}, {})",
        c.kind,
        draft.device(),
        c.windows.len(),
        c.block_size,
        c.target_layer_ids,
        match quantized {
            0 => "weights as stored".to_string(),
            n => format!("{n} matrices quantised to Q4_K"),
        }
    );
    Ok(Some(Arc::new(draft)))
}

/// The draft on the device its target runs on (a GPU target reads its taps there and
/// scores the drafted block with its own head).
fn on_target_device(draft: DFlashDraft, model: &Model) -> anyhow::Result<DFlashDraft> {
    if model.graph.device() == "cpu" {
        return Ok(draft);
    }
    #[cfg(feature = "cuda")]
    {
        let mut draft = draft;
        draft
            .to_gpu(&model.graph)
            .context("the draft cannot run on the target's GPU; use --speculative off")?;
        Ok(draft)
    }
    #[cfg(not(feature = "cuda"))]
    unreachable!("a model runs on a GPU only in a build with the cuda feature")
}

/// A local draft directory, or a Hub repo fetched into the cache (config.json checked first).
fn resolve(name: &str, target: &ModelArgs) -> anyhow::Result<PathBuf> {
    let path = Path::new(name);
    if path.is_dir() {
        return Ok(path.to_path_buf());
    }
    if path.is_absolute() || name.starts_with('.') || name.matches('/').count() != 1 {
        bail!("`{name}` does not exist: --draft-model takes a draft directory or a Hugging Face repo OWNER/REPO");
    }
    let spec = HubSpec::parse(name).with_context(|| {
        format!("`{name}` is neither a local path nor a Hugging Face repo name")
    })?;
    let snapshot = splash_hub::resolve(
        &spec,
        &model_arg::hub_config(target),
        &|p: &Probe| match p {
            Probe::Config { bytes, .. } => {
                let v: serde_json::Value = serde_json::from_slice(bytes)
                    .map_err(|e| format!("config.json is not valid JSON: {e}"))?;
                DraftConfig::from_value(Path::new("config.json"), &v)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            _ => Err("a draft is a safetensors checkpoint, not a GGUF file".to_string()),
        },
    )?;
    Ok(snapshot.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_targets_pair_with_their_drafts() {
        assert_eq!(
            known_draft("Qwen/Qwen3.8-27B"),
            Some("z-lab/Qwen3.8-27B-DFlash2")
        );
        assert_eq!(
            known_draft("unsloth/Qwen3.6-35B-A3B-GGUF:UD-Q4_K_M"),
            Some("incoai/Qwen3.6-35B-A3B-DFlash2")
        );
        assert_eq!(
            known_draft("/hub/models--mlx-community--Qwen3.6-27B-4bit/snapshots/abc"),
            Some("z-lab/Qwen3.6-27B-DFlash")
        );
        assert_eq!(known_draft("demo"), None);
    }

    #[test]
    fn auto_quantises_only_large_drafts_on_a_gpu() {
        let args = |w: &str| DraftArgs {
            draft_model: None,
            speculative: "on".into(),
            draft_weights: w.into(),
        };
        let big = 2 << 30;
        assert!(args("auto").quantize_on("cuda:0", big));
        assert!(!args("auto").quantize_on("cuda:0", 3 << 20));
        assert!(!args("auto").quantize_on("cpu", big));
        assert!(args("q4_k").quantize_on("cpu", 3 << 20));
        assert!(!args("stored").quantize_on("cuda:0", big));
    }
}
