//! Python's way of printing values, so templates render byte for byte as under Hugging Face's
//! Jinja2: `str()` for `{{ value }}` (`None`, `True`, `['a', 1]`) and `json.dumps` for `tojson`
//! (`{"a": 1}` with spaces, non-ASCII kept, insertion order kept).

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// How `json.dumps` lays out its output.
#[derive(Debug, Clone)]
pub(crate) struct JsonStyle {
    /// `None` for one line; otherwise the string repeated per nesting level.
    pub indent: Option<String>,
    /// Between items; Python uses `", "` without indent and `","` with it.
    pub item_separator: String,
    /// Between a key and its value.
    pub key_separator: String,
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// Sort object keys.
    pub sort_keys: bool,
}

impl JsonStyle {
    /// Python's defaults for a given indent.
    pub fn new(indent: Option<String>) -> Self {
        let item_separator = if indent.is_some() { "," } else { ", " };
        Self {
            indent,
            item_separator: item_separator.to_owned(),
            key_separator: ": ".to_owned(),
            ensure_ascii: false,
            sort_keys: false,
        }
    }
}

/// `json.dumps(value)` with `style`.
pub(crate) fn json_dumps(value: &Value, style: &JsonStyle) -> Result<String, Error> {
    let mut out = String::new();
    write_json(&mut out, value, style, 0)?;
    Ok(out)
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value, true),
        ValueKind::String => {
            write_json_str(out, value.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                write_separator(out, style, depth + 1, i == 0);
                write_json_str(out, &json_key(key), style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_json(out, &value.get_item(key)?, style, depth + 1)?;
            }
            write_close(out, style, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                write_separator(out, style, depth + 1, i == 0);
                write_json(out, item, style, depth + 1)?;
            }
            write_close(out, style, depth);
            out.push(']');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("object of type {} is not JSON serializable", value.kind()),
            ));
        }
    }
    Ok(())
}

fn write_separator(out: &mut String, style: &JsonStyle, depth: usize, is_first: bool) {
    if !is_first {
        out.push_str(&style.item_separator);
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_close(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

/// Python's `json` turns non-string keys into strings: `1` → `"1"`, `True` → `"true"`.
fn json_key(key: &Value) -> String {
    match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::None | ValueKind::Undefined => "null".to_owned(),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(&mut s, key, false);
            s
        }
        _ => key.to_string(),
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Integers as is; floats as Python's `repr` (`1.0`, `1e-05`, `1e+16`); non-finite floats as
/// `json` writes them (`NaN`, `Infinity`) or as `repr` does (`nan`, `inf`).
fn write_number(out: &mut String, value: &Value, is_json: bool) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) => out.push_str(&py_float_repr(f, is_json)),
        Err(_) => {
            let _ = write!(out, "{value}");
        }
    }
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional for exponents in
/// -4..16, scientific (`1.5e+16`) otherwise.
pub(crate) fn py_float_repr(f: f64, is_json: bool) -> String {
    if f.is_nan() {
        return if is_json { "NaN" } else { "nan" }.to_owned();
    }
    if f.is_infinite() {
        let s = match (f > 0.0, is_json) {
            (true, true) => "Infinity",
            (false, true) => "-Infinity",
            (true, false) => "inf",
            (false, false) => "-inf",
        };
        return s.to_owned();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = usize::try_from(exp).unwrap_or(0) + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n(
                '0',
                usize::try_from(-exp - 1).unwrap_or(0),
            ));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exp_sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{exp_sign}{:02}", exp.unsigned_abs());
    }
    out
}

/// Python's `str(value)`, what `{{ value }}` prints under Jinja2.
pub(crate) fn write_py_str(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(value.as_str().unwrap_or_default()),
        _ => write_py_repr(out, value),
    }
}

/// Python's `repr(value)`, used inside containers: `['a', None, True, {'k': 1.0}]`.
fn write_py_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => write_number(out, value, false),
        ValueKind::String => write_py_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(items) = value.try_iter() {
                for (i, item) in items.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_py_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(keys) = value.try_iter() {
                for (i, key) in keys.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_py_repr(out, &key);
                    out.push_str(": ");
                    write_py_repr(out, &value.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        _ => {
            let _ = write!(out, "{value}");
        }
    }
}

fn write_py_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (2.5e-7, "2.5e-07"),
        ];
        for (f, expected) in cases {
            assert_eq!(py_float_repr(f, false), expected, "{f}");
        }
        assert_eq!(py_float_repr(f64::NAN, true), "NaN");
        assert_eq!(py_float_repr(f64::NEG_INFINITY, false), "-inf");
    }

    #[test]
    fn json_dumps_matches_python_defaults() {
        let value = Value::from_serialize(serde_json::json!({
            "name": "get_weather",
            "b": [1, 2.0, null, true, "é\n\"x\""],
            "a": {},
            "c": []
        }));
        let compact = json_dumps(&value, &JsonStyle::new(None)).unwrap();
        assert_eq!(
            compact,
            r#"{"name": "get_weather", "b": [1, 2.0, null, true, "é\n\"x\""], "a": {}, "c": []}"#
        );
        let indented = json_dumps(&value, &JsonStyle::new(Some("  ".into()))).unwrap();
        assert_eq!(
            indented,
            "{\n  \"name\": \"get_weather\",\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true,\n    \"é\\n\\\"x\\\"\"\n  ],\n  \"a\": {},\n  \"c\": []\n}"
        );
        let mut ascii = JsonStyle::new(None);
        ascii.ensure_ascii = true;
        ascii.sort_keys = true;
        let value = Value::from_serialize(serde_json::json!({"z": "🙂", "a": "é"}));
        assert_eq!(
            json_dumps(&value, &ascii).unwrap(),
            r#"{"a": "\u00e9", "z": "\ud83d\ude42"}"#
        );
    }

    #[test]
    fn str_prints_like_python() {
        let value = Value::from_serialize(serde_json::json!(["a", null, true, {"k": 1.0}, "it's"]));
        let mut out = String::new();
        write_py_str(&mut out, &value);
        assert_eq!(out, r#"['a', None, True, {'k': 1.0}, "it's"]"#);
        let mut out = String::new();
        write_py_str(&mut out, &Value::from(false));
        assert_eq!(out, "False");
    }
}
