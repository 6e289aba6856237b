//! Text scanning the tool-call formats share: whitespace, bracket matching that skips strings,
//! and the half-written markers a stream holds back.

/// Bytes of leading whitespace.
pub(crate) fn leading_space(text: &str) -> usize {
    text.len() - text.trim_start().len()
}

/// The index just past the bracket that closes the one at `open` (`[`, `{` or `(`), skipping
/// brackets inside double-quoted strings (and single-quoted ones when `python_quotes`); `None`
/// while it is not closed yet or when `open` is not an opening bracket.
pub(crate) fn balanced_end(text: &str, open: usize, python_quotes: bool) -> Option<usize> {
    let bytes = text.as_bytes();
    if !matches!(bytes.get(open), Some(b'[' | b'{' | b'(')) {
        return None;
    }
    let mut depth = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    for (offset, &byte) in bytes[open..].iter().enumerate() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if byte == b'\\' {
                escaped = true;
            } else if byte == q {
                quote = None;
            }
            continue;
        }
        match byte {
            b'"' => quote = Some(b'"'),
            b'\'' if python_quotes => quote = Some(b'\''),
            b'[' | b'{' | b'(' => depth += 1,
            b']' | b'}' | b')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(open + offset + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The length of the longest end of `text` that is the beginning (not the whole) of one of
/// `markers`.
pub(crate) fn marker_prefix_suffix(text: &str, markers: &[&str]) -> usize {
    let mut longest = 0;
    for marker in markers {
        for (at, _) in text.char_indices().rev().take(marker.chars().count()) {
            let tail = &text[at..];
            if tail.len() < marker.len() && marker.starts_with(tail) {
                longest = longest.max(tail.len());
            }
        }
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_inside_strings_do_not_count() {
        assert_eq!(balanced_end(r#"{"a": "}"}x"#, 0, false), Some(10));
        assert_eq!(balanced_end(r#"{"a": "\"}"#, 0, false), None);
        assert_eq!(balanced_end("[f(a=')')]", 0, true), Some(10));
        assert_eq!(balanced_end("x", 0, false), None);
    }

    #[test]
    fn half_markers_are_found_at_the_end_only() {
        assert_eq!(marker_prefix_suffix("hello <tool", &["<tool_call>"]), 5);
        assert_eq!(marker_prefix_suffix("hello <", &["<tool_call>"]), 1);
        assert_eq!(marker_prefix_suffix("hello", &["<tool_call>"]), 0);
        assert_eq!(marker_prefix_suffix("a <tool_call>", &["<tool_call>"]), 0);
        assert_eq!(
            marker_prefix_suffix("é<｜tool", &["<｜tool▁calls▁begin｜>"]),
            "<｜tool".len()
        );
    }
}
