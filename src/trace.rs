//! One trace per build (ADR 0015): the trace starts at the SDK's first request (its W3C
//! `traceparent` is honoured) or, without one, at the build's registration; every later piece
//! of work on the build (start, uploads, the worker's attempt with its steps and promotion, a
//! reconciler closing it) runs in a span whose parent is the registration's span, found in the
//! metadata of the build stream's first event. Every event appended inside a span records that
//! span's trace and span ids ([`current`], used by [`crate::events::Metadata::new`]), so the
//! audit history links to the trace.
//!
//! Spans carry OpenTelemetry contexts whenever the process installed the OpenTelemetry layer
//! ([`crate::telemetry::init`] always does; export needs `OTEL_EXPORTER_OTLP_ENDPOINT`). In a
//! process without it (tests with a plain subscriber), there are no ids and nothing is recorded.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::domain::ids::BuildId;
use crate::events::EventStore;

/// A span's place in a trace, as lowercase hex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceIds {
    pub trace_id: String,
    pub span_id: String,
}

/// The current span's trace and span ids, when it has a valid OpenTelemetry context.
pub fn current() -> Option<TraceIds> {
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| TraceIds {
        trace_id: sc.trace_id().to_string(),
        span_id: sc.span_id().to_string(),
    })
}

/// Parses a W3C `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`).
pub fn parse_traceparent(value: &str) -> Option<TraceIds> {
    let mut parts = value.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if version == "ff" || !hex(version, 2) || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let ids = TraceIds {
        trace_id: trace.to_ascii_lowercase(),
        span_id: span.to_ascii_lowercase(),
    };
    remote_context(&ids).map(|_| ids)
}

/// A remote parent context for `ids`; `None` for all-zero (invalid) ids.
fn remote_context(ids: &TraceIds) -> Option<opentelemetry::Context> {
    let trace = TraceId::from_hex(&ids.trace_id).ok()?;
    let span = SpanId::from_hex(&ids.span_id).ok()?;
    let sc = SpanContext::new(
        trace,
        span,
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    sc.is_valid()
        .then(|| opentelemetry::Context::new().with_remote_span_context(sc))
}

/// Makes `span` (not yet entered) a child of `parent`. Without the OpenTelemetry layer this does
/// nothing.
pub fn set_parent(span: &tracing::Span, parent: &TraceIds) {
    if let Some(cx) = remote_context(parent) {
        let _ = span.set_parent(cx);
    }
}

/// The trace ids recorded on the build's registration (its stream's first event).
pub async fn of_build(store: &EventStore, build: BuildId) -> Option<TraceIds> {
    let stream = crate::streams::build_stream(&build);
    let registration = store
        .read_stream(&stream, 1, 1)
        .await
        .ok()?
        .into_iter()
        .next()?;
    Some(TraceIds {
        trace_id: registration.metadata.trace_id?,
        span_id: registration.metadata.span_id?,
    })
}

/// A span named `name` for work on `build`, in the build's trace (a root span when the build's
/// registration recorded none). Enter it, or `.instrument(span)` the work.
pub async fn build_span(store: &EventStore, build: BuildId, name: &str) -> tracing::Span {
    let span = tracing::info_span!("build_work", otel.name = name, build = %build);
    if let Some(parent) = of_build(store, build).await {
        set_parent(&span, &parent);
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_strictly() {
        let ids =
            parse_traceparent("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(ids.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ids.span_id, "00f067aa0ba902b7");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }
}
