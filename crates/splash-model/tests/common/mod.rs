//! Helpers shared by the integration tests (each test file uses some of them).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// A committed fixture under `tests/fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

/// What `tests/fixtures/make_twins.py` reads (files, and directories whose files it may read):
/// a change to any of them gives the twins a new directory.
const TWIN_INPUTS: [&str; 10] = [
    "make_twins.py",
    "make_mlx_fixture.py",
    "gguf/make_gguf_fixture.py",
    "requirements.txt",
    "qwen35-dense",
    "qwen35-moe",
    "qwen35-dense-gguf",
    "qwen35-moe-gguf",
    "qwen35-dense-mlx4",
    "qwen35-moe-mlx4",
];

/// The dequantised twin of a quantised fixture (`qwen35-dense-gguf/twin-Q8_0`,
/// `qwen35-moe-mlx4-dequant`, ...). The twins are not committed: on first use,
/// `tests/fixtures/make_twins.py` (gguf-py and numpy, independent of splash) writes all of them
/// from the committed quantised files into `target/fixtures/twins-<hash of its inputs>/`.
/// Panics when the Python (`SPLASH_FIXTURE_PYTHON`, else `.venv/bin/python`) or its packages
/// are missing.
pub fn twin(name: &str) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(make_twins).join(name)
}

/// FNV-1a, 64 bits: a hash that stays the same across toolchains.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn twin_inputs_hash(fixtures: &Path) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325;
    for input in TWIN_INPUTS {
        let path = fixtures.join(input);
        let mut files = if path.is_dir() {
            std::fs::read_dir(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
                .map(|entry| entry.unwrap().path())
                .filter(|p| p.is_file())
                .collect()
        } else {
            vec![path]
        };
        files.sort();
        for file in files {
            let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let rel = file.strip_prefix(fixtures).unwrap().to_string_lossy();
            h = fnv1a(h, rel.as_bytes());
            h = fnv1a(h, &(bytes.len() as u64).to_le_bytes());
            h = fnv1a(h, &bytes);
        }
    }
    h
}

/// Runs `make_twins.py` into a temporary directory beside the final one and renames it into
/// place, unless an earlier run (or another test process) already did.
fn make_twins() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let fixtures = repo.join("tests/fixtures");
    let root = repo.join("target/fixtures");
    let hash = twin_inputs_hash(&fixtures);
    let dir = root.join(format!("twins-{hash:016x}"));
    if dir.is_dir() {
        return dir;
    }
    let python = std::env::var_os("SPLASH_FIXTURE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join(".venv/bin/python"));
    let install = format!(
        "The dequantised twins of the quantised fixtures are not committed: \
         tests/fixtures/make_twins.py writes them into {}, with the Python of \
         SPLASH_FIXTURE_PYTHON, else .venv/bin/python, which needs the packages of \
         tests/fixtures/requirements.txt (gguf, numpy, safetensors). Run the tests through \
         scripts/test, which installs them into .venv, or run \
         `python3 -m venv .venv && .venv/bin/pip install -r tests/fixtures/requirements.txt`.",
        root.display()
    );
    let tmp = root.join(format!(".twins-{hash:016x}.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    let out = Command::new(&python)
        .arg(fixtures.join("make_twins.py"))
        .arg(&tmp)
        .current_dir(&repo)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}\n{install}", python.display()));
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&tmp);
        panic!(
            "{} tests/fixtures/make_twins.py failed ({}):\n{}{}\n{install}",
            python.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if let Err(e) = std::fs::rename(&tmp, &dir) {
        // Another process got there first: its twins are the same.
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(dir.is_dir(), "{} -> {}: {e}", tmp.display(), dir.display());
    }
    dir
}

/// Largest |a - b| relative to the largest |b| (infinite if `a` holds a NaN).
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    if a.is_empty() && b.is_empty() {
        return 0.0;
    }
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
        if x.is_nan() {
            f32::INFINITY
        } else {
            m.max((x - y).abs())
        }
    }) / scale
}

/// Index of the largest value (the first of equals).
pub fn argmax(r: &[f32]) -> usize {
    (0..r.len()).fold(0, |b, i| if r[i] > r[b] { i } else { b })
}

/// Three prompts (5, 40 and 12 tokens, ids below 400: within every fixture's vocabulary) and
/// the tokens of three batched steps over them: ragged (one token, three, none), one token
/// each, then three blocks of 9 (27 rows in all, past the 16 rows a product takes row by row
/// on its own).
pub fn ragged_batches() -> ([Vec<u32>; 3], Vec<Vec<Vec<u32>>>) {
    let prompts = [
        (0..5).map(|i| i * 31 % 400).collect(),
        (0..40).map(|i| (i * 17 + 3) % 400).collect(),
        (0..12).map(|i| (i * 7 + 11) % 400).collect(),
    ];
    let block = |b: u32| (0..9).map(|i| b + i).collect::<Vec<u32>>();
    let steps = vec![
        vec![vec![7u32], vec![8, 9, 10], vec![]],
        vec![vec![11], vec![12], vec![13]],
        vec![block(20), block(40), block(60)],
    ];
    (prompts, steps)
}
