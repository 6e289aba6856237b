//! A minimal HTTP/1.1 client for the harness's tests: one connection per request, SSE read as it
//! streams.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

/// How one streamed chat ended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamOutcome {
    /// The HTTP status.
    pub status: u16,
    /// `completion_tokens` of the final usage chunk, if one came.
    pub completion_tokens: Option<u64>,
    /// The first error the stream carried (an SSE error event, or the error body of a non-200).
    pub error: Option<String>,
}

async fn send(
    base_url: &str,
    request: http::Request<Full<Bytes>>,
) -> anyhow::Result<http::Response<hyper::body::Incoming>> {
    let authority = base_url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("not an http:// URL: {base_url}"))?;
    let stream = tokio::net::TcpStream::connect(authority).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender.send_request(request).await?)
}

/// `GET {path}`: the status and the body.
pub async fn get(base_url: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let request = http::Request::get(path)
        .header(http::header::HOST, "harness")
        .body(Full::new(Bytes::new()))?;
    let response = send(base_url, request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// Streams one `/v1/chat/completions` request with `body` (its `stream` is forced on, with
/// usage), reading every SSE event as it arrives.
pub async fn stream_chat(base_url: &str, body: serde_json::Value) -> anyhow::Result<StreamOutcome> {
    stream_chat_slowly(base_url, body, std::time::Duration::ZERO).await
}

/// [`stream_chat`] by a client that pauses `pause` after every piece of the body it reads, as a
/// slow or distant client does: the frontend then holds what the client has not taken yet.
pub async fn stream_chat_slowly(
    base_url: &str,
    mut body: serde_json::Value,
    pause: std::time::Duration,
) -> anyhow::Result<StreamOutcome> {
    body["stream"] = serde_json::Value::Bool(true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let request = http::Request::post("/v1/chat/completions")
        .header(http::header::HOST, "harness")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let response = send(base_url, request).await?;
    let mut outcome = StreamOutcome {
        status: response.status().as_u16(),
        ..Default::default()
    };
    let mut body = response.into_body();
    if outcome.status != 200 {
        let text = body.collect().await?.to_bytes();
        outcome.error = Some(String::from_utf8_lossy(&text).into_owned());
        return Ok(outcome);
    }
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = pending.drain(..end + 2).collect();
            read_event(&String::from_utf8_lossy(&event), &mut outcome);
        }
    }
    Ok(outcome)
}

/// Takes the usage or the error out of one SSE event.
fn read_event(event: &str, outcome: &mut StreamOutcome) {
    for line in event.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(value) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        if let Some(error) = value.get("error")
            && outcome.error.is_none()
        {
            outcome.error = Some(error.to_string());
        }
        if let Some(tokens) = value
            .get("usage")
            .and_then(|usage| usage.get("completion_tokens"))
            .and_then(serde_json::Value::as_u64)
        {
            outcome.completion_tokens = Some(tokens);
        }
    }
}
