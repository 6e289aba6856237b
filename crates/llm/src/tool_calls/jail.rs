//! Tool calls read from a stream of text: text before a call goes out at once, a possible
//! call marker is held back until it is one or is not, and a call goes out whole once its
//! region closes.

use super::{ParsedCall, ToolCallFormat};

/// What one push of text releases, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JailEvent {
    /// Message content.
    Content(String),
    /// A complete call.
    Call(ParsedCall),
}

/// Reads one choice's output text as it streams (docs/tool-calls.md, "Streaming").
#[derive(Debug)]
pub struct ToolCallJail {
    format: ToolCallFormat,
    held: String,
    /// Nothing but whitespace went out yet (formats without a marker may still begin).
    at_output_start: bool,
}

impl ToolCallJail {
    /// A jail for output in `format`.
    pub fn new(format: ToolCallFormat) -> Self {
        Self {
            format,
            held: String::new(),
            at_output_start: true,
        }
    }

    /// Takes the next piece of text; returns what can be released now.
    pub fn push(&mut self, text: &str) -> Vec<JailEvent> {
        self.held.push_str(text);
        let mut events = Vec::new();
        loop {
            match self.format.find_region(&self.held, self.at_output_start) {
                Some(region) => {
                    self.release(region.start, &mut events);
                    let Some(end) = region.end.map(|end| end - region.start) else {
                        break;
                    };
                    match self.format.parse_region(&self.held[..end]) {
                        Some(calls) => {
                            events.extend(calls.into_iter().map(JailEvent::Call));
                            self.held.drain(..end);
                            self.at_output_start = false;
                        }
                        None => self.release(end, &mut events),
                    }
                }
                None => {
                    let hold = self.format.held_suffix(&self.held, self.at_output_start);
                    let release = self.held.len() - hold;
                    self.release(release, &mut events);
                    break;
                }
            }
        }
        events
    }

    /// Ends the stream: a held region becomes calls when it parses, content otherwise.
    pub fn finish(&mut self) -> Vec<JailEvent> {
        let mut events = Vec::new();
        if let Some(region) = self.format.find_region(&self.held, self.at_output_start) {
            self.release(region.start, &mut events);
            if let Some(calls) = self.format.parse_region(&self.held) {
                events.extend(calls.into_iter().map(JailEvent::Call));
                self.held.clear();
            }
        }
        let rest = std::mem::take(&mut self.held);
        if !rest.is_empty() {
            events.push(JailEvent::Content(rest));
        }
        events
    }

    fn release(&mut self, len: usize, events: &mut Vec<JailEvent>) {
        if len == 0 {
            return;
        }
        let text: String = self.held.drain(..len).collect();
        if !text.trim().is_empty() {
            self.at_output_start = false;
        }
        match events.last_mut() {
            Some(JailEvent::Content(last)) => last.push_str(&text),
            _ => events.push(JailEvent::Content(text)),
        }
    }
}
