//! `--model`: `demo`, a local checkpoint (directory or `.gguf` file), or a Hugging Face Hub
//! repository `OWNER/REPO[:VARIANT]`, downloaded into the standard HF cache on first use.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use splash_hub::{HubConfig, HubSpec, Probe, Snapshot};
use splash_model::Model;

/// The model a command names, as `--model MODEL` or as its first argument (`splash pull
/// Qwen/Qwen3.6-27B`, as Ollama and `hf download` users type it).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelRef {
    /// `demo`, a checkpoint directory, a .gguf file, or a Hugging Face repo OWNER/REPO
    /// (safetensors) or OWNER/REPO:VARIANT (a GGUF quantisation such as UD-Q4_K_M).
    #[arg(
        long = "model",
        value_name = "MODEL",
        required_unless_present = "model_arg",
        conflicts_with = "model_arg"
    )]
    model_flag: Option<String>,
    /// The model, as --model takes it.
    #[arg(value_name = "MODEL", id = "model_arg")]
    model_arg: Option<String>,
    /// Hub revision: branch, tag or commit.
    #[arg(long, default_value = splash_hub::DEFAULT_REVISION)]
    pub revision: String,
    /// Use only what is in the Hugging Face cache (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    pub offline: bool,
    /// Also fetch a GGUF repository's vision projector (`serve` unless --language-only,
    /// `pull`).
    #[arg(skip)]
    pub fetch_projector: bool,
}

impl ModelRef {
    /// The model as the user named it.
    pub fn name(&self) -> &str {
        // clap requires exactly one of the two.
        self.model_flag
            .as_deref()
            .or(self.model_arg.as_deref())
            .unwrap_or_default()
    }
}

/// The flags of every command that loads a model: which one, and where it runs.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    pub model: ModelRef,
    /// Where the model runs: cuda (GPU 0), cpu, or auto (cuda when a usable GPU is found).
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
    pub device: String,
}

impl std::ops::Deref for ModelArgs {
    type Target = ModelRef;
    fn deref(&self) -> &ModelRef {
        &self.model
    }
}

/// Where a `--model` value points.
pub enum Source {
    Local(PathBuf),
    Hub(HubSpec),
}

/// Tells a local path from a Hub repository name.
pub fn source(args: &ModelRef) -> anyhow::Result<Source> {
    let arg = args.name();
    if arg == "demo" {
        if let Some(dir) = std::env::var_os("SPLASH_DEMO_DIR") {
            return Ok(Source::Local(PathBuf::from(dir)));
        }
        return Ok(Source::Local(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/demo"
        ))));
    }
    let path = Path::new(arg);
    let looks_local = path.is_absolute() || arg.starts_with('.') || arg.starts_with('~');
    if path.exists() {
        return Ok(Source::Local(path.to_path_buf()));
    }
    if looks_local || arg.matches('/').count() != 1 {
        bail!(
            "`{arg}` does not exist: --model takes `demo`, a checkpoint directory, a .gguf file, \
             or a Hugging Face repo OWNER/REPO[:VARIANT]"
        );
    }
    let spec = HubSpec::parse(arg)
        .and_then(|s| s.with_revision(&args.revision))
        .with_context(|| format!("`{arg}` is neither a local path nor a Hugging Face repo name"))?;
    Ok(Source::Hub(spec))
}

/// The cache settings from the environment, with `--offline`.
pub fn hub_config(args: &ModelRef) -> HubConfig {
    let mut config = HubConfig::from_env();
    config.offline |= args.offline;
    config.projector = args.fetch_projector;
    config
}

/// Accepts what splash can serve, from `config.json` or the start of a GGUF file, so that an
/// unsupported model is refused before its weights are downloaded.
fn probe(p: &Probe) -> Result<(), String> {
    match p {
        Probe::Config { bytes, .. } => {
            let v: serde_json::Value = serde_json::from_slice(bytes)
                .map_err(|e| format!("config.json is not valid JSON: {e}"))?;
            splash_model::ModelConfig::from_value(Path::new("config.json"), &v)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        Probe::Gguf { prefix, path, .. } => {
            match splash_model::gguf::architecture_from_prefix(prefix) {
                Ok(Some(arch)) if splash_model::GGUF_ARCHITECTURES.contains(&arch.as_str()) => {
                    Ok(())
                }
                Ok(Some(arch)) => Err(format!(
                    "{path} is a `{arch}` model; splash serves the Qwen3.5/3.6 hybrid models (GGUF architectures {})",
                    splash_model::GGUF_ARCHITECTURES.join(", ")
                )),
                // Metadata longer than the probe: the full header is checked at load.
                Ok(None) => Ok(()),
                Err(e) => Err(format!("{path}: {e}")),
            }
        }
        _ => Ok(()),
    }
}

/// Downloads (or finds in the cache) the snapshot of a Hub model.
pub fn fetch(spec: &HubSpec, config: &HubConfig) -> anyhow::Result<Snapshot> {
    let snapshot = splash_hub::resolve(spec, config, &probe)?;
    if snapshot.offline {
        tracing::warn!(
            "using the cached snapshot {} of {spec} without checking the Hub",
            snapshot.commit
        );
    }
    Ok(snapshot)
}

/// The local checkpoint `args` names, downloading a Hub model first if needed.
pub fn resolve(args: &ModelRef) -> anyhow::Result<PathBuf> {
    match source(args)? {
        Source::Local(path) => Ok(path),
        Source::Hub(spec) => {
            let snapshot = fetch(&spec, &hub_config(args))?;
            Ok(match snapshot.format {
                splash_hub::ModelFormat::Gguf { .. } => match snapshot.files.first() {
                    Some(first) => first.clone(),
                    None => bail!("{spec}: the snapshot lists no GGUF file"),
                },
                _ => snapshot.dir,
            })
        }
    }
}

/// Loads the model `args` name, saying what was loaded on stderr.
pub fn load(args: &ModelArgs) -> anyhow::Result<Arc<Model>> {
    let path = resolve(args)?;
    let t0 = Instant::now();
    let mut model = splash_model::load(&path).with_context(|| {
        format!(
            "cannot load model `{}` from {}",
            args.name(),
            path.display()
        )
    })?;
    place(&mut model, &args.device)?;
    tracing::info!(
        "loaded {} ({} parameters, {} layers) in {:.2}s",
        path.display(),
        model.graph.num_parameters(),
        model.config.num_layers(),
        t0.elapsed().as_secs_f64()
    );
    Ok(Arc::new(model))
}

/// Moves the model to the device `--device` asks for (`auto`: the GPU when one is usable and
/// holds every weight format, else the CPU, saying why).
#[cfg(feature = "cuda")]
fn place(model: &mut Model, device: &str) -> anyhow::Result<()> {
    if device == "cpu" {
        return Ok(());
    }
    // The backend's measurement options come from SPLASH_* variables, checked here once.
    let options =
        splash_backend::cuda::GpuOptions::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    let gpu = match splash_backend::cuda::Gpu::with_options(0, options) {
        Ok(gpu) => gpu,
        Err(e) if device == "auto" => {
            tracing::info!("running on the CPU: {e}");
            return Ok(());
        }
        Err(e) => bail!("--device cuda: {e}"),
    };
    match model.graph.to_gpu(gpu) {
        Ok(()) => Ok(()),
        Err(e) if device == "auto" => {
            tracing::warn!("running on the CPU: the model cannot run on the GPU: {e}");
            Ok(())
        }
        Err(e) => Err(e).context("--device cuda"),
    }
}

/// Without the `cuda` feature everything runs on the CPU.
#[cfg(not(feature = "cuda"))]
fn place(_model: &mut Model, device: &str) -> anyhow::Result<()> {
    if device == "cuda" {
        bail!("--device cuda: this splash was built without CUDA support; build it with `cargo build --release --features cuda`");
    }
    Ok(())
}
