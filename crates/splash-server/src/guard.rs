//! Access guard for every request: DNS-rebinding protection (`Host`), browser `Origin`
//! checks, and the API key.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use std::sync::Arc;

use crate::config::ServerConfig;
use crate::error::{for_path, ApiError};

/// Routes that answer without a key: the chat page (which asks for the key itself), liveness
/// and readiness.
fn is_public(path: &str) -> bool {
    matches!(path, "/" | "/health" | "/ready") || path.starts_with("/webui/")
}

/// Middleware: Host, then Origin, then key; answers CORS preflights for allowed origins.
pub async fn guard(State(cfg): State<Arc<ServerConfig>>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    if let Some(h) = &host {
        if !host_allowed(h, &cfg.allowed_hosts) {
            return for_path(
                &path,
                ApiError::forbidden(format!(
                    "Host `{h}` is not allowed (protection against DNS rebinding): use an IP address or localhost, or start splash with --allowed-host {}",
                    host_name(h)
                )),
            );
        }
    }
    let origin = headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(str::to_string);
    if let Some(o) = &origin {
        if !origin_allowed(o, host.as_deref(), &cfg.allowed_origins) {
            return for_path(
                &path,
                ApiError::forbidden(format!(
                    "browser Origin `{o}` is not allowed: start splash with --allowed-origin {o} to let that page call this server"
                )),
            );
        }
    }
    if req.method() == Method::OPTIONS && origin.is_some() {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        add_cors(resp.headers_mut(), origin.as_deref());
        return resp;
    }
    if let Some(key) = &cfg.api_key {
        if !is_public(req.uri().path()) && !key_matches(headers, key) {
            let msg = if headers.contains_key(header::AUTHORIZATION)
                || headers.contains_key("x-api-key")
            {
                "the API key is wrong: send the key splash was started with (--api-key / SPLASH_API_KEY)"
            } else {
                "this server needs an API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
            };
            return for_path(&path, ApiError::unauthorized(msg));
        }
    }
    let mut resp = next.run(req).await;
    if origin.is_some() {
        add_cors(resp.headers_mut(), origin.as_deref());
    }
    resp
}

fn add_cors(h: &mut HeaderMap, origin: Option<&str>) {
    if let Some(v) = origin.and_then(|o| HeaderValue::from_str(o).ok()) {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(
                "authorization, content-type, x-api-key, anthropic-version, anthropic-beta",
            ),
        );
    }
}

/// The host part of a `Host` header value (`[::1]:8000` → `::1`, `a.b:80` → `a.b`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host).trim_end_matches('.');
    name.parse::<std::net::IpAddr>().is_ok()
        || name.eq_ignore_ascii_case("localhost")
        || allowed
            .iter()
            .any(|a| a == "*" || a.eq_ignore_ascii_case(name))
}

fn origin_allowed(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    if allowed.iter().any(|a| a == "*" || a == origin) {
        return true;
    }
    // Same origin: scheme, host and port all match. This server speaks plain HTTP, so its own
    // pages have an `http` origin; `https://` or `evil://` on the same host and port is another
    // origin (RFC 6454).
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    scheme.eq_ignore_ascii_case("http") && host.is_some_and(|h| authority.eq_ignore_ascii_case(h))
}

fn key_matches(headers: &HeaderMap, key: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim);
    let x_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    [bearer, x_key]
        .into_iter()
        .flatten()
        .any(|given| constant_time_eq(given.as_bytes(), key.as_bytes()))
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | u8::from(a.len() != b.len());
    for (i, &y) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ y;
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let none: Vec<String> = vec![];
        for ok in [
            "127.0.0.1:8000",
            "localhost:8000",
            "[::1]:8000",
            "LOCALHOST",
            "10.0.0.2",
        ] {
            assert!(host_allowed(ok, &none), "{ok}");
        }
        assert!(!host_allowed("evil.example:8000", &none));
        assert!(host_allowed("box.lan:8000", &["box.lan".to_string()]));
        assert_eq!(host_name("[::1]:80"), "::1");
    }

    #[test]
    fn origins() {
        assert!(origin_allowed(
            "http://127.0.0.1:8000",
            Some("127.0.0.1:8000"),
            &[]
        ));
        assert!(!origin_allowed(
            "http://evil.example",
            Some("127.0.0.1:8000"),
            &[]
        ));
        // Same host and port under another scheme is another origin.
        for other in [
            "https://127.0.0.1:8000",
            "evil://127.0.0.1:8000",
            "127.0.0.1:8000",
            "http://127.0.0.1:8001",
        ] {
            assert!(
                !origin_allowed(other, Some("127.0.0.1:8000"), &[]),
                "{other}"
            );
        }
        assert!(origin_allowed(
            "HTTP://LOCALHOST:8000",
            Some("localhost:8000"),
            &[]
        ));
        assert!(origin_allowed(
            "http://app.local:3000",
            Some("127.0.0.1:8000"),
            &["http://app.local:3000".into()]
        ));
    }

    #[test]
    fn keys() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret1", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
    }
}
