//! The HTTP edge's fuzz entries: each takes a request body as a client sends it and runs the
//! same parsing and checks the endpoint runs before it needs a model (docs/security.md,
//! "Fuzzing"). A body that fails must fail as a client error in the endpoint's own error shape.

use kvmesh_llm::openai::ChatCompletionRequest;

use super::anthropic::Messages;
use super::chat::{self, ChatCompletions};
use super::completions::Completions;
use super::endpoint::Endpoint;
use super::responses::Responses;
use crate::error::FrontendError;

/// `POST /v1/chat/completions`: parse, legacy `functions`, the checks, the routing `nvext`; a
/// request that passes survives a JSON round trip unchanged but for the in-process `stop_field`
/// (the processor host gets it so).
pub fn chat_completions(body: &[u8]) {
    let checked = ChatCompletions::parse(body).and_then(|mut request| {
        request.adopt_legacy_functions()?;
        check_chat(&request)?;
        Ok(request)
    });
    match checked {
        Ok(request) => assert_round_trip(&request),
        Err(error) => assert_client_error(&error),
    }
}

/// `POST /v1/completions`: parse (with its second, precise reading of a bad body) and the checks.
pub fn completions(body: &[u8]) {
    let checked = Completions::parse(body).and_then(|request| {
        crate::completion::check(&request)?;
        routing_nvext(request.nvext.as_ref())
    });
    if let Err(error) = checked {
        assert_client_error(&error);
    }
}

/// `POST /v1/responses`: parse, the translation to a chat request and the chat checks.
pub fn responses(body: &[u8]) {
    let checked = Responses::parse(body).and_then(|request| {
        let chat = request.to_chat()?;
        check_chat(&chat)?;
        Ok(chat)
    });
    match checked {
        Ok(chat) => assert_round_trip(&chat),
        Err(error) => assert_client_error(&error),
    }
}

/// `POST /v1/messages` and `/v1/messages/count_tokens`: parse, the billing preamble strip, the
/// translation to a chat request and the chat checks, answered in Anthropic's error shape.
pub fn anthropic_messages(body: &[u8]) {
    let checked = Messages::parse(body).and_then(|mut request| {
        request.strip_billing_preamble();
        let chat = request.to_chat()?;
        check_chat(&chat)?;
        Ok(chat)
    });
    match checked {
        Ok(chat) => assert_round_trip(&chat),
        Err(error) => {
            assert_client_error(&error);
            assert_eq!(error.anthropic_body()["type"], "error");
        }
    }
    let counted = super::parse_json::<kvmesh_llm::anthropic::CountTokensRequest>(body).and_then(
        |mut request| {
            request.strip_billing_preamble();
            Ok(request.to_chat()?)
        },
    );
    if let Err(error) = counted {
        assert_client_error(&error);
    }
}

/// What `chat::start` checks before it looks the model up.
fn check_chat(request: &ChatCompletionRequest) -> Result<(), FrontendError> {
    chat::check(request)?;
    routing_nvext(request.nvext.as_ref())
}

fn routing_nvext(nvext: Option<&serde_json::Value>) -> Result<(), FrontendError> {
    let mut hints = kvmesh_routing::RoutingHints::default();
    if let Some(nvext) = nvext {
        crate::hints::apply_nvext(&mut hints, nvext)?;
    }
    Ok(())
}

/// Bad input is the client's fault: a 4xx (or 501 for what this release does not do), never a
/// 5xx that would page someone, and always an error body with a message.
pub(crate) fn assert_client_error(error: &FrontendError) {
    let status = error.http_status(529);
    assert!(
        (400..500).contains(&status) || status == 501,
        "bad input answered {status}: {error}"
    );
    assert!(error.body()["error"]["message"].is_string());
}

fn assert_round_trip(request: &ChatCompletionRequest) {
    let Ok(json) = serde_json::to_vec(request) else {
        panic!("a checked chat request does not serialize: {request:?}");
    };
    match serde_json::from_slice::<ChatCompletionRequest>(&json) {
        Ok(again) => {
            // Compared as JSON (`stop_field`, which field `stop` came from, is never serialized),
            // numbers to the last bits: serde_json's default float parser is not correctly
            // rounded, so a long float may read back one unit in the last place away.
            let (before, after) = (serde_json::to_value(request), serde_json::to_value(&again));
            let (Ok(before), Ok(after)) = (before, after) else {
                panic!("a checked chat request does not serialize: {request:?}");
            };
            assert!(
                same_json(&before, &after),
                "{}\nread back as\n{after}",
                String::from_utf8_lossy(&json)
            );
        }
        Err(error) => panic!(
            "a checked chat request does not read back: {error}: {}",
            String::from_utf8_lossy(&json)
        ),
    }
}

/// Whether two JSON values are equal, numbers within a relative 1e-12 of each other.
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            x == y
                || matches!((x.as_f64(), y.as_f64()), (Some(x), Some(y))
                    if (x - y).abs() <= 1e-12 * x.abs().max(y.abs()))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, x)| y.get(key).is_some_and(|y| same_json(x, y)))
        }
        _ => a == b,
    }
}
