//! Finding the running `splash serve`: `/status` says it is ready (and whether it takes images),
//! `/v1/models` names the model and its context. A tiny HTTP/1.1 GET is enough for a server on
//! this machine or the local network.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

/// What an agent needs to know about the server.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    /// `http://HOST:PORT`, without a trailing slash.
    pub base_url: String,
    pub port: u16,
    /// The id the API answers to (first of `/v1/models`).
    pub model: String,
    /// Prompt + output tokens.
    pub context: usize,
    pub vision: bool,
    /// The user's choice of output allowance (`--max-output-tokens`).
    pub max_output: Option<usize>,
}

/// Output tokens an agent may ask for in one answer: 32K, or a quarter of a smaller context
/// so a small window keeps room for the conversation.
const RESPONSE_TOKENS: usize = 32768;

impl Server {
    /// The OpenAI-style API root.
    pub fn api(&self) -> String {
        format!("{}/v1", self.base_url)
    }

    /// `splash` for the default port, `splash-PORT` for another, so an agent's saved sessions
    /// keep pointing at the server they were made with.
    pub fn name(&self) -> String {
        if self.port == 8000 {
            "splash".into()
        } else {
            format!("splash-{}", self.port)
        }
    }

    /// A text-only server on loopback `port` serving `model` (the launchers' unit tests).
    #[cfg(test)]
    pub fn local(port: u16, model: &str, context: usize) -> Self {
        Self {
            base_url: format!("http://127.0.0.1:{port}"),
            port,
            model: model.into(),
            context,
            vision: false,
            max_output: None,
        }
    }

    /// Output tokens an agent asks for per answer: `--max-output-tokens` (within the context),
    /// else the default allowance.
    pub fn response_tokens(&self) -> usize {
        match self.max_output {
            Some(n) => n.clamp(1, self.context),
            None => RESPONSE_TOKENS.min((self.context / 4).max(1)),
        }
    }
}

/// `http://HOST:PORT` (IPv6 literals in brackets).
pub fn base_url(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// Reads `/status` and `/v1/models` of the server at `host:port`.
pub fn discover(host: &str, port: u16, key: Option<&str>) -> anyhow::Result<Server> {
    let base = base_url(host, port);
    let none_ready = |why: String| {
        anyhow!(
            "no ready splash server at {base} ({why}).\n  Start one with `splash serve --model MODEL` first, or point at it with --port PORT (or SPLASH_PORT)."
        )
    };
    let status = match get(host, port, "/status", key) {
        Ok(r) => r,
        Err(e) => return Err(none_ready(format!("{e:#}"))),
    };
    match status.status {
        200 => {}
        401 if key.is_some() => bail!(
            "the splash server at {base} refused the key in SPLASH_API_KEY: set SPLASH_API_KEY to the key it was started with"
        ),
        401 => bail!(
            "the splash server at {base} needs an API key: set SPLASH_API_KEY to the key it was started with (the agent reads it from there)"
        ),
        code => return Err(none_ready(format!("GET /status answered HTTP {code}"))),
    }
    let status: Value = serde_json::from_str(&status.body).map_err(|_| {
        none_ready("GET /status did not answer JSON: is this a splash server?".into())
    })?;
    let models =
        get(host, port, "/v1/models", key).with_context(|| format!("reading {base}/v1/models"))?;
    if models.status != 200 {
        bail!("GET {base}/v1/models answered HTTP {}", models.status);
    }
    let models: Value = serde_json::from_str(&models.body)
        .with_context(|| format!("{base}/v1/models did not answer JSON"))?;
    from_answers(&base, port, &status, &models)
}

/// The server description from its `/status` and `/v1/models` answers.
pub fn from_answers(
    base: &str,
    port: u16,
    status: &Value,
    models: &Value,
) -> anyhow::Result<Server> {
    let state = status.get("status").and_then(Value::as_str).unwrap_or("");
    if state != "ready" {
        bail!("the splash server at {base} is not ready (status: {state:?}); wait for its `Ready:` line, or restart it");
    }
    let card = models
        .pointer("/data/0")
        .ok_or_else(|| anyhow!("{base}/v1/models lists no model"))?;
    let model = card
        .get("id")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| anyhow!("{base}/v1/models gives no model id"))?;
    let context = card
        .get("max_model_len")
        .or_else(|| card.get("context_length"))
        .or_else(|| status.get("maximum_context_tokens"))
        .and_then(Value::as_u64)
        .filter(|&c| c > 0)
        .ok_or_else(|| anyhow!("{base} reports no context length"))?;
    Ok(Server {
        base_url: base.to_string(),
        port,
        model: model.to_string(),
        context: context as usize,
        vision: status
            .get("vision")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        max_output: None,
    })
}

pub struct Answer {
    pub status: u16,
    pub body: String,
}

/// `GET path` with `Connection: close`; the body is read to the end (chunked or not).
fn get(host: &str, port: u16, path: &str, key: Option<&str>) -> anyhow::Result<Answer> {
    let timeout = Duration::from_secs(5);
    let addr = (host.trim_matches(|c| c == '[' || c == ']'), port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {host}"))?
        .next()
        .ok_or_else(|| anyhow!("cannot resolve {host}"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            anyhow!("nothing listens on port {port}")
        } else {
            anyhow!("cannot connect: {e}")
        }
    })?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let host_header = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host_header}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).context("reading the answer")?;
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> anyhow::Result<Answer> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow!("not an HTTP answer"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP answer"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let mut body = raw[split + 4..].to_vec();
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn dechunk(mut b: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("bad chunked body"))?;
        let size_text = String::from_utf8_lossy(&b[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| anyhow!("bad chunk size"))?;
        b = &b[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size {
            bail!("truncated chunked body");
        }
        out.extend_from_slice(&b[..size]);
        b = b.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_model_context_and_vision() {
        let status = json!({"status": "ready", "model": "demo", "maximum_context_tokens": 65536, "vision": false});
        let models = json!({"data": [{"id": "demo", "max_model_len": 65536}, {"id": "alias"}]});
        let s = from_answers("http://127.0.0.1:8000", 8000, &status, &models).unwrap();
        assert_eq!(s.model, "demo");
        assert_eq!(s.context, 65536);
        assert!(!s.vision);
        assert_eq!(s.api(), "http://127.0.0.1:8000/v1");
        assert_eq!(s.name(), "splash");
        assert_eq!(s.response_tokens(), 16384);
        let other = Server {
            port: 8001,
            context: 262144,
            ..s
        };
        assert_eq!(other.name(), "splash-8001");
        assert_eq!(other.response_tokens(), 32768);
        let chosen = Server {
            max_output: Some(256),
            ..other.clone()
        };
        assert_eq!(chosen.response_tokens(), 256);
        let too_many = Server {
            max_output: Some(1 << 20),
            ..other
        };
        assert_eq!(too_many.response_tokens(), 262144);
    }

    #[test]
    fn a_server_that_is_not_ready_is_refused() {
        let status = json!({"status": "unavailable"});
        let models = json!({"data": [{"id": "demo", "max_model_len": 1}]});
        let e = from_answers("http://h:1", 1, &status, &models).unwrap_err();
        assert!(e.to_string().contains("not ready"), "{e}");
    }

    #[test]
    fn ipv6_hosts_get_brackets() {
        assert_eq!(base_url("::1", 8000), "http://[::1]:8000");
        assert_eq!(base_url("localhost", 9), "http://localhost:9");
    }

    #[test]
    fn parses_plain_and_chunked_answers() {
        let a = parse_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").unwrap();
        assert_eq!((a.status, a.body.as_str()), (200, "{}"));
        let c = parse_answer(
            b"HTTP/1.1 401 Unauthorized\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n4\r\n\":1}\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((c.status, c.body.as_str()), (401, "{\"a\":1}"));
    }
}
