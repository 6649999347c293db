//! `splash pull`: download a Hub model into the Hugging Face cache without serving it.

use anyhow::bail;

use crate::model_arg::{self, ModelRef, Source};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelRef,
}

pub fn run(mut a: Args) -> anyhow::Result<()> {
    a.model.fetch_projector = true;
    let Source::Hub(spec) = model_arg::source(&a.model)? else {
        bail!(
            "`{}` is a local path; `splash pull` takes a Hugging Face repo OWNER/REPO or OWNER/REPO:VARIANT",
            a.model.name()
        );
    };
    let snapshot = model_arg::fetch(&spec, &model_arg::hub_config(&a.model))?;
    let bytes: u64 = snapshot
        .files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "{spec}: commit {} ({} files, {:.1} MiB) in {}",
        snapshot.commit,
        snapshot.files.len(),
        bytes as f64 / (1 << 20) as f64,
        snapshot.dir.display()
    );
    Ok(())
}
