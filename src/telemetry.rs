//! Tracing setup: readable structured logs on stderr, and OpenTelemetry span contexts on every
//! span (so events record trace ids, see `crate::trace`), exported over OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Keeps the OTLP pipeline alive; flushes pending spans when dropped.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(err) = provider.shutdown() {
                eprintln!("strata: flushing traces failed: {err}");
            }
        }
    }
}

/// Log format on stderr.
#[derive(Debug, Clone, Copy, clap::ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines with key=value fields.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber. `RUST_LOG` filters (default `info`).
pub fn init(format: LogFormat) -> anyhow::Result<TelemetryGuard> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,sqlx=warn,sqlx::postgres::notice=error,tower_http=info")
    });

    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("strata")
        .build();
    // Without an endpoint the provider has no exporter: spans still get trace and span ids
    // (recorded on events), and are dropped when they end.
    let mut builder = SdkTracerProvider::builder().with_resource(resource);
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_some() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    let otel_layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("strata"));
    let provider = Some(provider);

    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    match format {
        LogFormat::Text => registry
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .try_init()?,
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init()?,
    }
    Ok(TelemetryGuard { provider })
}
