//! `--model`: a checkpoint directory, or `demo` for the bundled demo checkpoint.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use splash_model::Model;

/// The checkpoint directory `arg` names.
pub fn resolve(arg: &str) -> PathBuf {
    if arg == "demo" {
        if let Some(dir) = std::env::var_os("SPLASH_DEMO_DIR") {
            return PathBuf::from(dir);
        }
        return PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/demo"));
    }
    PathBuf::from(arg)
}

/// Loads the model `arg` names, saying what was loaded on stderr.
pub fn load(arg: &str) -> anyhow::Result<Arc<Model>> {
    let dir = resolve(arg);
    let t0 = Instant::now();
    let model = splash_model::load(&dir)
        .with_context(|| format!("cannot load model `{arg}` from {}", dir.display()))?;
    tracing::info!(
        "loaded {} ({} parameters, {} layers) in {:.2}s",
        dir.display(),
        model.graph.num_parameters(),
        model.config.num_layers(),
        t0.elapsed().as_secs_f64()
    );
    Ok(Arc::new(model))
}
