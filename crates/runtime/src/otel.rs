//! OpenTelemetry traces (docs/tracing.md): one span per hop of a request, exported over OTLP/gRPC,
//! with the W3C trace context carried from the client through every kvmesh process.
//!
//! Off unless the environment turns it on ([`Settings::from_env`]). While off, nothing is
//! extracted, allocated or exported: a [`Trace`] is then an empty `Option` and every
//! method on it returns at once, so the request path pays one branch per hop.

mod propagation;

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{SpanBuilder, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, Value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};

pub use self::propagation::{TRACEPARENT, TRACESTATE};
pub use opentelemetry::KeyValue;
pub use opentelemetry::trace::SpanKind;

/// Environment variables read here (the OpenTelemetry SDK reads the exporter's endpoint,
/// timeout, headers, sampler and batch settings itself).
pub mod env {
    /// Dynamo's switch for OTLP export (`true`/`1` turns tracing on).
    pub const EXPORT_ENABLED: &str = "OTEL_EXPORT_ENABLED";
    /// Standard: `true` turns the SDK off whatever else is set.
    pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
    /// Standard: `otlp` turns tracing on, `none` off; no other exporter is built in.
    pub const TRACES_EXPORTER: &str = "OTEL_TRACES_EXPORTER";
    /// Standard: where spans go (all signals); setting it turns tracing on.
    pub const EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    /// Standard: where spans go (traces only, wins over the generic one); turns tracing on.
    pub const EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
    /// Standard: the OTLP transport; only `grpc` is built in.
    pub const EXPORTER_OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
    /// Standard: the traces' OTLP transport; only `grpc` is built in.
    pub const EXPORTER_OTLP_TRACES_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL";
    /// Standard: the `service.name` of every span (else the binary's name).
    pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
}

/// Whether this process exports traces, as its environment says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Spans are made and exported.
    pub is_enabled: bool,
}

impl Settings {
    /// Reads the switches through `get` (the process environment in [`init`]). Tracing is on when
    /// `OTEL_EXPORT_ENABLED` is truthy, `OTEL_TRACES_EXPORTER` is `otlp`, or an OTLP endpoint is
    /// set; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off. An exporter or
    /// protocol this build does not have is an error, not a silent no-op.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let off = Self { is_enabled: false };
        let flag = |name: &str| -> Result<Option<bool>, String> {
            match get(name).filter(|v| !v.trim().is_empty()) {
                None => Ok(None),
                Some(value) => crate::config::parse_bool(value.trim())
                    .map(Some)
                    .map_err(|_| format!("{name}={value}: expected true or false")),
            }
        };
        if flag(env::SDK_DISABLED)? == Some(true) {
            return Ok(off);
        }
        let exporter = get(env::TRACES_EXPORTER).map(|v| v.trim().to_ascii_lowercase());
        match exporter.as_deref() {
            None | Some("") | Some("otlp") => {}
            Some("none") => return Ok(off),
            Some(other) => {
                return Err(format!(
                    "{}={other}: only otlp (or none) is built in",
                    env::TRACES_EXPORTER
                ));
            }
        }
        let has_endpoint = [
            env::EXPORTER_OTLP_ENDPOINT,
            env::EXPORTER_OTLP_TRACES_ENDPOINT,
        ]
        .iter()
        .any(|name| get(name).is_some_and(|v| !v.trim().is_empty()));
        let is_enabled = flag(env::EXPORT_ENABLED)? == Some(true)
            || exporter.as_deref() == Some("otlp")
            || has_endpoint;
        if is_enabled {
            for name in [
                env::EXPORTER_OTLP_TRACES_PROTOCOL,
                env::EXPORTER_OTLP_PROTOCOL,
            ] {
                if let Some(protocol) = get(name).filter(|v| !v.trim().is_empty()) {
                    if protocol.trim() != "grpc" {
                        return Err(format!(
                            "{name}={protocol}: only grpc is built in (OTLP/gRPC)"
                        ));
                    }
                    break;
                }
            }
        }
        Ok(Self { is_enabled })
    }
}

static TRACER: OnceLock<Tracer> = OnceLock::new();

/// Whether spans are made in this process (set once by [`init`]).
pub fn is_enabled() -> bool {
    TRACER.get().is_some()
}

/// Keeps the exporter of this process; dropping it flushes the spans not sent yet.
#[must_use = "dropping the guard stops the export"]
pub struct OtelGuard {
    provider: SdkTracerProvider,
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "trace export did not shut down cleanly");
        }
    }
}

/// Starts exporting spans when [`Settings::from_env`] says so, as `service` unless
/// `OTEL_SERVICE_NAME` names the process. Must run inside the Tokio runtime (the gRPC exporter's
/// connection lives on it). `Ok(None)`: tracing is off.
pub fn init(service: &str) -> Result<Option<OtelGuard>, String> {
    let settings = Settings::from_env(|name| std::env::var(name).ok())?;
    if !settings.is_enabled || TRACER.get().is_some() {
        return Ok(None);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|error| format!("OTLP trace exporter: {error}"))?;
    let mut resource = Resource::builder();
    if std::env::var_os(env::SERVICE_NAME).is_none_or(|v| v.is_empty()) {
        resource = resource.with_service_name(service.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let _ = TRACER.set(provider.tracer("kvmesh"));
    tracing::info!(service, "exporting traces over OTLP/gRPC");
    Ok(Some(OtelGuard { provider }))
}

/// Where a request is in its trace: the span of the current hop (or the caller's remote span,
/// before this process starts its own), or nothing when tracing is off or the request carries
/// no trace. Cheap to clone; the span ends at [`Trace::end`] or when the last clone goes.
#[derive(Clone, Default)]
pub struct Trace(Option<Context>);

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Trace(off)"),
            Some(cx) => {
                let span = cx.span();
                let sc = span.span_context();
                write!(f, "Trace({}-{})", sc.trace_id(), sc.span_id())
            }
        }
    }
}

impl Trace {
    /// No trace: every operation is a no-op.
    pub const fn off() -> Self {
        Self(None)
    }

    /// Whether spans are recorded under this context.
    pub fn is_active(&self) -> bool {
        self.0.is_some()
    }

    /// A root for a request arriving in this process: the caller's span from `traceparent` and
    /// `tracestate` when valid, else a new trace; off when tracing is off.
    pub fn from_carrier<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Self {
        if !is_enabled() {
            return Self::off();
        }
        Self(Some(propagation::extract(get)))
    }

    /// [`Trace::from_carrier`] over HTTP request headers.
    pub fn from_http(headers: &http::HeaderMap) -> Self {
        if !is_enabled() {
            return Self::off();
        }
        Self::from_carrier(|name| headers.get(name).and_then(|v| v.to_str().ok()))
    }

    /// [`Trace::from_carrier`] over gRPC request metadata.
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Self {
        if !is_enabled() {
            return Self::off();
        }
        Self::from_carrier(|name| metadata.get(name).and_then(|v| v.to_str().ok()))
    }

    /// A child span `name` of this context (off when this is off).
    pub fn child(&self, name: &'static str, kind: SpanKind) -> Self {
        let (Some(cx), Some(tracer)) = (&self.0, TRACER.get()) else {
            return Self::off();
        };
        let span = tracer.build_with_context(SpanBuilder::from_name(name).with_kind(kind), cx);
        Self(Some(cx.with_span(span)))
    }

    /// An internal child span.
    pub fn internal(&self, name: &'static str) -> Self {
        self.child(name, SpanKind::Internal)
    }

    /// Sets one attribute on the current span.
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// Sets the attributes `make` returns, called only when the span records (formatting
    /// values costs nothing while tracing is off).
    pub fn set_with(&self, make: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = &self.0 {
            cx.span().set_attributes(make());
        }
    }

    /// Adds a timestamped event (e.g. the first token).
    pub fn event(&self, name: &'static str) {
        if let Some(cx) = &self.0 {
            cx.span().add_event(name, Vec::new());
        }
    }

    /// Marks the span failed with `message`.
    pub fn fail(&self, message: impl std::fmt::Display) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(message.to_string()));
        }
    }

    /// Ends the current span now (later calls are no-ops).
    pub fn end(&self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }

    /// Writes `traceparent` (and `tracestate`) of the current span into gRPC request metadata,
    /// so that the callee's span becomes its child.
    pub fn inject_metadata(&self, metadata: &mut tonic::metadata::MetadataMap) {
        if let Some(cx) = &self.0 {
            propagation::inject(cx, |name, value| {
                if let Ok(value) = tonic::metadata::MetadataValue::try_from(value.as_str()) {
                    metadata.insert(name, value);
                }
            });
        }
    }

    /// `traceparent` and `tracestate` of the current span (empty strings when off), for a
    /// message that carries them in fields (one `RouteStream` carries many requests).
    pub fn to_fields(&self) -> (String, String) {
        let (mut parent, mut state) = (String::new(), String::new());
        if let Some(cx) = &self.0 {
            propagation::inject(cx, |name, value| {
                if name == TRACEPARENT {
                    parent = value;
                } else {
                    state = value;
                }
            });
        }
        (parent, state)
    }

    /// The root of a request whose caller sent `traceparent`/`tracestate` in message fields;
    /// off when tracing is off or the fields are empty (the caller did not trace it).
    pub fn from_fields(traceparent: &str, tracestate: &str) -> Self {
        if traceparent.is_empty() {
            return Self::off();
        }
        Self::from_carrier(|name| match name {
            TRACEPARENT => Some(traceparent),
            TRACESTATE => Some(tracestate),
            _ => None,
        })
    }

    /// The trace id in hex (`None` when off), for logs and tests.
    pub fn trace_id(&self) -> Option<String> {
        self.0
            .as_ref()
            .map(|cx| cx.span().span_context().trace_id().to_string())
    }

    /// The current span's id in hex (`None` when off): what code handed this request (a chat
    /// processor's `Context.span_id`) names as its parent.
    pub fn span_id(&self) -> Option<String> {
        self.0
            .as_ref()
            .map(|cx| cx.span().span_context().span_id().to_string())
    }
}

#[cfg(test)]
mod tests;
