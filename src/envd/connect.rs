//! The pieces of the Connect protocol envd's clients rely on (`SANDBOX-PROTOCOL.md` §4).
//!
//! Unary calls carry bare JSON both ways and fail with a non-200 status and a JSON error body.
//! Streams carry envelopes (1 flag byte, a 4-byte big-endian length, the JSON) and always answer
//! HTTP 200: a stream's error travels in its final end-stream envelope instead.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use futures::StreamExt as _;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// An envelope holding one message.
pub const FLAG_MESSAGE: u8 = 0;
/// Set on a compressed envelope. The SDK disables compression, and so does strata: such an
/// envelope is refused rather than guessed at.
pub const FLAG_COMPRESSED: u8 = 1;
/// The last envelope of a response stream; its payload is an `EndStreamResponse`.
pub const FLAG_END_STREAM: u8 = 2;
/// The largest message accepted in a request: a bound on what one client can make us buffer.
pub const MAX_MESSAGE: usize = 64 << 20;

const HEADER_LEN: usize = 5;

/// One envelope: the flag byte, the payload's length (big-endian `u32`), the payload.
///
/// Panics on a payload of 4 GiB or more, which the format cannot express; strata's messages are
/// output chunks of at most 32 KiB.
pub fn envelope(flag: u8, payload: &[u8]) -> Bytes {
    let len = u32::try_from(payload.len()).expect("a Connect envelope holds less than 4 GiB");
    let mut out = BytesMut::with_capacity(HEADER_LEN + payload.len());
    out.put_u8(flag);
    out.put_u32(len);
    out.put_slice(payload);
    out.freeze()
}

/// A message envelope holding `msg` as JSON.
pub fn message<T: Serialize>(msg: &T) -> Bytes {
    // The protocol's messages have string keys and no fallible serializers.
    let json = serde_json::to_vec(msg).expect("a protocol message serializes to JSON");
    envelope(FLAG_MESSAGE, &json)
}

/// The end of a stream that succeeded.
pub fn end_stream_ok() -> Bytes {
    envelope(FLAG_END_STREAM, b"{}")
}

/// The end of a stream that failed; the SDK raises the error's exception from it.
pub fn end_stream_error(err: &ConnectError) -> Bytes {
    let body = serde_json::json!({"error": err.body()});
    envelope(FLAG_END_STREAM, body.to_string().as_bytes())
}

/// Connect's error codes; the SDK picks its exception by the code's name (§4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// The name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code, as the Connect spec assigns them.
    /// Clients go by the code in the body; proxies and logs see the status.
    pub fn http_status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).expect("499 is a valid status"),
            Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
                StatusCode::BAD_REQUEST
            }
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A failed RPC: a code the SDK maps to an exception, and a message it shows the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    fn body(&self) -> serde_json::Value {
        serde_json::json!({"code": self.code.as_str(), "message": self.message})
    }
}

/// The unary error response: the code's status, and `{"code","message"}` as JSON (a plain-text
/// body would make the SDK fail on parsing instead of raising the right exception).
impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (self.code.http_status(), Json(self.body())).into_response()
    }
}

/// Splits a request body into envelopes as its chunks arrive: chunk boundaries (HTTP/1.1
/// chunked bodies, client-streaming input) have nothing to do with envelope boundaries.
#[derive(Debug, Default)]
pub struct EnvelopeDecoder {
    buf: BytesMut,
}

impl EnvelopeDecoder {
    pub fn new() -> EnvelopeDecoder {
        EnvelopeDecoder::default()
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete envelope as (flag, payload), or `None` until more bytes arrive.
    /// A compressed or oversized envelope is refused as soon as its header is in.
    #[allow(clippy::should_implement_trait)] // Fallible and needs more input: not an Iterator.
    pub fn next(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let flag = header[0];
        let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        if flag & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "compressed messages are not supported; send identity",
            ));
        }
        if len > MAX_MESSAGE {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("a message of {len} bytes is over the limit of {MAX_MESSAGE}"),
            ));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        Ok(Some((flag, self.buf.split_to(len).freeze())))
    }

    /// Checks, once the body has ended, that it did not end mid-envelope.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ConnectError::new(
                Code::InvalidArgument,
                "the request body ended inside a message",
            ))
        }
    }
}

/// The one message of a server-streaming call's request. The body is read to its end (chunked
/// or with a length; at most one message's worth), then must hold exactly one message envelope.
pub async fn read_single_message<T: DeserializeOwned>(body: Body) -> Result<T, ConnectError> {
    let mut decoder = EnvelopeDecoder::new();
    let mut stream = body.into_data_stream();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ConnectError::new(Code::Unknown, format!("reading the request body: {e}"))
        })?;
        total += chunk.len();
        if total > MAX_MESSAGE + HEADER_LEN {
            return Err(ConnectError::new(
                Code::ResourceExhausted,
                format!("the request body is over the limit of {MAX_MESSAGE} bytes"),
            ));
        }
        decoder.push(&chunk);
    }
    let payload = match decoder.next()? {
        Some((FLAG_MESSAGE, payload)) => payload,
        Some((flag, _)) => {
            return Err(ConnectError::new(
                Code::InvalidArgument,
                format!("unexpected envelope flags {flag:#04x} in the request"),
            ))
        }
        None => {
            decoder.finish()?;
            return Err(ConnectError::new(
                Code::InvalidArgument,
                "the request carried no message",
            ));
        }
    };
    if decoder.next()?.is_some() {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "this call takes exactly one request message",
        ));
    }
    decoder.finish()?;
    decode_json(&payload)
}

/// A unary call's request: bare JSON, where an empty body is the empty message.
pub fn decode_unary<T: DeserializeOwned>(body: &[u8]) -> Result<T, ConnectError> {
    decode_json(if body.is_empty() { b"{}" } else { body })
}

fn decode_json<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(json).map_err(|e| {
        ConnectError::new(
            Code::InvalidArgument,
            format!("invalid request message: {e}"),
        )
    })
}

/// A server stream's response: always 200 (errors go in the end-stream envelope). No
/// compression headers: envelopes go out as written, so output reaches the SDK as it happens.
pub fn stream_response(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/connect+json")],
        body,
    )
        .into_response()
}

/// A unary call's successful response.
pub fn unary_response<T: Serialize>(msg: &T) -> Response {
    (StatusCode::OK, Json(msg)).into_response()
}

/// The call's deadline from `Connect-Timeout-Ms`. envd uses it on `Start` as the process's
/// lifetime, so a missing, zero or unreadable value means "none" rather than "expired".
pub fn timeout_of(headers: &HeaderMap) -> Option<Duration> {
    let ms: u64 = headers
        .get("connect-timeout-ms")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// The user a call acts as, from `Authorization: Basic base64("<user>:")` (the SDK sends no
/// password; any is ignored). No header, or an empty user, means the sandbox's default user.
pub fn basic_user(headers: &HeaderMap) -> Result<Option<String>, ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let invalid = || ConnectError::new(Code::Unauthenticated, "invalid authorization header");
    let value = value.to_str().map_err(|_| invalid())?;
    let (scheme, encoded) = value.trim().split_once(' ').ok_or_else(invalid)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(invalid());
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| invalid())?;
    let decoded = String::from_utf8(decoded).map_err(|_| invalid())?;
    let (user, _password) = decoded.split_once(':').ok_or_else(invalid)?;
    Ok((!user.is_empty()).then(|| user.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_match_the_capture() {
        assert_eq!(&end_stream_ok()[..], b"\x02\x00\x00\x00\x02{}");
        let framed = message(&serde_json::json!({"a": 1}));
        assert_eq!(&framed[..], b"\x00\x00\x00\x00\x07{\"a\":1}");
        let err = ConnectError::new(Code::InvalidArgument, "cwd '/nope' does not exist");
        let framed = end_stream_error(&err);
        assert_eq!(framed[0], FLAG_END_STREAM);
        let payload: serde_json::Value = serde_json::from_slice(&framed[5..]).unwrap();
        assert_eq!(
            payload,
            serde_json::json!({"error": {"code": "invalid_argument", "message": "cwd '/nope' does not exist"}})
        );
    }

    #[test]
    fn decoder_handles_any_chunking() {
        let mut wire = envelope(FLAG_MESSAGE, b"{\"x\":1}").to_vec();
        wire.extend_from_slice(&envelope(FLAG_MESSAGE, b""));
        wire.extend_from_slice(&envelope(FLAG_MESSAGE, b"[2]"));

        let mut byte_by_byte = EnvelopeDecoder::new();
        let mut got = Vec::new();
        for b in &wire {
            byte_by_byte.push(std::slice::from_ref(b));
            while let Some(env) = byte_by_byte.next().unwrap() {
                got.push(env);
            }
        }
        byte_by_byte.finish().unwrap();
        let expected = vec![
            (0, Bytes::from_static(b"{\"x\":1}")),
            (0, Bytes::new()),
            (0, Bytes::from_static(b"[2]")),
        ];
        assert_eq!(got, expected);

        let mut one_chunk = EnvelopeDecoder::new();
        one_chunk.push(&wire);
        let all: Vec<_> = std::iter::from_fn(|| one_chunk.next().unwrap()).collect();
        assert_eq!(all, expected);
        one_chunk.finish().unwrap();
    }

    #[test]
    fn decoder_refuses_compression_oversize_and_truncation() {
        let mut d = EnvelopeDecoder::new();
        d.push(&[FLAG_COMPRESSED, 0, 0, 0, 1]);
        assert_eq!(d.next().unwrap_err().code, Code::InvalidArgument);

        let mut d = EnvelopeDecoder::new();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(d.next().unwrap_err().code, Code::ResourceExhausted);

        let mut d = EnvelopeDecoder::new();
        d.push(&[0, 0, 0, 0, 4, b'{']);
        assert_eq!(d.next().unwrap(), None);
        let err = d.finish().unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert_eq!(err.message, "the request body ended inside a message");
    }

    #[tokio::test]
    async fn single_message_bodies() {
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct M {
            x: u32,
        }
        let wire = envelope(FLAG_MESSAGE, b"{\"x\":7}");
        let chunks: Vec<Result<Bytes, std::io::Error>> = wire
            .chunks(3)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures::stream::iter(chunks));
        assert_eq!(read_single_message::<M>(body).await.unwrap(), M { x: 7 });

        let empty = read_single_message::<M>(Body::empty()).await.unwrap_err();
        assert_eq!(empty.code, Code::InvalidArgument);

        let mut two = wire.to_vec();
        two.extend_from_slice(&wire);
        let err = read_single_message::<M>(Body::from(two)).await.unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);

        let bad = read_single_message::<M>(Body::from(envelope(0, b"{\"x\":\"no\"}")))
            .await
            .unwrap_err();
        assert_eq!(bad.code, Code::InvalidArgument);
        assert!(bad.message.contains("invalid type"), "{}", bad.message);
    }

    #[test]
    fn unary_bodies() {
        let v: serde_json::Value = decode_unary(b"").unwrap();
        assert_eq!(v, serde_json::json!({}));
        let err = decode_unary::<serde_json::Value>(b"{nope").unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn unary_error_response() {
        let response =
            ConnectError::new(Code::NotFound, "process with pid 99999 not found").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"code": "not_found", "message": "process with pid 99999 not found"})
        );
    }

    #[test]
    fn statuses_follow_the_spec() {
        assert_eq!(Code::Canceled.http_status().as_u16(), 499);
        assert_eq!(Code::AlreadyExists.http_status(), StatusCode::CONFLICT);
        assert_eq!(
            Code::Unauthenticated.http_status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(Code::FailedPrecondition.as_str(), "failed_precondition");
    }

    #[test]
    fn stream_response_headers() {
        let response = stream_response(Body::empty());
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/connect+json"
        );
        assert!(response.headers().get(header::CONTENT_ENCODING).is_none());
    }

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, value.parse().unwrap());
        h
    }

    #[test]
    fn timeouts() {
        assert_eq!(
            timeout_of(&headers("connect-timeout-ms", "60000")),
            Some(Duration::from_secs(60))
        );
        assert_eq!(timeout_of(&headers("connect-timeout-ms", "0")), None);
        assert_eq!(timeout_of(&headers("connect-timeout-ms", "soon")), None);
        assert_eq!(timeout_of(&HeaderMap::new()), None);
    }

    #[test]
    fn basic_users() {
        let root = headers("authorization", "Basic cm9vdDo=");
        assert_eq!(basic_user(&root).unwrap().as_deref(), Some("root"));
        assert_eq!(basic_user(&HeaderMap::new()).unwrap(), None);
        for garbage in ["Basic !!!", "Bearer cm9vdDo=", "cm9vdDo=", "Basic cm9vdA=="] {
            let err = basic_user(&headers("authorization", garbage)).unwrap_err();
            assert_eq!(err.code, Code::Unauthenticated, "{garbage}");
            assert_eq!(err.message, "invalid authorization header");
        }
    }
}
