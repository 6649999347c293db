//! `--image WxH`: the vision tower's time for one image of that size (patch rows made
//! directly, so the decode and resize are not timed), where the text model runs (the GPU with
//! `--device cuda`, else the CPU), after one untimed encode.

use std::time::Instant;

use splash_backend::profile;
use splash_model::vision::{PreparedImage, VisionTower};
use splash_model::Model;

/// One image size's measurement.
pub struct TowerTime {
    pub width: usize,
    pub height: usize,
    /// Patches down and across.
    pub grid: (usize, usize),
    /// Prompt tokens the image takes (merged 2×2 blocks).
    pub tokens: usize,
    /// Median time of one encode.
    pub ms: f64,
    /// Multiply-adds of the products and attention, ×2, per second.
    pub gflops: f64,
    /// Where the tower ran.
    pub device: String,
}

/// Parses `WxH` (e.g. `1024x1024`).
pub fn parse_size(s: &str) -> Result<(usize, usize), String> {
    let (w, h) = s
        .split_once(['x', 'X', '×'])
        .ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT, e.g. 1024x1024"))?;
    let num = |v: &str| v.trim().parse::<usize>().map_err(|e| format!("`{v}`: {e}"));
    let (w, h) = (num(w)?, num(h)?);
    if w < 32 || h < 32 {
        return Err(format!("{s}: each side must be at least 32 pixels"));
    }
    Ok((w, h))
}

/// Times the tower of `model` on each size, `repeat` times each (median).
pub fn run(
    model: &Model,
    sizes: &[(usize, usize)],
    repeat: usize,
) -> anyhow::Result<Vec<TowerTime>> {
    let mut tower = VisionTower::load(&model.dir)?.ok_or_else(|| {
        anyhow::anyhow!(
            "{} has no vision tower (config.json has no vision_config): --image needs one, e.g. bench/make_synthetic.py --vision",
            model.dir.display()
        )
    })?;
    tower.place_like(&model.graph)?;
    let c = tower.config().clone();
    let unit = c.patch_size * c.spatial_merge_size;
    let mut out = Vec::new();
    for &(width, height) in sizes {
        // The processor's sizes are multiples of patch × merge.
        let (gh, gw) = (
            height.div_ceil(unit) * c.spatial_merge_size,
            width.div_ceil(unit) * c.spatial_merge_size,
        );
        let n = gh * gw;
        let rows = (0..n * c.patch_len())
            .map(|i| ((i * 37 + 11) % 255) as f32 / 127.5 - 1.0)
            .collect();
        let image = PreparedImage {
            grid: (gh, gw),
            rows,
        };
        tower.encode(&image)?;
        let mut times = Vec::new();
        for _ in 0..repeat {
            let t0 = Instant::now();
            tower.encode(&image)?;
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        if let Some(before) = tower.gpu_profile() {
            // SPLASH_GPU_PROFILE: where one more encode's time goes, launch by launch.
            tower.encode(&image)?;
            let rows = profile::profile_since(&before, &tower.gpu_profile().unwrap_or_default());
            eprintln!("vision tower {width}x{height}, every launch synchronised:");
            eprint!("{}", profile::profile_text(&rows));
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        let (d, i, m2) = (
            c.hidden_size,
            c.intermediate_size,
            c.spatial_merge_size.pow(2),
        );
        let per_block = n * (3 * d * d + d * d + 2 * d * i) + 2 * n * n * d;
        let macs = c.patch_len() * d * n
            + c.depth * per_block
            + (n / m2) * (d * m2 * d * m2 + d * m2 * c.out_hidden_size);
        out.push(TowerTime {
            width,
            height,
            grid: (gh, gw),
            tokens: n / m2,
            ms,
            gflops: 2.0 * macs as f64 / (ms * 1e-3) / 1e9,
            device: tower.device(),
        });
    }
    Ok(out)
}
