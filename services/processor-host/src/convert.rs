//! The dicts a Dynamo processor exchanges with `routed_engine`, to and from kvmesh's contract:
//! the preprocessed request a processor builds becomes a `GenerateCall`, and each worker
//! response becomes the output dict `item.data()` returns (docs/processors.md, "Requests and
//! outputs"). Unknown keys are ignored, as Dynamo does.

use std::collections::HashMap;

use kvmesh_frontend::chat_output::offered_tools_request;
use kvmesh_llm::openai::{ChatTool, ToolChoice};
use kvmesh_proto::v1::{
    FinishReason, GenerateCall, GenerateRequest, GenerateResponse, OutputOptions, RoutingHints,
    SamplingOptions, StopConditions, ToolsRequest,
};
use serde::Deserialize;
use serde_json::{Value, json};

/// Dynamo's preprocessed request, as processors build it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Preprocessed {
    model: Option<String>,
    token_ids: Option<Vec<u32>>,
    stop_conditions: Stops,
    sampling_options: Sampling,
    output_options: Output,
    eos_token_ids: Vec<u32>,
    routing: Option<Routing>,
    lora_name: Option<String>,
    /// kvmesh addition, in the chat request's own shape: the tools it offered, so a worker that
    /// decides its calls from them (the mock engine) sees them as on the built-in path.
    tools: Option<Vec<ChatTool>>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Stops {
    max_tokens: Option<u32>,
    min_tokens: Option<u32>,
    stop: Option<Vec<String>>,
    stop_token_ids: Option<Vec<u32>>,
    stop_token_ids_hidden: Option<Vec<u32>>,
    ignore_eos: Option<bool>,
    max_thinking_tokens: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Sampling {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    seed: Option<i64>,
    guided_decoding: Option<Guided>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Guided {
    json: Option<Value>,
    regex: Option<String>,
    choice: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Output {
    logprobs: Option<u32>,
    prompt_logprobs: Option<u32>,
    skip_special_tokens: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Routing {
    backend_instance_id: Option<u64>,
    decode_worker_id: Option<u64>,
    prefill_worker_id: Option<u64>,
    dp_rank: Option<u32>,
    prefill_dp_rank: Option<u32>,
    expected_output_tokens: Option<u32>,
    lora_name: Option<String>,
    priority: Option<i32>,
    allowed_worker_ids: Option<Vec<u64>>,
    session_control: Option<SessionControl>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SessionControl {
    session_id: Option<String>,
    action: Option<String>,
    timeout: Option<u32>,
}

/// Reads a processor's preprocessed request (JSON) into a generate call. `request_id` is the
/// frontend's id of the chat request; `token_ids` is the one required key.
pub fn generate_call(
    call_id: u64,
    request_id: &str,
    default_model: &str,
    json: &str,
) -> Result<GenerateCall, String> {
    let value: Value =
        serde_json::from_str(json).map_err(|e| format!("preprocessed request: {e}"))?;
    let is_token_list = value
        .get("token_ids")
        .and_then(Value::as_array)
        .is_some_and(|ids| {
            ids.iter()
                .all(|id| id.as_u64().is_some_and(|id| id <= u64::from(u32::MAX)))
        });
    if !is_token_list {
        return Err("preprocessed request: `token_ids` (a list of token ids) is required".into());
    }
    let mut request: Preprocessed =
        serde_json::from_value(value).map_err(|e| format!("preprocessed request: {e}"))?;
    let tools = tools_request(&mut request)?;
    let token_ids = request.token_ids.unwrap_or_default();
    let stops = request.stop_conditions;
    let mut stop_token_ids = stops.stop_token_ids.unwrap_or_default();
    stop_token_ids.extend(stops.stop_token_ids_hidden.unwrap_or_default());
    let ignore_eos = stops.ignore_eos.unwrap_or(false);
    if !ignore_eos {
        stop_token_ids.extend(request.eos_token_ids);
    }
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    let sampling = request.sampling_options;
    let guided = sampling.guided_decoding.unwrap_or_default();
    let routing = request.routing.unwrap_or_default();
    let session = routing.session_control.unwrap_or_default();
    let binds = session.action.as_deref() == Some("bind");
    let generate = GenerateRequest {
        request_id: format!("{request_id}-{call_id}"),
        model: request.model.unwrap_or_else(|| default_model.to_owned()),
        token_ids,
        sampling: Some(SamplingOptions {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k.filter(|k| *k > 0),
            min_p: sampling.min_p,
            repetition_penalty: sampling.repetition_penalty,
            presence_penalty: sampling.presence_penalty,
            frequency_penalty: sampling.frequency_penalty,
            seed: sampling.seed.map(|seed| seed as u64),
            greedy: sampling.temperature == Some(0.0),
            guided_json_schema: guided.json.map(|schema| schema.to_string()),
            guided_regex: guided.regex,
            guided_choice: guided.choice.unwrap_or_default(),
        }),
        stop: Some(StopConditions {
            max_tokens: stops.max_tokens,
            min_tokens: stops.min_tokens.filter(|n| *n > 0),
            stop_token_ids,
            ignore_eos,
            stop: stops.stop.unwrap_or_default(),
            max_thinking_tokens: stops.max_thinking_tokens,
        }),
        output: Some(OutputOptions {
            logprobs: request.output_options.logprobs,
            prompt_logprobs: request.output_options.prompt_logprobs,
            skip_special_tokens: request.output_options.skip_special_tokens.unwrap_or(true),
        }),
        routing: Some(RoutingHints {
            backend_instance_id: routing.backend_instance_id.or(routing.decode_worker_id),
            dp_rank: routing.dp_rank,
            prefill_worker_id: routing.prefill_worker_id,
            prefill_dp_rank: routing.prefill_dp_rank,
            priority: routing.priority.unwrap_or(0),
            expected_output_tokens: routing.expected_output_tokens,
            session_id: session.session_id.unwrap_or_default(),
            ..Default::default()
        }),
        lora_name: routing.lora_name.or(request.lora_name).unwrap_or_default(),
        tools,
        ..Default::default()
    };
    Ok(GenerateCall {
        call_id,
        request: Some(generate),
        allowed_worker_ids: routing.allowed_worker_ids.unwrap_or_default(),
        session_bind_ttl_secs: if binds {
            session.timeout.unwrap_or(300)
        } else {
            0
        },
    })
}

/// The worker's view of the tools a preprocessed request offers, built as the built-in path
/// builds it from a chat request: none when it offers none or `tool_choice` is `none`.
fn tools_request(request: &mut Preprocessed) -> Result<Option<ToolsRequest>, String> {
    let choice = match request.tool_choice.take() {
        None | Some(Value::Null) => None,
        Some(value) => Some(serde_json::from_value::<ToolChoice>(value).map_err(|_| {
            "preprocessed request: tool_choice must be auto, required, none or \
             {\"function\": {\"name\": ...}}"
                .to_owned()
        })?),
    };
    Ok(offered_tools_request(
        request.tools.as_deref().unwrap_or_default(),
        choice.as_ref(),
        request.parallel_tool_calls,
    ))
}

/// Dynamo's name of a finish reason.
fn finish_name(reason: FinishReason) -> Option<&'static str> {
    match reason {
        FinishReason::Unspecified => None,
        FinishReason::Eos => Some("eos"),
        FinishReason::Stop => Some("stop"),
        FinishReason::Length => Some("length"),
        FinishReason::Cancelled => Some("cancelled"),
        FinishReason::ContentFilter => Some("content_filter"),
        FinishReason::Error => Some("error"),
    }
}

/// The output dict of one worker response (JSON), as `item.data()` returns it.
pub fn output_json(response: &GenerateResponse) -> String {
    let mut out = serde_json::Map::new();
    out.insert("token_ids".into(), json!(response.token_ids));
    if let Some(text) = &response.text {
        out.insert("text".into(), json!(text));
    }
    match finish_name(response.finish_reason()) {
        Some("error") => {
            out.insert("finish_reason".into(), json!({ "error": response.error }));
        }
        Some(name) => {
            out.insert("finish_reason".into(), json!(name));
        }
        None => {}
    }
    if let Some(token) = response.matched_stop_token_id {
        out.insert("stop_reason".into(), json!(token));
    }
    if !response.logprobs.is_empty() {
        let log_probs: Vec<f32> = response.logprobs.iter().map(|t| t.logprob).collect();
        out.insert("log_probs".into(), json!(log_probs));
        let top: Vec<Vec<HashMap<&str, Value>>> = response
            .logprobs
            .iter()
            .map(|token| {
                token
                    .top
                    .iter()
                    .map(|top| {
                        HashMap::from([
                            ("token_id", json!(top.token_id)),
                            ("logprob", json!(top.logprob)),
                        ])
                    })
                    .collect()
            })
            .collect();
        out.insert("top_logprobs".into(), json!(top));
    }
    if let Some(usage) = &response.usage {
        out.insert(
            "completion_usage".into(),
            json!({
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
            }),
        );
    }
    if let Some(worker) = &response.worker {
        out.insert(
            "disaggregated_params".into(),
            json!({ "worker_id": {"decode_worker_id": worker.worker_id, "decode_dp_rank": worker.dp_rank} }),
        );
    }
    Value::Object(out).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamo_request_maps_every_part() {
        let call = generate_call(
            3,
            "req",
            "tiny",
            r#"{"token_ids":[1,2,3],"stop_conditions":{"max_tokens":7,"stop_token_ids_hidden":[9],
                "stop_token_ids":[8]},"eos_token_ids":[2],"sampling_options":{"temperature":0.0,
                "guided_decoding":{"json":{"type":"object"}}},"routing":{"backend_instance_id":42,
                "priority":2,"allowed_worker_ids":[42,43],"session_control":{"session_id":"s",
                "action":"bind","timeout":30}},"unknown":{"ignored":true}}"#,
        )
        .unwrap();
        let request = call.request.unwrap();
        assert_eq!(request.request_id, "req-3");
        assert_eq!(request.model, "tiny");
        assert_eq!(request.token_ids, vec![1, 2, 3]);
        let stop = request.stop.unwrap();
        assert_eq!(stop.max_tokens, Some(7));
        assert_eq!(stop.stop_token_ids, vec![2, 8, 9]);
        let sampling = request.sampling.unwrap();
        assert!(sampling.greedy);
        assert_eq!(
            sampling.guided_json_schema.as_deref(),
            Some(r#"{"type":"object"}"#)
        );
        let routing = request.routing.unwrap();
        assert_eq!(routing.backend_instance_id, Some(42));
        assert_eq!(routing.priority, 2);
        assert_eq!(routing.session_id, "s");
        assert_eq!(call.allowed_worker_ids, vec![42, 43]);
        assert_eq!(call.session_bind_ttl_secs, 30);
    }

    #[test]
    fn offered_tools_reach_the_worker_as_on_the_built_in_path() {
        let tools = r#""tools":[{"type":"function","function":{"name":"get_time",
            "parameters":{"type":"object"}}},{"type":"function","function":{"name":"get_weather"}}]"#;
        let call = |rest: &str| {
            generate_call(
                0,
                "r",
                "m",
                &format!(r#"{{"token_ids":[1],{tools}{rest}}}"#),
            )
            .map(|call| call.request.unwrap().tools)
        };
        let auto = call("").unwrap().unwrap();
        assert_eq!(auto.choice, "auto");
        assert!(auto.parallel);
        assert_eq!(auto.tools[0].name, "get_time");
        assert_eq!(auto.tools[0].parameters_json, r#"{"type":"object"}"#);
        assert_eq!(auto.tools[1].parameters_json, "");
        let named = call(
            r#","tool_choice":{"type":"function","function":{"name":"get_weather"}},
            "parallel_tool_calls":false"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (named.choice.as_str(), named.named_function.as_str()),
            ("named", "get_weather")
        );
        assert!(!named.parallel);
        assert_eq!(call(r#","tool_choice":"none""#).unwrap(), None);
        assert!(
            call(r#","tool_choice":"sometimes""#)
                .unwrap_err()
                .contains("tool_choice")
        );
        let none = generate_call(0, "r", "m", r#"{"token_ids":[1]}"#).unwrap();
        assert_eq!(none.request.unwrap().tools, None);
    }

    #[test]
    fn token_ids_are_required_and_bad_json_is_refused() {
        assert!(
            generate_call(0, "r", "m", r#"{"model":"m"}"#)
                .unwrap_err()
                .contains("token_ids")
        );
        assert!(generate_call(0, "r", "m", "[1,2]").is_err());
    }

    #[test]
    fn an_output_reads_as_dynamo_writes_it() {
        let response = GenerateResponse {
            token_ids: vec![5, 6],
            finish_reason: FinishReason::Length as i32,
            usage: Some(kvmesh_proto::v1::Usage {
                prompt_tokens: 3,
                completion_tokens: 2,
                cached_tokens: 1,
            }),
            ..Default::default()
        };
        let out: Value = serde_json::from_str(&output_json(&response)).unwrap();
        assert_eq!(out["token_ids"], json!([5, 6]));
        assert_eq!(out["finish_reason"], "length");
        assert_eq!(out["completion_usage"]["total_tokens"], 5);
        let failed = GenerateResponse {
            finish_reason: FinishReason::Error as i32,
            error: "boom".into(),
            ..Default::default()
        };
        let out: Value = serde_json::from_str(&output_json(&failed)).unwrap();
        assert_eq!(out["finish_reason"], json!({"error": "boom"}));
    }
}
