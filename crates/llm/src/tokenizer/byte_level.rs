//! The byte-level alphabet of GPT-2-style BPE vocabularies: every byte is written as one
//! printable character, so a vocabulary token such as `Ġthe` stands for the bytes ` the`. The
//! printable bytes `!`..=`~`, `¡`..=`¬` and `®`..=`ÿ` stand for themselves; the other 68 bytes,
//! in ascending order, are written as the characters from U+0100 on.

/// Whether `byte` is written as the character of the same code point.
fn is_self_written(byte: u8) -> bool {
    matches!(byte, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The byte a character of the alphabet stands for; `None` for a character outside it.
fn byte_of(ch: char) -> Option<u8> {
    let code = u32::from(ch);
    if let Ok(byte) = u8::try_from(code)
        && is_self_written(byte)
    {
        return Some(byte);
    }
    // The other bytes in ascending order: 0x00..=0x20, 0x7F..=0xA0, then 0xAD.
    match code.checked_sub(0x100)? {
        rank @ 0..=0x20 => u8::try_from(rank).ok(),
        rank @ 0x21..=0x42 => u8::try_from(rank - 0x21 + 0x7F).ok(),
        0x43 => Some(0xAD),
        _ => None,
    }
}

/// The bytes a byte-level token string stands for; `None` when it is not written in the
/// alphabet (an added token, or a vocabulary of another kind).
pub(crate) fn token_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(byte_of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alphabet_covers_every_byte_once() {
        let mut seen = [false; 256];
        for code in 0x21..0x200u32 {
            if let Some(byte) = char::from_u32(code).and_then(byte_of) {
                assert!(!seen[byte as usize], "byte {byte} twice");
                seen[byte as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn known_tokens_map_to_their_bytes() {
        assert_eq!(token_bytes("Ġthe").unwrap(), b" the");
        assert_eq!(token_bytes("Ċ").unwrap(), b"\n");
        // Half of the UTF-8 encoding of "é" (C3 A9).
        assert_eq!(token_bytes("Ã").unwrap(), [0xC3]);
        assert_eq!(token_bytes("<|im_end|>").unwrap(), b"<|im_end|>");
        assert_eq!(token_bytes("▁the"), None);
    }
}
