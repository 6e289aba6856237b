//! Claude Code's billing attribution line (`--strip-anthropic-preamble`, docs/http-api.md,
//! "Anthropic Messages"). Claude Code starts its system prompt with a line such as
//! `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=...;` whose values
//! change from request to request; left in, it makes every prompt differ at its first tokens and
//! no prefix is ever reused from the KV cache.

use super::AnthropicContent;

/// How the billing line starts.
const BILLING_HEADER_PREFIX: &str = "x-anthropic-billing-header:";

/// Removes every billing line from `system`: from a string, and from each text block, dropping
/// a block that held nothing else; a system prompt left empty is removed.
pub(super) fn strip_billing_lines(system: &mut Option<AnthropicContent>) {
    let is_empty = match system {
        None => return,
        Some(AnthropicContent::Text(text)) => {
            strip_text(text);
            text.trim().is_empty()
        }
        Some(AnthropicContent::Blocks(blocks)) => {
            blocks.retain_mut(|block| {
                if block.kind != "text" {
                    return true;
                }
                let Some(text) = block.text.as_mut() else {
                    return true;
                };
                if !strip_text(text) {
                    return true;
                }
                !text.trim().is_empty()
            });
            blocks.is_empty()
        }
    };
    if is_empty {
        *system = None;
    }
}

/// Removes the billing lines of `text` (with their line breaks); whether there were any.
fn strip_text(text: &mut String) -> bool {
    if !text.contains(BILLING_HEADER_PREFIX) {
        return false;
    }
    let kept: Vec<&str> = text
        .split('\n')
        .filter(|line| !line.trim_start().starts_with(BILLING_HEADER_PREFIX))
        .collect();
    let stripped = kept.join("\n");
    let is_changed = stripped.len() != text.len();
    *text = stripped;
    is_changed
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    const LINE: &str =
        "x-anthropic-billing-header: cc_version=2.1.3.a1b; cc_entrypoint=cli; cch=f00d;";

    fn system(value: Value) -> Option<AnthropicContent> {
        serde_json::from_value(value).ok()
    }

    fn texts(system: &Option<AnthropicContent>) -> Vec<String> {
        match system {
            None => Vec::new(),
            Some(AnthropicContent::Text(text)) => vec![text.clone()],
            Some(AnthropicContent::Blocks(blocks)) => blocks
                .iter()
                .map(|block| block.text.clone().unwrap_or_default())
                .collect(),
        }
    }

    #[test]
    fn a_billing_block_is_dropped_and_the_others_kept() {
        let mut blocks = system(json!([
            {"type": "text", "text": LINE},
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": "Be brief."},
        ]));
        strip_billing_lines(&mut blocks);
        assert_eq!(texts(&blocks), ["You are a coding agent.", "Be brief."]);
    }

    #[test]
    fn a_billing_line_is_removed_from_a_string_or_a_longer_block() {
        for (text, expected) in [
            (format!("{LINE}\nBe brief."), "Be brief."),
            (format!("Be brief.\n{LINE}"), "Be brief."),
            (
                format!("Be brief.\n  {LINE}\nAnswer in English."),
                "Be brief.\nAnswer in English.",
            ),
        ] {
            let mut string = system(json!(text));
            strip_billing_lines(&mut string);
            assert_eq!(texts(&string), [expected]);
            let mut block = system(json!([{"type": "text", "text": text}]));
            strip_billing_lines(&mut block);
            assert_eq!(texts(&block), [expected]);
        }
    }

    #[test]
    fn a_system_prompt_of_only_the_billing_line_goes_away() {
        for value in [json!(LINE), json!([{"type": "text", "text": LINE}])] {
            let mut only = system(value);
            strip_billing_lines(&mut only);
            assert!(only.is_none());
        }
    }

    #[test]
    fn other_text_is_left_as_sent() {
        for value in [
            json!("Mention x-anthropic-billing-header: only inside a sentence."),
            json!([{"type": "text", "text": "  Be brief.  "}, {"type": "text", "text": ""}]),
        ] {
            let mut kept = system(value.clone());
            strip_billing_lines(&mut kept);
            assert_eq!(texts(&kept), texts(&system(value)));
        }
        let mut none = None;
        strip_billing_lines(&mut none);
        assert!(none.is_none());
    }
}
