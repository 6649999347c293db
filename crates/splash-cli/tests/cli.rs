//! The `splash` binary end to end: exit codes, stdout and stderr of each command.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn splash(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_splash"))
        .args(args)
        .output()
        .expect("splash runs")
}

/// Runs `splash` with `args` (which ask for JSON), checks it succeeded, parses its stdout.
fn splash_json(args: &[&str]) -> serde_json::Value {
    let out = splash(args);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn generate_chat_on_the_demo_model() {
    let out = splash(&[
        "generate",
        "--model",
        "demo",
        "--chat",
        "--prompt",
        "hi",
        "--max-tokens",
        "8",
        "--seed",
        "3",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(!text(&out.stdout).trim().is_empty(), "no text generated");
    let err = text(&out.stderr);
    assert!(
        err.contains("prompt tokens") && err.contains("tok/s decode"),
        "{err}"
    );
    // Same seed, same text.
    let again = splash(&[
        "generate",
        "--model",
        "demo",
        "--chat",
        "--prompt",
        "hi",
        "--max-tokens",
        "8",
        "--seed",
        "3",
    ]);
    assert_eq!(out.stdout, again.stdout);
}

#[test]
fn greedy_generate_matches_the_transformers_continuation() {
    let dir = fixture("qwen35-dense");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let prompt = r["prompts"][1]["text"].as_str().unwrap();
    let want = r["greedy"][1]["output_text"].as_str().unwrap();
    let out = splash(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        prompt,
        "--temperature",
        "0",
        "--max-tokens",
        "40",
        "--ignore-eos",
        "--kv-format",
        "f32",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim_end_matches('\n'), want);
}

#[test]
fn perplexity_json_on_both_fixtures_and_the_demo() {
    for name in ["qwen35-dense", "qwen35-moe"] {
        let dir = fixture(name);
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let got = splash_json(&[
            "perplexity",
            "--model",
            dir.to_str().unwrap(),
            "--file",
            dir.join("ppl.txt").to_str().unwrap(),
            "--json",
        ]);
        let want = r["perplexity"]["perplexity"].as_f64().unwrap();
        assert!(
            (got["perplexity"].as_f64().unwrap() - want).abs() / want < 1e-4,
            "{name}: {got}"
        );
        assert_eq!(got["tokens"], r["perplexity"]["tokens"]);
        assert_eq!(got["kv_format"], "f32");

        // The int8 KV cache scored against the exact one, in one command.
        let q = splash_json(&[
            "perplexity",
            "--model",
            dir.to_str().unwrap(),
            "--file",
            dir.join("ppl.txt").to_str().unwrap(),
            "--kv-format",
            "int8",
            "--kv-baseline",
            "f32",
            "--json",
        ]);
        assert_eq!(
            (&q["kv_format"], &q["baseline"]["kv_format"]),
            (&"int8".into(), &"f32".into())
        );
        assert_eq!(q["baseline"]["perplexity"], got["perplexity"], "{name}");
        assert_ne!(q["perplexity"], got["perplexity"], "{name}");
        let same = q["baseline"]["same_top1"].as_f64().unwrap();
        assert!(same > 0.9 && same <= 1.0, "{name}: {q}");
    }
    let out = splash(&[
        "perplexity",
        "--model",
        "demo",
        "--file",
        fixture("qwen35-dense/ppl.txt").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("perplexity "),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn errors_exit_nonzero_with_a_reason() {
    let out = splash(&[
        "generate",
        "--model",
        "/nonexistent/model",
        "--prompt",
        "hi",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );

    let out = splash(&[
        "perplexity",
        "--model",
        "demo",
        "--file",
        "/nonexistent.txt",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("/nonexistent.txt"),
        "{}",
        text(&out.stderr)
    );

    let out = splash(&[
        "generate", "--model", "demo", "--prompt", "hi", "--top-p", "0",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("top_p"), "{}", text(&out.stderr));
}

#[test]
fn bench_reports_both_speeds() {
    let dir = fixture("qwen35-moe");
    let v = splash_json(&[
        "bench",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-tokens",
        "64",
        "--decode-tokens",
        "4",
        "--repeat",
        "1",
        "--verify-rows",
        "4,16",
        "--json",
    ]);
    assert!(
        v["prefill_tok_s"].as_f64().unwrap() > 0.0 && v["decode_tok_s"].as_f64().unwrap() > 0.0
    );
    // A pass cost for one token and for each asked row count.
    for rows in ["rows_1", "rows_4", "rows_16"] {
        assert!(v["pass_ms"][rows].as_f64().unwrap() > 0.0, "{rows}: {v}");
    }
}

#[test]
fn serve_refuses_an_empty_api_key() {
    let check = |out: Output| {
        assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("empty") && err.contains("leave out --api-key"),
            "{err}"
        );
    };
    check(splash(&[
        "serve",
        "--model",
        "demo",
        "--port",
        "0",
        "--api-key",
        "",
    ]));
    check(splash(&[
        "serve",
        "--model",
        "demo",
        "--port",
        "0",
        "--api-key",
        "  ",
    ]));
    check(
        Command::new(env!("CARGO_BIN_EXE_splash"))
            .args(["serve", "--model", "demo", "--port", "0"])
            .env("SPLASH_API_KEY", "")
            .output()
            .expect("splash runs"),
    );
}

#[test]
fn the_model_can_be_the_first_argument() {
    // As Ollama and `hf download` users type it; `--model` still works, both at once is refused.
    let out = splash(&["generate", "demo", "--prompt", "Hello", "--max-tokens", "2"]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let out = splash(&["generate", "demo", "--model", "demo", "--prompt", "Hello"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = splash(&["pull", "/nonexistent/dir"]);
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
    let out = splash(&["pull", "--help"]);
    let help = text(&out.stdout);
    assert!(
        help.contains("[MODEL]") && !help.contains("--device"),
        "{help}"
    );
}

#[test]
fn errors_say_their_cause_once_without_colour_codes() {
    let empty = std::env::temp_dir().join(format!("splash-empty-model-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_splash"))
        .args([
            "generate",
            "--model",
            empty.to_str().unwrap(),
            "--prompt",
            "hi",
        ])
        .env("SPLASH_LOG", "info")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&empty);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    assert!(!err.contains('\x1b'), "colour codes in a pipe: {err:?}");
}

#[test]
fn chat_output_shows_the_reasoning_block_whole() {
    let out = splash(&[
        "generate",
        "demo",
        "--chat",
        "--prompt",
        "What is 56 + 27?",
        "--temperature",
        "0",
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let answer = text(&out.stdout);
    assert!(answer.starts_with("<think>\n"), "{answer}");
    assert_eq!(answer.matches("</think>").count(), 1, "{answer}");
    assert!(answer.contains("83"), "{answer}");
}
