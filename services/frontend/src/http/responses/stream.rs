//! The Responses stream: numbered events, with output items opened as the output needs them
//! (a `reasoning` item for thinking, a `message` item for the answer, a `function_call` item per
//! tool call), each closed before the next opens.

use axum::body::Bytes;
use serde::Serialize;
use serde_json::{Value, json};

use kvmesh_proto::v1::TokenLogprob;

use super::{ResponseShape, Status};
use crate::error::FrontendError;
use crate::generate::{TextDelta, TokenUsage};
use crate::http::sse;

/// One text or reasoning delta event (the per-token events).
#[derive(Serialize)]
struct TextDeltaEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    item_id: &'a str,
    output_index: u32,
    content_index: u32,
    delta: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<Value>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ItemKind {
    Reasoning,
    Message,
}

/// The item being written: its kind, output index, text and log probabilities so far.
struct OpenItem {
    kind: ItemKind,
    index: u32,
    text: String,
    logprobs: Vec<TokenLogprob>,
}

/// Responses events, each with the next `sequence_number`: created and in progress; then per
/// item `output_item.added`, its part or text deltas, and its done events; then
/// `response.completed` (or `response.incomplete` at `max_output_tokens`, `response.failed` on
/// an error) with every item.
pub(super) struct ResponsesFramer {
    shape: ResponseShape,
    sequence: u64,
    status: Status,
    open: Option<OpenItem>,
    /// Items closed so far, for the final response.
    done: Vec<Value>,
    /// Log probabilities of tokens whose text has not gone out in a message delta yet (held
    /// back, or thinking): they go with the next one.
    pending_logprobs: Vec<TokenLogprob>,
}

impl ResponsesFramer {
    pub(super) fn new(shape: ResponseShape) -> Self {
        Self {
            shape,
            sequence: 0,
            status: Status::Completed,
            open: None,
            done: Vec::new(),
            pending_logprobs: Vec::new(),
        }
    }

    fn event(&mut self, kind: &str, mut body: Value) -> Bytes {
        body["type"] = kind.into();
        body["sequence_number"] = self.sequence.into();
        self.sequence += 1;
        sse::named_event(kind, &body)
    }

    pub(super) fn opening(&mut self) -> Bytes {
        let response = self
            .shape
            .response(Status::InProgress, Vec::new(), None, None);
        let mut opening = self
            .event("response.created", json!({"response": response}))
            .to_vec();
        opening
            .extend_from_slice(&self.event("response.in_progress", json!({"response": response})));
        Bytes::from(opening)
    }

    fn item_id(&self, kind: ItemKind) -> String {
        match kind {
            ItemKind::Reasoning => self.shape.reasoning_id(),
            ItemKind::Message => self.shape.message_id.clone(),
        }
    }

    /// Opens an item of `kind` unless one is open, closing any other first.
    fn open(&mut self, kind: ItemKind, events: &mut Vec<Bytes>) {
        if self.open.as_ref().is_some_and(|item| item.kind == kind) {
            return;
        }
        self.close_item(events);
        let index = self.done.len() as u32;
        let item_id = self.item_id(kind);
        let mut item = match kind {
            ItemKind::Reasoning => self.shape.reasoning_item("", Status::InProgress),
            ItemKind::Message => self.shape.message("", &[], Status::InProgress),
        };
        item["content"] = json!([]);
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        ));
        if kind == ItemKind::Message {
            let part = self.shape.output_text("", &[]);
            events.push(self.event(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            ));
        }
        self.open = Some(OpenItem {
            kind,
            index,
            text: String::new(),
            logprobs: Vec::new(),
        });
    }

    fn close_item(&mut self, events: &mut Vec<Bytes>) {
        let Some(OpenItem {
            kind,
            index,
            text,
            logprobs,
        }) = self.open.take()
        else {
            return;
        };
        let item_id = self.item_id(kind);
        let item = match kind {
            ItemKind::Reasoning => {
                events.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                ));
                self.shape.reasoning_item(&text, Status::Completed)
            }
            ItemKind::Message => {
                let entries = self.shape.logprob_entries(&logprobs);
                events.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": entries}),
                ));
                let part = self.shape.output_text(&text, &logprobs);
                events.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                ));
                self.shape.message(&text, &logprobs, self.status)
            }
        };
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.done.push(item);
    }

    fn text(&mut self, kind: ItemKind, text: &str, events: &mut Vec<Bytes>) {
        self.open(kind, events);
        let item_id = self.item_id(kind);
        let Some(item) = self.open.as_mut() else {
            return;
        };
        item.text.push_str(text);
        let (event, logprobs) = match kind {
            ItemKind::Reasoning => ("response.reasoning_text.delta", None),
            ItemKind::Message => {
                let entries = self.shape.logprob_entries(&self.pending_logprobs);
                item.logprobs.append(&mut self.pending_logprobs);
                ("response.output_text.delta", Some(entries))
            }
        };
        events.push(sse::named_event(
            event,
            &TextDeltaEvent {
                kind: event,
                sequence_number: self.sequence,
                item_id: &item_id,
                output_index: item.index,
                content_index: 0,
                delta: text,
                logprobs,
            },
        ));
        self.sequence += 1;
    }

    fn function_call(
        &mut self,
        call_id: &str,
        name: &str,
        arguments: &str,
        events: &mut Vec<Bytes>,
    ) {
        self.close_item(events);
        let index = self.done.len() as u32;
        let added = self
            .shape
            .function_call_item(call_id, name, "", Status::InProgress);
        let item_id = added["id"].clone();
        events.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        events.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": index, "delta": arguments}),
        ));
        events.push(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "name": name, "arguments": arguments}),
        ));
        let item = self
            .shape
            .function_call_item(call_id, name, arguments, Status::Completed);
        events.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.done.push(item);
    }
}

impl sse::ChunkFramer for ResponsesFramer {
    fn delta(&mut self, delta: &TextDelta, events: &mut Vec<Bytes>) {
        if self.shape.logprobs.is_some() {
            self.pending_logprobs.extend_from_slice(&delta.logprobs);
        }
        if !delta.reasoning.is_empty() {
            self.text(ItemKind::Reasoning, &delta.reasoning, events);
        }
        if !delta.text.is_empty() {
            self.text(ItemKind::Message, &delta.text, events);
        }
        for call in &delta.tool_calls {
            let function = call.function.clone().unwrap_or_default();
            self.function_call(
                call.id.as_deref().unwrap_or_default(),
                function.name.as_deref().unwrap_or_default(),
                function.arguments.as_deref().unwrap_or_default(),
                events,
            );
        }
        if delta.finish_reason.is_some() {
            self.status = Status::of(delta.finish_reason);
        }
    }

    fn close(&mut self, usage: Option<TokenUsage>, events: &mut Vec<Bytes>) {
        if self.done.is_empty() && self.open.is_none() {
            self.open(ItemKind::Message, events);
        }
        let is_message_open = self
            .open
            .as_ref()
            .is_some_and(|item| item.kind == ItemKind::Message);
        if is_message_open && !self.pending_logprobs.is_empty() {
            // Tokens whose text never came out (a held-back tail) still get their entries.
            self.text(ItemKind::Message, "", events);
        }
        self.close_item(events);
        let output = std::mem::take(&mut self.done);
        let response = self.shape.response(self.status, output, usage, None);
        let kind = match self.status {
            Status::Incomplete => "response.incomplete",
            _ => "response.completed",
        };
        events.push(self.event(kind, json!({"response": response})));
    }

    fn error(&mut self, error: &FrontendError) -> Bytes {
        if error.is_private() {
            tracing::error!(%error, "worker failure mid-stream");
        }
        let body = error.body();
        let failure = json!({
            "code": body["error"]["type"],
            "message": body["error"]["message"],
        });
        let mut output = std::mem::take(&mut self.done);
        if let Some(item) = self.open.take() {
            output.push(match item.kind {
                ItemKind::Reasoning => self.shape.reasoning_item(&item.text, Status::Incomplete),
                ItemKind::Message => {
                    self.shape
                        .message(&item.text, &item.logprobs, Status::Incomplete)
                }
            });
        }
        let response = self
            .shape
            .response(Status::Failed, output, None, Some(failure));
        self.event("response.failed", json!({"response": response}))
    }
}
