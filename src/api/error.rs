//! Errors as the E2B SDK reads them.
//!
//! Policy: every handler returns `Result<_, ApiError>`. The body is always
//! `{"code": <status>, "message": "<text>"}`: the SDK shows `"<status>: <message>"` to the user,
//! so the message must say what was wrong and what to do. Unexpected failures (database down,
//! I/O) are logged with their cause and answered 500 (503 when the database pool is closed or
//! exhausted) without internals in the message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// Sent as `Retry-After` (seconds): the refusal is about load, not about the request.
    pub retry_after_secs: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    /// The same refusal, telling the client when to try again.
    pub fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after_secs = Some(secs);
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, message)
    }

    /// A team at one of its limits (ADR 0024); the SDK raises its rate-limit error on it.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message)
    }

    /// An unexpected failure: logged in full here, answered without internals.
    pub fn internal(context: &str, err: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %err, "{context}");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{context} failed; the server logged the cause, retry later"),
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(err: sqlx::Error) -> Self {
        match err {
            sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
                tracing::warn!(error = %err, "database unavailable");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database is unavailable; retry shortly",
                )
            }
            other => Self::internal("database query", &other),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}
