//! Stop conditions: stop strings on the decoded text, stop tokens and EOS on the token ids.

use std::borrow::Cow;

use crate::openai::FinishReason;

/// Watches the decoded text of one choice for stop strings.
///
/// Text that could still turn into a stop string is held back ("jailed") until the next piece
/// decides it; held text is released by [`StopMatcher::finish`] when the stream ends without a
/// match. When several stop strings occur, the one that is complete first (the earliest end,
/// then the longest) wins, which is what a token-by-token stream would see; the result does not
/// depend on how the text is split into pieces.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop_str_in_output: bool,
    held: String,
    matched: Option<usize>,
}

/// What one [`StopMatcher::push`] lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopStep<'a> {
    /// Text safe to send to the client now; borrowed from the piece when nothing was held.
    pub text: Cow<'a, str>,
    /// Index (into the matcher's stop list) of the stop string that just matched; generation
    /// ends with `finish_reason: "stop"`.
    pub matched: Option<usize>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored). With `include_stop_str_in_output` the
    /// matched stop string is sent too (vLLM's option); text after it never is.
    pub fn new<I, S>(stops: I, include_stop_str_in_output: bool) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let stops = stops
            .into_iter()
            .map(Into::into)
            .filter(|s: &String| !s.is_empty())
            .collect();
        Self {
            stops,
            include_stop_str_in_output,
            held: String::new(),
            matched: None,
        }
    }

    /// Feeds the next decoded piece. After a match every further piece yields nothing.
    pub fn push<'a>(&mut self, piece: &'a str) -> StopStep<'a> {
        if self.matched.is_some() {
            return StopStep {
                text: Cow::Borrowed(""),
                matched: None,
            };
        }
        if self.stops.is_empty() {
            return StopStep {
                text: Cow::Borrowed(piece),
                matched: None,
            };
        }
        let buffer: Cow<'a, str> = if self.held.is_empty() {
            Cow::Borrowed(piece)
        } else {
            let mut joined = std::mem::take(&mut self.held);
            joined.push_str(piece);
            Cow::Owned(joined)
        };
        if let Some((index, start, end)) = self.earliest_match(&buffer) {
            self.matched = Some(index);
            let cut = if self.include_stop_str_in_output {
                end
            } else {
                start
            };
            return StopStep {
                text: truncate(buffer, cut),
                matched: Some(index),
            };
        }
        let keep = self.partial_suffix_len(&buffer);
        let emit = buffer.len() - keep;
        self.held.push_str(&buffer[emit..]);
        StopStep {
            text: truncate(buffer, emit),
            matched: None,
        }
    }

    /// Ends the stream: releases the held text, since no stop string completed.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The stop string that matched, if any.
    pub fn matched_stop(&self) -> Option<&str> {
        self.matched.map(|index| self.stops[index].as_str())
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop strings, in the order given (empty ones removed); indexes refer to this list.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// `(stop index, start, end)` of the stop string that completes first in `text`.
    fn earliest_match(&self, text: &str) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (index, stop) in self.stops.iter().enumerate() {
            let Some(start) = text.find(stop.as_str()) else {
                continue;
            };
            let end = start + stop.len();
            let is_better = match best {
                None => true,
                Some((_, best_start, best_end)) => {
                    end < best_end || (end == best_end && start < best_start)
                }
            };
            if is_better {
                best = Some((index, start, end));
            }
        }
        best
    }

    /// Length of the longest suffix of `text` that is a proper prefix of some stop string.
    fn partial_suffix_len(&self, text: &str) -> usize {
        let mut longest = 0;
        for stop in &self.stops {
            let max = (stop.len() - 1).min(text.len());
            for len in (longest + 1..=max).rev() {
                if stop.is_char_boundary(len) && text.ends_with(&stop[..len]) {
                    longest = len;
                    break;
                }
            }
        }
        longest
    }
}

fn truncate(text: Cow<'_, str>, len: usize) -> Cow<'_, str> {
    match text {
        Cow::Borrowed(s) => Cow::Borrowed(&s[..len]),
        Cow::Owned(mut s) => {
            s.truncate(len);
            Cow::Owned(s)
        }
    }
}

/// Why a token ended generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStop {
    /// An end-of-sequence token of the model.
    Eos(u32),
    /// One of the request's `stop_token_ids` (or an integer in `stop`).
    StopToken(u32),
    /// `max_tokens` reached.
    Length,
}

impl TokenStop {
    /// The OpenAI finish reason for this stop.
    pub fn finish_reason(self) -> FinishReason {
        match self {
            Self::Eos(_) | Self::StopToken(_) => FinishReason::Stop,
            Self::Length => FinishReason::Length,
        }
    }

    /// Whether the ending token's text belongs in the output: like vLLM, an EOS or stop token is
    /// decoded only with `include_stop_str_in_output`; a length stop always is.
    pub fn is_token_in_output(self, include_stop_str_in_output: bool) -> bool {
        matches!(self, Self::Length) || include_stop_str_in_output
    }
}

/// The token-level stop conditions of one request: EOS ids, stop token ids, `ignore_eos`,
/// `min_tokens`, `max_tokens`, checked the way vLLM does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenStopConditions {
    /// The model's EOS ids (ignored with `ignore_eos`).
    pub eos_token_ids: Vec<u32>,
    /// The request's stop token ids (honoured even with `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating through EOS.
    pub ignore_eos: bool,
    /// No EOS or stop token ends generation before this many tokens.
    pub min_tokens: u32,
    /// Generation ends after this many tokens.
    pub max_tokens: Option<u32>,
}

impl TokenStopConditions {
    /// Whether `token`, the `num_generated`-th generated token (counting it), ends generation.
    /// EOS and stop tokens take precedence over the length limit.
    pub fn check(&self, token: u32, num_generated: u32) -> Option<TokenStop> {
        if num_generated >= self.min_tokens {
            if !self.ignore_eos && self.eos_token_ids.contains(&token) {
                return Some(TokenStop::Eos(token));
            }
            if self.stop_token_ids.contains(&token) {
                return Some(TokenStop::StopToken(token));
            }
        }
        match self.max_tokens {
            Some(max) if num_generated >= max => Some(TokenStop::Length),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
