//! What a second encoder must reproduce exactly before it may encode a model's prompts: the
//! model's own chat template rendered over a conversation of prose, code, CJK, emoji,
//! whitespace runs and special-token literals, and the same text raw.

use crate::openai::ChatCompletionRequest;
use crate::template::ChatTemplate;

/// Text kinds that exercise a BPE engine's pre-tokenizer, normalizer and byte fallback.
const SAMPLES: [&str; 6] = [
    "The quick brown fox jumps over the lazy dog. It's 3.14159 o'clock; we'll see 12,345 of them!",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n\tprintln!(\"{v:?}\");\n}\n",
    "東京は日本の首都です。한국어 문장도 있습니다. Ελληνικά, русский текст, العربية.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧 flags 🇯🇵🇫🇷, math ∑∫√ and ½ ™ ©.",
    "   leading spaces,\n\n\nblank lines,\r\nCRLF,\t\ttabs   and trailing   ",
    "Literal markers <|im_start|>user and <|im_end|> and <|endoftext|> inside text, </s> <s> [INST].",
];

/// The texts to check: every sample raw, all of them joined, and the chat template's rendering
/// of a conversation made of them (when the model has a template that renders it).
pub fn self_check_texts(template: Option<&ChatTemplate>) -> Vec<String> {
    let mut texts: Vec<String> = SAMPLES.iter().map(|s| (*s).to_string()).collect();
    texts.push(SAMPLES.join("\n"));
    if let Some(rendered) = template.and_then(render_conversation) {
        texts.push(rendered);
    }
    texts
}

fn render_conversation(template: &ChatTemplate) -> Option<String> {
    let roles = ["system", "user", "assistant", "user", "assistant", "user"];
    let messages: Vec<serde_json::Value> = roles
        .iter()
        .zip(SAMPLES)
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    let request: ChatCompletionRequest = serde_json::from_value(serde_json::json!({
        "model": "self-check",
        "messages": messages,
    }))
    .ok()?;
    template.render_request(&request).ok()
}
