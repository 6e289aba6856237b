//! `--interactive` (`-i`): a chat REPL on stdin and stdout against the served model, instead of
//! the HTTP edge. Each line typed is a user turn; the answer streams back through the same chat
//! path the HTTP endpoints use, and the conversation grows turn by turn. End of input (Ctrl-D)
//! ends the session and the process.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use futures::StreamExt;
use kvmesh_llm::openai::{ChatCompletionRequest, ChatMessage};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use crate::http::AppState;
use crate::http::chat;
use crate::http::endpoint::{Arrival, ResponseHeaders};
use crate::http::request_metrics::EarlyRequest;
use crate::preprocess::RequestTimer;

/// What the REPL prints before reading a turn.
pub const PROMPT: &str = "user> ";

/// Most tokens one answer may have.
const MAX_ANSWER_TOKENS: i64 = 256;

/// Runs the REPL until stdin ends or `stop` fires, then cancels `stop` so the process ends.
pub async fn repl(state: Arc<AppState>, stop: CancellationToken) {
    let Some(model) = wait_for_model(&state, &stop).await else {
        return;
    };
    println!("kvmesh interactive chat with {model}; end with Ctrl-D");
    let mut history: Vec<ChatMessage> = Vec::new();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        print!("{PROMPT}");
        let _ = std::io::stdout().flush();
        let line = tokio::select! {
            line = lines.next_line() => line,
            () = stop.cancelled() => break,
        };
        let Ok(Some(line)) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        history.push(ChatMessage::new("user", line));
        match answer(&state, &model, &history).await {
            Ok(text) => history.push(ChatMessage::new("assistant", text)),
            Err(error) => {
                history.pop();
                eprintln!("error: {}", error.public_message());
            }
        }
    }
    stop.cancel();
}

async fn wait_for_model(state: &AppState, stop: &CancellationToken) -> Option<String> {
    loop {
        let mut ready: Vec<String> = state
            .models
            .load()
            .values()
            .filter(|entry| !entry.routing.workers().is_empty())
            .map(|entry| entry.name.clone())
            .collect();
        ready.sort();
        if let Some(first) = ready.into_iter().next() {
            return Some(first);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = stop.cancelled() => return None,
        }
    }
}

/// Streams one answer to stdout and returns its text.
async fn answer(
    state: &Arc<AppState>,
    model: &str,
    history: &[ChatMessage],
) -> Result<String, crate::error::FrontendError> {
    let request = Arc::new(ChatCompletionRequest {
        model: model.to_string(),
        messages: history.to_vec(),
        max_tokens: Some(MAX_ANSWER_TOKENS),
        stream: Some(true),
        ..Default::default()
    });
    let request_id = uuid::Uuid::new_v4().to_string();
    let headers = HeaderMap::new();
    let mut early = EarlyRequest::default();
    let response_headers = ResponseHeaders::default();
    let arrival = Arrival {
        request_id: &request_id,
        headers: &headers,
        body_len: 0,
        timer: RequestTimer::start(&state.preprocess),
        early: &mut early,
        response_headers: &response_headers,
    };
    let started = chat::start(state, "interactive", &request, arrival).await?;
    let mut scope = started.scope;
    let mut deltas = std::pin::pin!(started.deltas);
    let mut text = String::new();
    let mut stdout = std::io::stdout();
    while let Some(delta) = deltas.next().await {
        match delta {
            Ok(delta) => {
                let _ = stdout.write_all(delta.text.as_bytes());
                let _ = stdout.flush();
                text.push_str(&delta.text);
            }
            Err(error) => {
                scope.finish(Some(&error));
                println!();
                return Err(error);
            }
        }
    }
    scope.finish(None);
    println!();
    Ok(text)
}
