//! Each format on outputs in its syntax, whole and streamed split at every character boundary.

use super::*;

fn split_all(format: ReasoningFormat, pieces: &[&str]) -> (String, String) {
    let mut splitter = ReasoningSplitter::new(format);
    let mut reasoning = String::new();
    let mut content = String::new();
    for piece in pieces {
        let split = splitter.push(piece);
        reasoning.push_str(&split.reasoning);
        content.push_str(&split.content);
    }
    let split = splitter.finish();
    reasoning.push_str(&split.reasoning);
    content.push_str(&split.content);
    (reasoning, content)
}

fn fixtures() -> Vec<(ReasoningFormat, &'static str, &'static str, &'static str)> {
    use ReasoningFormat::*;
    vec![
        (
            DeepseekR1,
            "Let me think. 2 < 3.\n</think>\n\nThe answer is 3.",
            "Let me think. 2 < 3.\n",
            "The answer is 3.",
        ),
        (DeepseekR1, "<think>\nhmm</think>yes", "\nhmm", "yes"),
        (DeepseekR1, "still thinking", "still thinking", ""),
        (
            Qwen3,
            "<think>\nweigh options\n</think>\n\nPick B.",
            "\nweigh options\n",
            "Pick B.",
        ),
        (
            Qwen3,
            "No thinking <think> here.",
            "",
            "No thinking <think> here.",
        ),
        (Qwen3, "<thin", "", "<thin"),
        (
            GptOss,
            "<|channel|>analysis<|message|>User wants 2+2.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
            "User wants 2+2.",
            "It is 4.",
        ),
        (
            GptOss,
            "plain answer with a < sign",
            "",
            "plain answer with a < sign",
        ),
    ]
}

#[test]
fn whole_outputs_split_into_reasoning_and_content() {
    for (format, output, reasoning, content) in fixtures() {
        assert_eq!(
            split_all(format, &[output]),
            (reasoning.to_owned(), content.to_owned()),
            "{format:?} on {output:?}"
        );
    }
}

#[test]
fn streamed_outputs_split_the_same_wherever_they_are_cut() {
    for (format, output, reasoning, content) in fixtures() {
        for (cut, _) in output.char_indices().skip(1) {
            assert_eq!(
                split_all(format, &[&output[..cut], &output[cut..]]),
                (reasoning.to_owned(), content.to_owned()),
                "{format:?} cut at {cut}"
            );
        }
        let chars: Vec<String> = output.chars().map(String::from).collect();
        let pieces: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(
            split_all(format, &pieces),
            (reasoning.to_owned(), content.to_owned()),
            "{format:?} char by char"
        );
    }
}

#[test]
fn written_markers_read_back() {
    for name in ReasoningFormat::NAMES {
        let format = ReasoningFormat::from_name(name).unwrap();
        assert_eq!(format.name(), name);
        let (start, end) = format.markers();
        let output = format!("{start} cache river{end} token block");
        let (reasoning, content) = split_all(format, &[&output]);
        assert_eq!(reasoning.trim(), "cache river", "{name}");
        assert_eq!(content, " token block".trim_start(), "{name}");
    }
}
