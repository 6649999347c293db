//! The chat page at `/`: how it is served (content types, caching, the access guard,
//! `--no-webui`), and the page itself driven in headless Chromium by
//! `tests/webui/chat.spec.mjs` (playwright-core from `tests/webui/node_modules`; `npm ci` there).
//!
//! The browser test needs Node, Chromium (`/usr/bin/chromium`, or `CHROMIUM`) and the
//! node_modules; without them it is skipped (listed at the end of `scripts/test`), unless
//! `SPLASH_REQUIRE_BROWSER` or `CI` is set, in which case it fails. The screenshot goes to
//! `target/webui-screenshot.png` (and `target/webui-screenshot-markdown.png`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A `splash serve --model demo --port 0` with extra flags, stopped on drop.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        Self::start_model("demo", extra)
    }

    fn start_model(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_splash"))
            .args(["serve", "--model", model, "--port", "0"])
            .args(extra)
            .env_remove("SPLASH_API_KEY")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start splash serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.split("Ready: ").nth(1) {
                    let _ = tx.send(url.trim().to_string());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("splash serve printed no Ready line");
        Server { child, url }
    }

    fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// `GET path` with extra header lines; returns (status, lower-cased head, body).
    fn get(&self, path: &str, headers: &str) -> (u16, String, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port())).unwrap();
        let host = if headers.starts_with("Host:") {
            String::new()
        } else {
            format!("Host: 127.0.0.1:{}\r\n", self.port())
        };
        write!(
            s,
            "GET {path} HTTP/1.1\r\n{host}{headers}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, head.to_ascii_lowercase(), body.to_string())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::trim)
}

#[test]
fn the_page_and_its_assets_are_served_with_their_headers() {
    let s = Server::start(&[]);
    let (status, head, body) = s.get("/", "");
    assert_eq!(status, 200);
    assert_eq!(
        header(&head, "content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(header(&head, "cache-control"), Some("no-cache"));
    assert!(
        header(&head, "content-security-policy").is_some_and(|c| c.contains("script-src 'self'"))
    );
    assert_eq!(header(&head, "x-content-type-options"), Some("nosniff"));
    assert!(
        body.contains(r#""model":"demo""#),
        "boot data names the model"
    );
    let app = body
        .split('"')
        .find(|p| p.starts_with("/webui/app.js?v="))
        .expect("the page loads app.js")
        .to_string();

    let (status, head, js) = s.get(&app, "");
    assert_eq!(status, 200);
    assert_eq!(
        header(&head, "content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(
        header(&head, "cache-control"),
        Some("public, max-age=31536000, immutable")
    );
    assert!(js.contains("/v1/chat/completions"));
    let etag = header(&head, "etag").expect("etag").to_string();
    let (status, _, body) = s.get(&app, &format!("If-None-Match: {etag}\r\n"));
    assert_eq!((status, body.as_str()), (304, ""));
    let (status, head, _) = s.get("/webui/style.css", "");
    assert_eq!(status, 200);
    assert_eq!(
        header(&head, "content-type"),
        Some("text/css; charset=utf-8")
    );
    assert_eq!(s.get("/webui/nope.js", "").0, 404);

    let (status, _, status_json) = s.get("/status", "");
    assert_eq!(status, 200);
    assert!(status_json.contains(r#""vision":false"#), "{status_json}");
}

#[test]
fn with_a_key_the_page_is_public_and_the_api_is_not() {
    let s = Server::start(&["--api-key", "k3y"]);
    let (status, _, body) = s.get("/", "");
    assert_eq!(status, 200);
    assert!(body.contains(r#""key_required":true"#));
    assert!(!body.contains("k3y"), "the key is not in the page");
    assert_eq!(s.get("/webui/app.js", "").0, 200);
    assert_eq!(s.get("/webui/markdown.js", "").0, 200);
    assert_eq!(s.get("/status", "").0, 401);
    assert_eq!(s.get("/status", "Authorization: Bearer k3y\r\n").0, 200);
    // The DNS-rebinding guard covers the page too.
    assert_eq!(s.get("/", "Host: evil.example\r\n").0, 403);
}

#[test]
fn no_webui_turns_the_page_off() {
    let s = Server::start(&["--no-webui"]);
    assert_eq!(s.get("/", "").0, 404);
    assert_eq!(s.get("/webui/app.js", "").0, 404);
    assert_eq!(s.get("/health", "").0, 200);
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the browser test needs that is missing, if anything.
fn browser_missing(chromium: &Path, specs: &Path) -> Option<String> {
    if !chromium.exists() {
        return Some(format!(
            "{} not found (apt-get install chromium)",
            chromium.display()
        ));
    }
    if !specs.join("node_modules/playwright-core").exists() {
        return Some(format!(
            "{}/node_modules missing (cd tests/webui && npm ci)",
            specs.display()
        ));
    }
    if Command::new("node").arg("--version").output().is_err() {
        return Some("node not found".into());
    }
    None
}

#[test]
fn chat_page_in_headless_chromium() {
    let chromium = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into());
    let specs = root().join("tests/webui");
    if let Some(why) = browser_missing(&chromium, &specs) {
        let required = std::env::var_os("SPLASH_REQUIRE_BROWSER").is_some_and(|v| !v.is_empty());
        assert!(
            !required && !common::in_ci(),
            "the browser test cannot run under CI or SPLASH_REQUIRE_BROWSER: {why}"
        );
        common::record_skip("chat_page_in_headless_chromium", &why);
        return;
    }
    // The real-vocabulary model never stops early, so the page's streaming and stop button
    // always have a long answer to work on (the demo ends its answers quickly).
    let plain = Server::start_model(&common::realvocab(), &[]);
    let keyed = Server::start_model(&common::realvocab(), &["--api-key", "webui-test-key"]);
    let vision_model = root().join("tests/fixtures/qwen35-vl-tied");
    let vision = Server::start_model(vision_model.to_str().unwrap(), &[]);
    let shot = root().join("target/webui-screenshot.png");
    let out = Command::new("node")
        .arg(specs.join("chat.spec.mjs"))
        .current_dir(&specs)
        .env("SPLASH_URL", &plain.url)
        .env("SPLASH_KEYED_URL", &keyed.url)
        .env("SPLASH_KEY", "webui-test-key")
        .env("SPLASH_VISION_URL", &vision.url)
        .env("SPLASH_SCREENSHOT", &shot)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("run node");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(out.status.success(), "the browser test failed:\n{text}");
    assert!(shot.exists(), "no screenshot at {}", shot.display());
}

#[test]
fn a_missing_browser_fails_under_ci_and_is_listed_as_skipped_outside() {
    if std::env::var_os("SPLASH_WEBUI_SELF_TEST").is_some() {
        return; // the inner run below: only the browser test is meant to run there
    }
    let skips = std::env::temp_dir().join(format!("splash-skips-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&skips);
    let run = |ci: Option<&str>| {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["chat_page_in_headless_chromium", "--exact", "--nocapture"])
            .env("CHROMIUM", "/nonexistent/chromium")
            .env("SPLASH_WEBUI_SELF_TEST", "1")
            .env("SPLASH_TEST_SKIPS_DIR", &skips)
            .env_remove("SPLASH_REQUIRE_BROWSER")
            .env_remove("CI");
        if let Some(v) = ci {
            cmd.env("CI", v);
        }
        cmd.output().unwrap()
    };
    let out = run(Some("true"));
    assert!(
        !out.status.success(),
        "a missing browser passed under CI=true:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!skips.exists(), "a failure is not a skip");
    for ci in [None, Some("false")] {
        let out = run(ci);
        assert!(
            out.status.success(),
            "{ci:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let listed =
            std::fs::read_to_string(skips.join("chat_page_in_headless_chromium.txt")).unwrap();
        assert!(
            listed.contains("/nonexistent/chromium not found"),
            "{listed}"
        );
    }
    let _ = std::fs::remove_dir_all(&skips);
}
