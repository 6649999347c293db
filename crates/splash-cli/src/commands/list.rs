//! `splash list`: the models in the Hugging Face cache, with their revisions and sizes.

use splash_hub::HubConfig;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_: Args) -> anyhow::Result<()> {
    let config = HubConfig::from_env();
    let repos = splash_hub::list_cache(&config)?;
    if repos.is_empty() {
        println!("no models in {}", config.cache_dir.display());
        return Ok(());
    }
    println!("{:<56} {:>10}  revisions", "MODEL", "SIZE");
    for r in &repos {
        let revisions: Vec<String> = r
            .snapshots
            .iter()
            .map(|s| {
                let short = &s.commit[..s.commit.len().min(10)];
                match s.refs.as_slice() {
                    [] => short.to_string(),
                    refs => format!("{short} ({})", refs.join(", ")),
                }
            })
            .collect();
        let mut size = human(r.size_on_disk);
        if r.incomplete_bytes > 0 {
            size.push_str(&format!(" +{} partial", human(r.incomplete_bytes)));
        }
        println!("{:<56} {:>10}  {}", r.repo, size, revisions.join(", "));
    }
    println!("cache: {}", config.cache_dir.display());
    Ok(())
}

/// `812 B`, `220.5 KiB`, `4.31 GiB`: a size in the largest binary unit it reaches.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let decimals = if value < 10.0 { 2 } else { 1 };
    format!("{value:.decimals$} {}", UNITS[unit])
}
