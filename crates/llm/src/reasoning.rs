//! Reasoning in a model's output text: the syntaxes reasoning models mark their thinking with
//! (docs/reasoning.md), split from the answer as the text streams, and written (the mock engine
//! thinks in the syntax its model card names).

/// The reasoning syntaxes kvmesh reads, by the parser names of the model card
/// (`reasoning_parser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// The output starts inside the thinking (the template opened `<think>`; a leading
    /// `<think>` is dropped too) and `</think>` ends it (DeepSeek R1).
    DeepseekR1,
    /// Thinking only when the output opens with `<think>`, up to `</think>` (Qwen3).
    Qwen3,
    /// OpenAI's harmony channels: `<|channel|>analysis<|message|>…<|end|>` is thinking,
    /// `<|channel|>final<|message|>…` the answer (gpt-oss).
    GptOss,
}

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

impl ReasoningFormat {
    /// Every parser name, for error messages and docs.
    pub const NAMES: [&'static str; 3] = ["deepseek_r1", "qwen3", "gpt_oss"];

    /// The format a parser name selects.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "deepseek_r1" => Self::DeepseekR1,
            "qwen3" => Self::Qwen3,
            "gpt_oss" => Self::GptOss,
            _ => return None,
        })
    }

    /// The parser name.
    pub fn name(self) -> &'static str {
        match self {
            Self::DeepseekR1 => "deepseek_r1",
            Self::Qwen3 => "qwen3",
            Self::GptOss => "gpt_oss",
        }
    }

    /// The text a model writes before and after its thinking.
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            Self::DeepseekR1 | Self::Qwen3 => ("<think>\n", "\n</think>\n\n"),
            Self::GptOss => (
                "<|channel|>analysis<|message|>",
                "<|end|><|start|>assistant<|channel|>final<|message|>",
            ),
        }
    }
}

/// What one push releases: thinking text and answer text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Thinking.
    pub reasoning: String,
    /// The answer.
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Qwen3: not yet known whether the output opens with `<think>`.
    Undecided,
    /// Thinking; `at_start` while a leading `<think>` may still be dropped.
    Thinking { at_start: bool },
    /// The answer; `at_start` while the blank lines after `</think>` are dropped.
    Answer { at_start: bool },
}

/// Splits one choice's streamed output into reasoning and content (docs/reasoning.md).
#[derive(Debug)]
pub struct ReasoningSplitter {
    format: ReasoningFormat,
    state: State,
    /// Harmony: the channel of the message being written (`None` between messages).
    channel: Option<String>,
    /// Harmony: nothing but whitespace written in the current message yet (dropped).
    at_message_start: bool,
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for output in `format`.
    pub fn new(format: ReasoningFormat) -> Self {
        let state = match format {
            ReasoningFormat::DeepseekR1 => State::Thinking { at_start: true },
            ReasoningFormat::Qwen3 => State::Undecided,
            ReasoningFormat::GptOss => State::Answer { at_start: false },
        };
        Self {
            format,
            state,
            channel: None,
            at_message_start: false,
            held: String::new(),
        }
    }

    /// Takes the next piece of text; returns what can be released now.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut split = Split::default();
        match self.format {
            ReasoningFormat::GptOss => self.harmony(&mut split, false),
            _ => self.think_tags(&mut split, false),
        }
        split
    }

    /// Ends the stream, releasing what was held.
    pub fn finish(&mut self) -> Split {
        let mut split = Split::default();
        match self.format {
            ReasoningFormat::GptOss => self.harmony(&mut split, true),
            _ => self.think_tags(&mut split, true),
        }
        split
    }

    fn think_tags(&mut self, split: &mut Split, at_end: bool) {
        loop {
            match self.state {
                State::Undecided => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_START) {
                        self.held = rest.to_owned();
                        self.state = State::Thinking { at_start: false };
                    } else if !at_end && THINK_START.starts_with(trimmed) {
                        return;
                    } else {
                        self.state = State::Answer { at_start: false };
                    }
                }
                State::Thinking { at_start: true } => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_START) {
                        self.held = rest.to_owned();
                    } else if !at_end && THINK_START.starts_with(trimmed) {
                        return;
                    }
                    self.state = State::Thinking { at_start: false };
                }
                State::Thinking { at_start: false } => match self.held.find(THINK_END) {
                    Some(at) => {
                        split.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + THINK_END.len());
                        self.state = State::Answer { at_start: true };
                    }
                    None => {
                        let keep = if at_end {
                            0
                        } else {
                            crate::tool_calls::scan::marker_prefix_suffix(&self.held, &[THINK_END])
                        };
                        let release = self.held.len() - keep;
                        split.reasoning.extend(self.held.drain(..release));
                        return;
                    }
                },
                State::Answer { at_start } => {
                    if at_start {
                        let trimmed = self.held.trim_start().len();
                        self.held.drain(..self.held.len() - trimmed);
                        if self.held.is_empty() && !at_end {
                            return;
                        }
                        self.state = State::Answer { at_start: false };
                    }
                    split.content.push_str(&std::mem::take(&mut self.held));
                    return;
                }
            }
        }
    }

    fn harmony(&mut self, split: &mut Split, at_end: bool) {
        loop {
            let Some(open) = self.held.find("<|") else {
                let keep = if !at_end && self.held.ends_with('<') {
                    1
                } else {
                    0
                };
                let release = self.held.len() - keep;
                let text: String = self.held.drain(..release).collect();
                self.emit(split, &text);
                return;
            };
            let text: String = self.held.drain(..open).collect();
            self.emit(split, &text);
            let Some(close) = self.held.find("|>") else {
                if at_end {
                    let rest = std::mem::take(&mut self.held);
                    self.emit(split, &rest);
                }
                return;
            };
            let token = self.held[2..close].to_owned();
            match token.as_str() {
                "channel" => {
                    let Some(message) = self.held.find("<|message|>") else {
                        if at_end {
                            self.held.clear();
                        }
                        return;
                    };
                    let name = self.held[close + 2..message].trim();
                    let name = name.split_whitespace().next().unwrap_or("").to_owned();
                    self.channel = Some(name);
                    self.at_message_start = true;
                    self.held.drain(..message + "<|message|>".len());
                }
                "start" => {
                    // `<|start|>role` up to the next marker.
                    let after = close + 2;
                    match self.held[after..].find("<|") {
                        Some(next) => {
                            self.held.drain(..after + next);
                        }
                        None if at_end => self.held.clear(),
                        None => return,
                    }
                }
                "end" | "return" | "call" => {
                    self.channel = None;
                    self.held.drain(..close + 2);
                }
                _ => {
                    let marker: String = self.held.drain(..close + 2).collect();
                    self.emit(split, &marker);
                }
            }
        }
    }

    fn emit(&mut self, split: &mut Split, text: &str) {
        let text = if self.at_message_start {
            let trimmed = text.trim_start();
            self.at_message_start = trimmed.is_empty();
            trimmed
        } else {
            text
        };
        match self.channel.as_deref() {
            Some("analysis") => split.reasoning.push_str(text),
            _ => split.content.push_str(text),
        }
    }
}

#[cfg(test)]
mod tests;
