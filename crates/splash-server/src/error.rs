//! API errors: OpenAI's shape `{"error": {"message", "type", "param", "code"}}` by default,
//! Anthropic's `{"type": "error", "error": {"type", "message"}}` for the Messages API.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answer: status, OpenAI `type`, optional `param` and `code`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (503).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 about one request field.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_string()),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 400 about the request as a whole.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 `context_length_exceeded`.
    pub fn context_length(message: impl Into<String>) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            ..Self::bad_request(message)
        }
    }

    /// 404 for an unknown model.
    pub fn model_not_found(model: &str, served: &[String]) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!(
                    "the model `{model}` does not exist here; this server serves {}",
                    served.join(", ")
                ),
            )
        }
    }

    /// 404 for an unknown route.
    pub fn not_found(method: &str, path: &str) -> Self {
        Self {
            code: Some("not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("no route for {method} {path}; see GET /v1/models, POST /v1/chat/completions, POST /v1/completions"),
            )
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(StatusCode::UNAUTHORIZED, "authentication_error", message)
        }
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self {
            code: Some("forbidden"),
            ..Self::new(StatusCode::FORBIDDEN, "permission_error", message)
        }
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self {
            code: Some("request_too_large"),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is larger than {limit} bytes; raise the limit with --max-request-size"),
            )
        }
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self {
            code: Some("request_timeout"),
            ..Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {:.1} s; send the whole body at once, or raise the limit with --body-read-timeout",
                    timeout.as_secs_f64()
                ),
            )
        }
    }

    /// 503 with `Retry-After`.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            code: Some("server_overloaded"),
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
        }
    }

    /// 500: the engine failed; the server keeps serving.
    pub fn engine(message: impl Into<String>) -> Self {
        Self {
            code: Some("engine_failed"),
            ..Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
        }
    }

    /// The JSON body (also used as an SSE error event).
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// The same error in Anthropic's shape, for `/v1/messages`.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl AnthropicError {
    /// The JSON body (also an SSE `error` event).
    pub fn body(&self) -> serde_json::Value {
        let kind = match self.0.status.as_u16() {
            400 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            408 => "timeout_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            _ => "api_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": self.0.message}})
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut resp = (self.0.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.0.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

/// An error answer in the shape of the API that `path` belongs to.
pub fn for_path(path: &str, e: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        AnthropicError(e).into_response()
    } else if path == "/v1/systemone" {
        crate::scoring::systemone::SystemOneError::Api(e).into_response()
    } else {
        e.into_response()
    }
}
