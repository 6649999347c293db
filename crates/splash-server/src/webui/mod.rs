//! The chat page at `/` and its assets under `/webui/`: hand-written HTML, CSS and JavaScript
//! embedded in the binary (no build step, nothing fetched at run time).
//!
//! The page talks to `/v1/chat/completions` (streamed) and reads `/status`; it lives in
//! `index.html` (layout), `style.css`, `markdown.js` (a small markdown renderer and syntax
//! highlighter) and `app.js` (chats in `localStorage`, streaming, errors). Asset URLs carry a
//! hash of their content, so assets are cached for a year and a new binary is picked up at once;
//! the page itself is revalidated on every load.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

const INDEX: &str = include_str!("index.html");

/// name, content type, body
const ASSETS: [(&str, &str, &str); 3] = [
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("app.js"),
    ),
    (
        "markdown.js",
        "text/javascript; charset=utf-8",
        include_str!("markdown.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("style.css"),
    ),
];

/// Scripts and styles only from this server; the API only on this server; images inline.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// 64-bit FNV-1a, computed at compile time for the asset version.
const fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut p = 0;
    while p < parts.len() {
        let bytes = parts[p].as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            h ^= bytes[i] as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
            i += 1;
        }
        p += 1;
    }
    h
}

/// One version for all assets: any change to any file changes every asset URL.
const VERSION: u64 = fnv1a(&[ASSETS[0].2, ASSETS[1].2, ASSETS[2].2]);

fn version() -> String {
    format!("{VERSION:016x}")
}

fn security_headers(h: &mut HeaderMap) {
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

fn off() -> Response {
    ApiError::not_found("GET", "/ (the web page is off: --no-webui)").into_response()
}

/// What the page needs before it may call `/status` (which can need a key): the model's name,
/// whether it takes images and whether a key is required. JSON in a non-executed script tag.
fn boot_json(s: &AppState) -> String {
    json!({
        "model": s.model_id(),
        "vision": s.vision.is_some(),
        "key_required": s.config.api_key.is_some(),
        "context": s.max_context,
        "version": env!("CARGO_PKG_VERSION"),
    })
    .to_string()
    // Inside <script>, `</script>` or `<!--` in a model name must not end the element.
    .replace('<', "\\u003c")
}

/// `GET /`: the chat page.
pub async fn index(State(s): State<AppState>) -> Response {
    if !s.config.webui {
        return off();
    }
    let page = INDEX
        .replace("{{v}}", &version())
        .replace("{{boot}}", &boot_json(&s));
    let mut resp = (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        page,
    )
        .into_response();
    security_headers(resp.headers_mut());
    resp
}

/// `GET /webui/{name}`: a script or style sheet.
pub async fn asset(
    State(s): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !s.config.webui {
        return off();
    }
    let Some((_, content_type, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return ApiError::not_found("GET", &format!("/webui/{name}")).into_response();
    };
    let etag = format!("\"{}\"", version());
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, *content_type)], *body).into_response()
    };
    let h = resp.headers_mut();
    // The page asks for `?v=VERSION`: such a URL never changes content.
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    security_headers(h);
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_every_asset_with_its_version() {
        for (name, _, _) in ASSETS {
            assert!(
                INDEX.contains(&format!("/webui/{name}?v={{{{v}}}}")),
                "index.html does not load {name}"
            );
        }
        assert!(INDEX.contains("{{boot}}"));
    }

    #[test]
    fn the_version_follows_the_content() {
        assert_ne!(fnv1a(&["a"]), fnv1a(&["b"]));
        assert_eq!(version().len(), 16);
    }

    #[test]
    fn scripts_use_no_inline_code_or_remote_urls() {
        // The CSP allows scripts and styles from this server only.
        assert!(!INDEX.contains("<script>"), "inline script in index.html");
        assert!(!INDEX.contains(" style="), "inline style in index.html");
        let files = ASSETS.iter().map(|(n, _, b)| (*n, *b));
        for (name, body) in files.chain([("index.html", INDEX)]) {
            for remote in ["https://", "http://", "//cdn"] {
                for line in body.lines().filter(|l| l.contains(remote)) {
                    // Links in comments and the markdown link checks are fine; loads are not.
                    assert!(
                        !line.contains("src=")
                            && !line.contains("import ")
                            && !line.contains("@import"),
                        "{name} loads a remote resource: {line}"
                    );
                }
            }
        }
    }
}
