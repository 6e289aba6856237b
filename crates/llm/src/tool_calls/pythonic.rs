//! The pythonic tool-call syntax: a Python list of calls with keyword arguments whose values are
//! Python literals (`[get_weather(city="Paris", days=3), ping()]`).

use serde_json::{Map, Number, Value};

use super::ParsedCall;

/// Whether `text` opens with `[name(`, a call list.
pub(crate) fn is_call_list_start(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('[') else {
        return false;
    };
    let rest = rest.trim_start();
    let name_len = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(rest.len());
    name_len > 0 && rest[name_len..].trim_start().starts_with('(')
}

/// Whether `text` could still grow into `[name(`.
pub(crate) fn may_become_call_list(text: &str) -> bool {
    let Some(rest) = text.strip_prefix('[') else {
        return text.is_empty();
    };
    let rest = rest.trim_start();
    let name_len = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(rest.len());
    rest[name_len..].trim_start().is_empty()
}

/// The calls of a complete list, or `None` when it is not one.
pub(crate) fn parse(text: &str) -> Option<Vec<ParsedCall>> {
    let mut parser = Parser {
        text: text.trim(),
        at: 0,
    };
    parser.expect('[')?;
    let mut calls = Vec::new();
    loop {
        parser.space();
        if parser.eat(']') {
            break;
        }
        if !calls.is_empty() {
            parser.expect(',')?;
            parser.space();
        }
        calls.push(parser.call()?);
        parser.space();
        if parser.eat(']') {
            break;
        }
    }
    parser.space();
    (parser.at == parser.text.len()).then_some(calls)
}

/// `calls` as a Python list.
pub(crate) fn write(calls: &[ParsedCall]) -> String {
    let calls: Vec<String> = calls
        .iter()
        .map(|call| {
            let arguments = match serde_json::from_str::<Value>(&call.arguments) {
                Ok(Value::Object(object)) => object
                    .iter()
                    .map(|(key, value)| format!("{key}={}", literal(value)))
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => String::new(),
            };
            format!("{}({arguments})", call.name)
        })
        .collect();
    format!("[{}]", calls.join(", "))
}

fn literal(value: &Value) -> String {
    match value {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(number) => number.to_string(),
        // A JSON string with the escapes Python shares.
        Value::String(_) => value.to_string(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(literal).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(object) => format!(
            "{{{}}}",
            object
                .iter()
                .map(|(key, value)| format!("{}: {}", Value::String(key.clone()), literal(value)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

struct Parser<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Parser<'a> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn space(&mut self) {
        self.at += super::scan::leading_space(self.rest());
    }

    fn eat(&mut self, c: char) -> bool {
        if self.rest().starts_with(c) {
            self.at += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Option<()> {
        self.eat(c).then_some(())
    }

    fn name(&mut self) -> Option<&str> {
        let len = self
            .rest()
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(self.rest().len());
        let start = self.at;
        self.at += len;
        (len > 0).then(|| &self.text[start..start + len])
    }

    fn call(&mut self) -> Option<ParsedCall> {
        let name = self.name()?.to_owned();
        self.space();
        self.expect('(')?;
        let mut arguments = Map::new();
        loop {
            self.space();
            if self.eat(')') {
                break;
            }
            if !arguments.is_empty() {
                self.expect(',')?;
                self.space();
                if self.eat(')') {
                    break;
                }
            }
            let key = self.name()?.to_owned();
            self.space();
            self.expect('=')?;
            self.space();
            arguments.insert(key, self.value()?);
        }
        Some(ParsedCall {
            name,
            arguments: Value::Object(arguments).to_string(),
        })
    }

    fn value(&mut self) -> Option<Value> {
        self.space();
        let text: &'a str = self.text;
        let rest = &text[self.at..];
        let first = rest.chars().next()?;
        match first {
            '"' | '\'' => self.string().map(Value::String),
            '[' | '(' => {
                let close = if first == '[' { ']' } else { ')' };
                self.at += 1;
                let mut items = Vec::new();
                loop {
                    self.space();
                    if self.eat(close) {
                        break;
                    }
                    if !items.is_empty() {
                        self.expect(',')?;
                        self.space();
                        if self.eat(close) {
                            break;
                        }
                    }
                    items.push(self.value()?);
                }
                Some(Value::Array(items))
            }
            '{' => {
                self.at += 1;
                let mut object = Map::new();
                loop {
                    self.space();
                    if self.eat('}') {
                        break;
                    }
                    if !object.is_empty() {
                        self.expect(',')?;
                        self.space();
                        if self.eat('}') {
                            break;
                        }
                    }
                    let key = match self.value()? {
                        Value::String(key) => key,
                        other => other.to_string(),
                    };
                    self.space();
                    self.expect(':')?;
                    object.insert(key, self.value()?);
                }
                Some(Value::Object(object))
            }
            _ => {
                let len = rest
                    .find(|c: char| !(c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '+')))
                    .unwrap_or(rest.len());
                let word = &rest[..len];
                self.at += len;
                match word {
                    "True" => Some(Value::Bool(true)),
                    "False" => Some(Value::Bool(false)),
                    "None" => Some(Value::Null),
                    _ => number(word),
                }
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        let quote = self.rest().chars().next()?;
        self.at += 1;
        let mut out = String::new();
        let mut chars = self.rest().char_indices();
        while let Some((offset, c)) = chars.next() {
            match c {
                '\\' => {
                    let (_, escaped) = chars.next()?;
                    match escaped {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'u' => {
                            let hex: String = (0..4)
                                .filter_map(|_| chars.next())
                                .map(|(_, c)| c)
                                .collect();
                            out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                        }
                        other => out.push(other),
                    }
                }
                c if c == quote => {
                    self.at += offset + 1;
                    return Some(out);
                }
                c => out.push(c),
            }
        }
        None
    }
}

fn number(word: &str) -> Option<Value> {
    if let Ok(integer) = word.parse::<i64>() {
        return Some(Value::from(integer));
    }
    word.parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map(Value::Number)
}
