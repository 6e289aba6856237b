//! The frame every generating endpoint shares: read the request id, refuse while draining, read
//! and parse the body (a large one on the preprocessing pool), hand the parsed request to the
//! endpoint, then count an early failure and answer it in the endpoint's protocol, and stamp
//! `x-request-id` on whatever goes out. Each endpoint writes only what is its own.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::de::DeserializeOwned;

use super::request_metrics::EarlyRequest;
use super::{AppState, parse_json, read_body, request_id, with_request_id};
use crate::error::FrontendError;
use crate::preprocess::RequestTimer;

/// Whose error body an endpoint answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorShape {
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

/// Response headers set while serving (a chat processor's `context.set_response_header`),
/// added to whatever response goes out, error responses included.
pub(crate) type ResponseHeaders = Arc<Mutex<Vec<(String, String)>>>;

/// What an endpoint needs alongside its parsed request.
pub(crate) struct Arrival<'a> {
    /// The client's `x-request-id`, or a new one.
    pub request_id: &'a str,
    /// The request's headers (routing hints, session).
    pub headers: &'a HeaderMap,
    /// The body's size in bytes, which decides whether later stages go to the pool.
    pub body_len: usize,
    /// Started before the body was read, so parsing counts as preprocessing.
    pub timer: RequestTimer,
    /// What is known before the request's scope exists, for counting a failure.
    pub early: &'a mut EarlyRequest,
    /// Headers to add to the response.
    pub response_headers: &'a ResponseHeaders,
}

/// One generating endpoint: its request type and what it does with a parsed request.
pub(crate) trait Endpoint {
    /// The endpoint's label in metrics (`endpoint="…"`).
    const NAME: &'static str;
    /// Whose error body it answers with.
    const ERRORS: ErrorShape = ErrorShape::OpenAi;
    /// The request body's type.
    type Request: DeserializeOwned + Send + 'static;

    /// Parses the body; the default is strict JSON with a 400 that says what is wrong.
    fn parse(body: &[u8]) -> Result<Self::Request, FrontendError> {
        parse_json(body)
    }

    /// Serves a parsed request.
    fn handle(
        state: &Arc<AppState>,
        request: Self::Request,
        arrival: Arrival<'_>,
    ) -> impl Future<Output = Result<Response, FrontendError>> + Send;
}

/// The axum handler of endpoint `E`.
pub(crate) async fn serve<E: Endpoint>(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request_id = request_id(&headers);
    let mut early = EarlyRequest::default();
    let response_headers = ResponseHeaders::default();
    let received = receive::<E>(
        &state,
        &request_id,
        &headers,
        body,
        &mut early,
        &response_headers,
    );
    let response = match received.await {
        Ok(response) => response,
        Err(error) => {
            early.count_failure(&state, E::NAME, &error);
            match E::ERRORS {
                ErrorShape::OpenAi => state.error_response(error),
                ErrorShape::Anthropic => {
                    error.into_anthropic_response_with(state.settings.overload_status)
                }
            }
        }
    };
    with_request_id(with_headers(response, &response_headers), &request_id)
}

/// Adds the headers set while serving (checked by the processor host; one that is still not a
/// valid header is skipped).
fn with_headers(mut response: Response, headers: &ResponseHeaders) -> Response {
    let headers = std::mem::take(&mut *headers.lock().unwrap_or_else(PoisonError::into_inner));
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

async fn receive<E: Endpoint>(
    state: &Arc<AppState>,
    request_id: &str,
    headers: &HeaderMap,
    body: Body,
    early: &mut EarlyRequest,
    response_headers: &ResponseHeaders,
) -> Result<Response, FrontendError> {
    state.check_accepting()?;
    let timer = RequestTimer::start(&state.preprocess);
    let body = read_body(state, headers, body).await?;
    let body_len = body.len();
    let request = state
        .preprocess
        .offload(body_len, move || E::parse(&body))
        .await?;
    let arrival = Arrival {
        request_id,
        headers,
        body_len,
        timer,
        early,
        response_headers,
    };
    E::handle(state, request, arrival).await
}
