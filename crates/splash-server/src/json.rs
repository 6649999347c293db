//! Request bodies: size-limited, parsed as a JSON object, then typed with errors that name the
//! offending field (`messages[0].content: invalid type ...`).

use axum::body::Body;
use std::sync::Arc;

use axum::extract::{FromRef, FromRequest, Request};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::config::ServerConfig;
use crate::error::ApiError;

/// A request body that is a JSON object.
pub struct JsonObject(pub Value);

impl<S> FromRequest<S> for JsonObject
where
    S: Send + Sync,
    Arc<ServerConfig>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let config = Arc::<ServerConfig>::from_ref(state);
        let limit = config.max_request_size;
        // A declared length over the limit is refused before a byte of the body is read.
        let declared = req
            .headers()
            .get(axum::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ApiError::too_large(limit));
        }
        let body: Body = req.into_body();
        // A body that never ends (a chunked body never finished, a Content-Length longer than
        // what is sent) would hold the connection forever.
        let timeout = config.body_read_timeout;
        let read = tokio::time::timeout(timeout, axum::body::to_bytes(body, limit));
        let bytes = read
            .await
            .map_err(|_| ApiError::body_timeout(timeout))?
            .map_err(|e| {
                // The only error with a cause chain that mentions the limit is the length limit.
                let msg = format!("{e:#}");
                if msg.contains("length limit")
                    || std::error::Error::source(&e)
                        .is_some_and(|s| s.to_string().contains("length limit"))
                {
                    ApiError::too_large(limit)
                } else {
                    ApiError::bad_request(format!("could not read the request body: {msg}"))
                }
            })?;
        if bytes.is_empty() {
            return Err(ApiError::bad_request(
                "the request body is empty: send a JSON object",
            ));
        }
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
        })?;
        if !value.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        Ok(Self(value))
    }
}

/// Deserialises `value` into `T`; a type error names the field path.
pub fn typed<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || path.is_empty() {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid(&path, format!("invalid value for `{path}`: {inner}"))
        }
    })
}
