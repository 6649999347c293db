//! `splash bench --replay-tokens N`: time to first token of an agent-style prompt of N tokens
//! uncached, repeated (prefix cache in memory), the next turn (the cached prefix plus a few
//! new tokens), and repeated from the disk tier (page cache dropped: read from the disk).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use splash_engine::{DiskCacheConfig, Engine, Request, SamplingParams};
use splash_model::{KvFormat, Model};

/// Times in milliseconds (medians where repeated) and the cached tokens of each case.
pub struct Replay {
    pub tokens: usize,
    pub uncached_ms: f64,
    pub memory_ms: f64,
    pub memory_cached: usize,
    pub next_turn_ms: f64,
    pub next_turn_tokens: usize,
    pub next_turn_cached: usize,
    pub disk_ms: f64,
    pub disk_cached: usize,
    /// Bytes of the disk-tier file a hit reads.
    pub disk_bytes: u64,
}

/// An agent-shaped prompt: a turn marker at the start, at a quarter (the end of system and
/// tools) and 8 tokens before the end (the generation prompt), pseudo-random ids between.
fn agent_prompt(model: &Model, n: usize, seed: u64) -> Vec<u32> {
    let im_start = model.tokenizer.token_to_id("<|im_start|>").unwrap_or(0);
    let mut p: Vec<u32> = super::pseudo_random_tokens(model, n, seed)
        .into_iter()
        .map(|t| if t == im_start { t + 1 } else { t })
        .collect();
    for at in [0, n / 4, n.saturating_sub(8)] {
        if at < n {
            p[at] = im_start;
        }
    }
    p
}

fn ttft(engine: &mut Engine, prompt: &[u32]) -> anyhow::Result<(f64, usize)> {
    let t0 = Instant::now();
    let c = engine.generate(
        Request {
            prompt: prompt.to_vec(),
            sampling: SamplingParams::greedy(),
            max_tokens: 1,
            stop: Vec::new(),
            ignore_eos: true,
            grammar: None,
            images: Vec::new(),
        },
        |_| {},
    )?;
    Ok((t0.elapsed().as_secs_f64() * 1e3, c.cached_tokens))
}

/// Drops the files' pages from the OS page cache, so that the next read comes from the disk.
/// Returns the size of the largest file (the deepest prefix: the one a hit reads).
fn evict_page_cache(dir: &Path) -> u64 {
    use std::os::unix::io::AsRawFd;
    let mut largest = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if let Ok(f) = std::fs::File::open(e.path()) {
            let _ = f.sync_all();
            largest = largest.max(f.metadata().map_or(0, |m| m.len()));
            // SAFETY: a valid open descriptor; advice only.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    largest
}

/// Runs the four cases on `model` (target only: no draft context is cached).
pub fn run(model: &Arc<Model>, n: usize, kv: KvFormat, repeat: usize) -> anyhow::Result<Replay> {
    let root = std::env::temp_dir().join(format!("splash-bench-cache-{}", std::process::id()));
    let mut engine = Engine::new(model.clone())
        .with_kv_format(kv)
        .with_prefix_cache(64 << 30)
        .with_disk_cache(DiskCacheConfig {
            root: root.clone(),
            budget_bytes: 256 << 30,
            persistent: false,
            identity: "splash bench".into(),
        })?;
    let prompt = agent_prompt(model, n, 0x9E37_79B9_7F4A_7C15);
    let (uncached_ms, _) = ttft(&mut engine, &prompt)?;
    let mut memory = Vec::new();
    let mut memory_cached = 0;
    for _ in 0..repeat {
        let (ms, cached) = ttft(&mut engine, &prompt)?;
        memory.push(ms);
        memory_cached = cached;
    }
    // The next turn: the answer and a new user message after the generation prompt.
    let mut next = prompt.clone();
    next.extend(agent_prompt(model, 64, 7).into_iter().skip(1));
    let (next_turn_ms, next_turn_cached) = ttft(&mut engine, &next)?;
    // From the disk tier, cold: memory entries written out, their pages dropped.
    engine.spill_prefix_cache();
    let dir = engine
        .disk_cache_dir()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut disk = Vec::new();
    let (mut disk_cached, mut disk_bytes) = (0, 0);
    for _ in 0..repeat {
        disk_bytes = evict_page_cache(&dir);
        let (ms, cached) = ttft(&mut engine, &prompt)?;
        disk.push(ms);
        disk_cached = cached;
    }
    drop(engine);
    let _ = std::fs::remove_dir_all(&root);
    Ok(Replay {
        tokens: n,
        uncached_ms,
        memory_ms: super::median(&mut memory),
        memory_cached,
        next_turn_ms,
        next_turn_tokens: next.len(),
        next_turn_cached,
        disk_ms: super::median(&mut disk),
        disk_cached,
        disk_bytes,
    })
}
