//! Guided decoding in the mock engine: the output a constrained real engine would be forced
//! into (docs/mocker.md, "Guided output"): for a JSON schema a value that validates against it,
//! for a regular expression a text it matches in full, for a choice one of the strings. Each is
//! chosen with the request's own generator, so it is reproducible.

use regex_syntax::hir::{Class, Hir, HirKind};
use serde_json::{Map, Number, Value};

use crate::engine::Xoshiro256;

/// Words for generated strings: plain, so the JSON re-tokenizes like any text.
const WORDS: &[&str] = &[
    "cache", "river", "town", "weather", "stream", "token", "router", "block", "prefix", "worker",
];

/// Deepest nesting written; deeper schemas get their simplest value.
const MAX_DEPTH: usize = 8;

/// A JSON value that validates against `schema` (objects with every property, arrays within
/// their item bounds, strings, numbers, integers, booleans, `null`, `enum`, `const`, and the
/// first branch of `anyOf`/`oneOf`); compact text.
pub fn json_for_schema(schema: &Value, rng: &mut Xoshiro256) -> String {
    value_for(schema, rng, 0).to_string()
}

fn value_for(schema: &Value, rng: &mut Xoshiro256, depth: usize) -> Value {
    let Some(schema) = schema.as_object() else {
        return Value::Object(Map::new());
    };
    if let Some(constant) = schema.get("const") {
        return constant.clone();
    }
    if let Some(choices) = schema.get("enum").and_then(Value::as_array)
        && !choices.is_empty()
    {
        return pick(choices, rng).cloned().unwrap_or(Value::Null);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema
            .get(key)
            .and_then(Value::as_array)
            .and_then(|b| b.first())
        {
            return value_for(first, rng, depth + 1);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|kind| *kind != "null")
            .unwrap_or("null"),
        _ if schema.contains_key("properties") => "object",
        _ if schema.contains_key("items") => "array",
        _ => "object",
    };
    match kind {
        "object" => {
            let mut object = Map::new();
            if depth < MAX_DEPTH
                && let Some(properties) = schema.get("properties").and_then(Value::as_object)
            {
                for (name, property) in properties {
                    object.insert(name.clone(), value_for(property, rng, depth + 1));
                }
            }
            Value::Object(object)
        }
        "array" => {
            let min = bound(schema, "minItems").unwrap_or(1);
            let max = bound(schema, "maxItems").unwrap_or(min.max(3)).max(min);
            let len = if depth < MAX_DEPTH {
                min + rng.below(max - min + 1).min(2)
            } else {
                min
            };
            let items = schema.get("items").cloned().unwrap_or(Value::Null);
            Value::Array(
                (0..len)
                    .map(|_| value_for(&items, rng, depth + 1))
                    .collect(),
            )
        }
        "string" => {
            if let Some(text) = formatted_string(schema, rng) {
                return Value::String(text);
            }
            let mut text = WORDS[rng.below(WORDS.len() as u64) as usize].to_string();
            let min = bound(schema, "minLength").unwrap_or(0) as usize;
            while text.chars().count() < min {
                text.push_str(" cache");
            }
            if let Some(max) = bound(schema, "maxLength") {
                text = text.chars().take(max as usize).collect();
            }
            Value::String(text)
        }
        "integer" => {
            let low = schema.get("minimum").and_then(Value::as_i64).unwrap_or(0);
            let high = schema
                .get("maximum")
                .and_then(Value::as_i64)
                .unwrap_or(low.saturating_add(100))
                .max(low);
            let span = high.abs_diff(low).saturating_add(1);
            Value::from(low.saturating_add(rng.below(span) as i64))
        }
        "number" => {
            let low = schema.get("minimum").and_then(Value::as_f64).unwrap_or(0.0);
            let high = schema
                .get("maximum")
                .and_then(Value::as_f64)
                .unwrap_or(low + 100.0);
            let tenths = ((high - low).max(0.0) * 10.0) as u64;
            let value = low + rng.below(tenths + 1) as f64 / 10.0;
            Number::from_f64(value).map_or(Value::from(0), Value::Number)
        }
        "boolean" => Value::Bool(rng.below(2) == 1),
        _ => Value::Null,
    }
}

/// A string for a schema with a `pattern` (a text the pattern matches) or a well-known `format`.
fn formatted_string(schema: &Map<String, Value>, rng: &mut Xoshiro256) -> Option<String> {
    if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
        return text_for_regex(pattern, rng).ok();
    }
    let text = match schema.get("format").and_then(Value::as_str)? {
        "date" => "2026-12-04",
        "date-time" => "2026-12-04T12:00:00Z",
        "time" => "12:00:00Z",
        "email" => "worker@example.com",
        "uri" | "url" => "https://example.com/cache",
        "uuid" => "6f1c2a9e-3b4d-4e5f-8a7b-9c0d1e2f3a4b",
        "ipv4" => "10.0.0.1",
        _ => return None,
    };
    Some(text.to_owned())
}

fn bound(schema: &Map<String, Value>, key: &str) -> Option<u64> {
    schema.get(key).and_then(Value::as_u64)
}

/// Longest text written for a regular expression; a pattern whose shortest match is longer is
/// refused rather than generated.
pub const MAX_REGEX_OUTPUT_CHARS: usize = 4096;

/// Characters preferred when a class allows them, so generated text stays readable.
const READABLE: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.,:";

/// A text that `pattern` matches in full: each repetition runs its minimum plus up to three
/// more times, each alternation takes one branch, each class one (preferably readable)
/// character; anchors and word boundaries write nothing. Errors when the pattern does not
/// parse or its match would exceed [`MAX_REGEX_OUTPUT_CHARS`].
pub fn text_for_regex(pattern: &str, rng: &mut Xoshiro256) -> Result<String, String> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .map_err(|error| format!("guided_regex does not parse: {error}"))?;
    let mut text = String::new();
    write_match(&hir, rng, &mut text)?;
    Ok(text)
}

fn write_match(hir: &Hir, rng: &mut Xoshiro256, text: &mut String) -> Result<(), String> {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(literal) => text.push_str(&String::from_utf8_lossy(&literal.0)),
        HirKind::Class(Class::Unicode(class)) => {
            let allowed = |c: char| {
                class
                    .ranges()
                    .iter()
                    .any(|r| r.start() <= c && c <= r.end())
            };
            let readable: Vec<char> = READABLE.chars().filter(|c| allowed(*c)).collect();
            if !readable.is_empty() {
                text.push(readable[rng.below(readable.len() as u64) as usize]);
            } else if let Some(range) = pick(class.ranges(), rng) {
                text.push(range.start());
            }
        }
        HirKind::Class(Class::Bytes(class)) => {
            let allowed = |b: u8| {
                class
                    .ranges()
                    .iter()
                    .any(|r| r.start() <= b && b <= r.end())
            };
            let readable: Vec<char> = READABLE.chars().filter(|c| allowed(*c as u8)).collect();
            if !readable.is_empty() {
                text.push(readable[rng.below(readable.len() as u64) as usize]);
            } else if let Some(range) = pick(class.ranges(), rng) {
                text.push_str(&String::from_utf8_lossy(&[range.start()]));
            }
        }
        HirKind::Repetition(repetition) => {
            let extra = repetition
                .max
                .map_or(3, |max| max.saturating_sub(repetition.min).min(3));
            let count = repetition.min as u64 + rng.below(u64::from(extra) + 1);
            for _ in 0..count {
                write_match(&repetition.sub, rng, text)?;
                if text.chars().count() > MAX_REGEX_OUTPUT_CHARS {
                    return Err(too_long());
                }
            }
        }
        HirKind::Capture(capture) => write_match(&capture.sub, rng, text)?,
        HirKind::Concat(parts) => {
            for part in parts {
                write_match(part, rng, text)?;
            }
        }
        HirKind::Alternation(branches) => {
            if let Some(branch) = pick(branches, rng) {
                write_match(branch, rng, text)?;
            }
        }
    }
    if text.len() > MAX_REGEX_OUTPUT_CHARS * 4 {
        return Err(too_long());
    }
    Ok(())
}

fn too_long() -> String {
    format!("guided_regex needs a match longer than {MAX_REGEX_OUTPUT_CHARS} characters")
}

/// One of `choices`, drawn with the request's generator.
pub fn pick_choice<'a>(choices: &'a [String], rng: &mut Xoshiro256) -> Option<&'a str> {
    pick(choices, rng).map(String::as_str)
}

fn pick<'a, T>(items: &'a [T], rng: &mut Xoshiro256) -> Option<&'a T> {
    (!items.is_empty()).then(|| &items[rng.below(items.len() as u64) as usize])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn json(schema: &Value, seed: u64) -> Value {
        let text = json_for_schema(schema, &mut Xoshiro256::from_seed(seed));
        serde_json::from_str(&text).expect("generated text is JSON")
    }

    #[test]
    fn json_follows_nested_objects_arrays_and_scalars() {
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 3, "maxLength": 12},
                "age": {"type": "integer", "minimum": 18, "maximum": 21},
                "score": {"type": "number", "minimum": 0.5, "maximum": 1.0},
                "active": {"type": "boolean"},
                "nothing": {"type": "null"},
                "color": {"enum": ["red", "green"]},
                "version": {"const": 7},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
                "address": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "[0-9]{5}"}},
                    "required": ["city", "zip"]
                },
                "maybe": {"anyOf": [{"type": "integer"}, {"type": "string"}]}
            },
            "required": ["name", "age"]
        });
        for seed in 0..50 {
            let value = json(&schema, seed);
            let name = value["name"].as_str().unwrap();
            assert!((3..=12).contains(&name.chars().count()), "{name:?}");
            assert!((18..=21).contains(&value["age"].as_i64().unwrap()));
            let score = value["score"].as_f64().unwrap();
            assert!((0.5..=1.0).contains(&score), "{score}");
            assert!(value["active"].is_boolean());
            assert!(value["nothing"].is_null());
            assert!(["red", "green"].contains(&value["color"].as_str().unwrap()));
            assert_eq!(value["version"], 7);
            let tags = value["tags"].as_array().unwrap();
            assert!((2..=4).contains(&tags.len()) && tags.iter().all(Value::is_string));
            assert!(value["address"]["city"].is_string());
            let zip = value["address"]["zip"].as_str().unwrap();
            assert!(
                zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()),
                "{zip}"
            );
            assert!(value["maybe"].is_i64());
        }
    }

    #[test]
    fn the_same_seed_writes_the_same_json_and_seeds_vary_it() {
        let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}});
        assert_eq!(json(&schema, 3), json(&schema, 3));
        let distinct: std::collections::HashSet<String> = (0..20)
            .map(|seed| json(&schema, seed).to_string())
            .collect();
        assert!(distinct.len() > 5, "{distinct:?}");
    }

    #[test]
    fn regex_text_matches_the_pattern_in_full() {
        let patterns = [
            r"[a-z]+",
            r"\d{3}-\d{4}",
            r"(yes|no|maybe)",
            r"[A-Z][a-z]{2,5} [0-9]+",
            r"^item-(\w+)\.json$",
            r"a?b*c+",
            r"[^0-9]{4}",
            r"\btoken\b [\p{Greek}]",
            r"(ab|cd){2,3}x{0,2}",
        ];
        for pattern in patterns {
            let full = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
            for seed in 0..40 {
                let text = text_for_regex(pattern, &mut Xoshiro256::from_seed(seed)).unwrap();
                assert!(full.is_match(&text), "{pattern:?} wrote {text:?}");
            }
        }
    }

    #[test]
    fn bad_or_huge_patterns_are_refused() {
        let mut rng = Xoshiro256::from_seed(1);
        assert!(
            text_for_regex("(unclosed", &mut rng)
                .unwrap_err()
                .contains("parse")
        );
        assert!(
            text_for_regex("a{5000}", &mut rng)
                .unwrap_err()
                .contains("longer")
        );
    }

    #[test]
    fn a_choice_is_one_of_the_strings() {
        let choices = vec!["alpha".to_owned(), "beta".to_owned()];
        let picked: std::collections::HashSet<&str> = (0..20)
            .map(|seed| pick_choice(&choices, &mut Xoshiro256::from_seed(seed)).unwrap())
            .collect();
        assert_eq!(picked.len(), 2);
        assert_eq!(pick_choice(&[], &mut Xoshiro256::from_seed(1)), None);
    }
}
