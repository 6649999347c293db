//! Helpers shared by the CLI's end-to-end tests (each test file uses some of them).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;

/// The random-weight model on the real Qwen3.5 vocabulary: tiny layers that never end an
/// answer early, for tests of the wiring rather than of the model.
pub const REALVOCAB: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/qwen35-realvocab"
);

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
