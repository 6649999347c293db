//! Helpers shared by the CLI's end-to-end tests (each test file uses some of them).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;

#[path = "../../../../tests/fixtures/derived.rs"]
mod derived;
/// A GGUF fixture (`qwen35-dense-gguf/model-Q8_0.gguf`, or its directory), generated on first
/// use (`tests/fixtures/derived.rs`).
#[allow(unused_imports)] // each test binary uses some
pub use derived::{fixture, gguf};

/// The random-weight model on the real Qwen3.5 vocabulary: tiny layers that never end an
/// answer early, for tests of the wiring rather than of the model. Its weights are not
/// committed: the directory is generated on first use (`tests/fixtures/derived.rs`).
pub fn realvocab() -> String {
    derived::realvocab().to_str().unwrap().to_string()
}

/// One HTTP/1.1 request to the server on loopback `port` (`headers`: extra `Name: value\r\n`
/// lines); returns the response body.
pub fn http(port: u16, method: &str, path: &str, headers: &str, body: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// Where tests record what they skipped: `scripts/test` empties it first and lists it at the
/// end, so that a skip shows in the run's summary rather than inside a passing test's output.
pub const SKIPS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/test-skips");

/// Whether the run is under CI (`CI` set to anything but empty, `0` or `false`), where a test
/// whose tools are missing fails instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Records that `test` was skipped and why (printed too), in `SPLASH_TEST_SKIPS_DIR` if set,
/// else [`SKIPS_DIR`].
pub fn record_skip(test: &str, why: &str) {
    println!("SKIPPED: {test}: {why}");
    let dir = std::env::var_os("SPLASH_TEST_SKIPS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| SKIPS_DIR.into());
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join(format!("{test}.txt")), format!("{test}: {why}\n"));
}
