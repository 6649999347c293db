//! The `splash` binary with a DFlash draft: generate with and without speculation (same
//! greedy text), a draft that does not fit its target is refused, and `serve` reports
//! acceptance in `/status` and `/metrics`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

fn splash(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(args)
        .output()
        .expect("splash runs")
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_with_a_draft_prints_the_same_greedy_text() {
    let (target, draft) = (fixture("qwen35-moe"), fixture("dflash/moe-dflash2"));
    let base = [
        "generate",
        "--model",
        &target,
        "--prompt",
        "The module provides a number of functions",
        "--temperature",
        "0",
        "--max-tokens",
        "60",
        "--ignore-eos",
        "--draft-model",
        &draft,
    ];
    let on = splash(&base);
    assert!(on.status.success(), "{}", text(&on.stderr));
    let err = text(&on.stderr);
    assert!(
        err.contains("speculative decoding: draft") && err.contains("tokens per drafted pass"),
        "{err}"
    );
    let off = splash(&[&base[..], &["--speculative", "off"]].concat());
    assert!(off.status.success(), "{}", text(&off.stderr));
    assert!(!text(&off.stderr).contains("tokens per drafted pass"));
    assert_eq!(text(&on.stdout), text(&off.stdout));
}

#[test]
fn a_draft_that_does_not_fit_the_target_is_refused() {
    let dir = std::env::temp_dir().join(format!("splash-bad-draft-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = PathBuf::from(fixture("dflash/dense-dflash"));
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["dflash_config"]["target_layer_ids"] = serde_json::json!([1, 3, 9]);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let out = splash(&[
        "generate",
        "--model",
        &fixture("qwen35-dense"),
        "--prompt",
        "hi",
        "--draft-model",
        &dir.display().to_string(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("reads target layer 9") && err.contains("has 6 layers"),
        "{err}"
    );
}

struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    fn request(&self, method: &str, path: &str, body: &str) -> String {
        common::http(
            self.1,
            method,
            path,
            "Content-Type: application/json\r\n",
            body,
        )
    }
}

#[test]
fn serve_reports_acceptance_in_status_and_metrics() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args([
            "serve",
            "--model",
            &fixture("qwen35-dense"),
            "--draft-model",
            &fixture("dflash/dense-dflash"),
            // A random draft is rarely accepted: `on` would soon stop drafting.
            "--speculative",
            "always",
            "--port",
            "0",
            "--no-webui",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start splash serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.split("Ready: ").nth(1) {
                let port = url
                    .trim()
                    .trim_end_matches('/')
                    .rsplit(':')
                    .next()
                    .unwrap()
                    .parse::<u16>();
                let _ = tx.send(port.unwrap());
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("no Ready line");
    let server = Server(child, port);
    for _ in 0..2 {
        let body = server.request(
            "POST",
            "/v1/completions",
            r#"{"model": "qwen35-dense", "prompt": "Return a new sorted list", "max_tokens": 40, "temperature": 0, "ignore_eos": true}"#,
        );
        assert!(body.contains("\"choices\""), "{body}");
    }
    let status: serde_json::Value =
        serde_json::from_str(&server.request("GET", "/status", "")).unwrap();
    let spec = status
        .pointer("/counters/speculation")
        .or_else(|| status.pointer("/speculation"))
        .or_else(|| find(&status, "speculation"))
        .unwrap_or_else(|| panic!("no speculation in /status: {status}"));
    assert_eq!(spec["requests_total"], 2, "{spec}");
    assert!(spec["target_passes_total"].as_u64().unwrap() > 10, "{spec}");
    assert!(spec["acceptance_length"].as_f64().unwrap() >= 1.0, "{spec}");
    assert_eq!(
        spec["recent_acceptance_lengths"].as_array().unwrap().len(),
        2
    );
    let metrics = server.request("GET", "/metrics", "");
    assert!(
        metrics.contains("splash_spec_target_passes_total "),
        "{metrics}"
    );
    assert!(
        metrics.contains("splash_spec_acceptance_length_count 2"),
        "{metrics}"
    );
}

/// The first value under `key` anywhere in `v`.
fn find<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => {
            m.get(key).or_else(|| m.values().find_map(|x| find(x, key)))
        }
        serde_json::Value::Array(a) => a.iter().find_map(|x| find(x, key)),
        _ => None,
    }
}
