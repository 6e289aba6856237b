//! Discovery keys and event-plane subjects, built and parsed in one place.
//!
//! Every process must spell these names byte for byte alike (and like Dynamo where the docs say
//! so), so nothing outside this module formats a key or a subject by hand. Keys follow
//! docs/discovery.md, "Keys and records"; subjects follow docs/kv-events.md, "Transport".

use std::fmt::Write as _;

/// Root of every kvmesh discovery key; also the prefix that watches all namespaces.
pub const KEY_ROOT: &str = "/kvmesh/";

/// Root of every kvmesh subject.
pub const SUBJECT_ROOT: &str = "kvmesh";

/// Characters RFC 3986 calls unreserved: kept as-is in a percent-encoded path segment.
fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~')
}

/// Characters kept as-is in a subject token.
fn is_subject_safe(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_')
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// Decodes `{escape}XX` sequences; `None` on a truncated or non-hex escape or invalid UTF-8.
fn unescape(text: &str, escape: u8, keep: impl Fn(u8) -> bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == escape {
            let high = hex_value(*bytes.get(index + 1)?)?;
            let low = hex_value(*bytes.get(index + 2)?)?;
            out.push((high << 4) | low);
            index += 3;
        } else if keep(byte) {
            out.push(byte);
            index += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(out).ok()
}

/// Encodes a served model name as one key path segment (docs/discovery.md, "Keys and records"):
/// RFC 3986 unreserved characters are kept, every other byte becomes `%XX` (uppercase hex), so
/// `Qwen/Qwen3-0.6B` becomes `Qwen%2FQwen3-0.6B`.
///
/// The segments `.` and `..` are the one exception: they are written `%2E` / `%2E%2E` so that a
/// key can never name a parent directory in the file backend. The decoding is the same.
pub fn encode_model_segment(name: &str) -> String {
    if name == "." || name == ".." {
        return "%2E".repeat(name.len());
    }
    let mut out = String::with_capacity(name.len());
    for &byte in name.as_bytes() {
        if is_unreserved(byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Decodes a segment written by [`encode_model_segment`]; `None` if it is not valid encoding
/// (a stray reserved character, a bad `%` escape or bytes that are not UTF-8) or not the one
/// spelling the encoder writes (`%2f`, `%41`): a model key has exactly one form.
pub fn decode_model_segment(segment: &str) -> Option<String> {
    let name = unescape(segment, b'%', is_unreserved)?;
    (encode_model_segment(&name) == segment).then_some(name)
}

/// Encodes a namespace or model name as one NATS subject token (docs/kv-events.md, "Transport"):
/// every byte outside `[A-Za-z0-9_-]` becomes `~` and two uppercase hex digits, so
/// `Qwen/Qwen3-0.6B` becomes `Qwen~2FQwen3-0~2E6B`. The result never contains `.`, `*`, `>` or
/// whitespace.
pub fn subject_token(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if is_subject_safe(byte) {
            out.push(char::from(byte));
        } else {
            let _ = write!(out, "~{byte:02X}");
        }
    }
    out
}

/// Decodes a token written by [`subject_token`]; `None` if it is not valid encoding.
pub fn decode_subject_token(token: &str) -> Option<String> {
    unescape(token, b'~', is_subject_safe)
}

/// `/kvmesh/{ns}/`: every key of one namespace.
pub fn namespace_prefix(namespace: &str) -> String {
    format!("{KEY_ROOT}{namespace}/")
}

/// Watch/list prefix for instance records: one namespace, or (`None`) every namespace, in
/// which case the prefix also covers model records and callers filter with
/// [`parse_instance_key`].
pub fn instances_prefix(namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("{KEY_ROOT}{namespace}/instances/"),
        None => KEY_ROOT.to_owned(),
    }
}

/// Watch/list prefix for model records: one namespace, or (`None`) every namespace (callers
/// then filter with [`parse_model_key`]).
pub fn models_prefix(namespace: Option<&str>) -> String {
    match namespace {
        Some(namespace) => format!("{KEY_ROOT}{namespace}/models/"),
        None => KEY_ROOT.to_owned(),
    }
}

/// `/kvmesh/{ns}/instances/{component}/{endpoint}/{id:x}`: where a process's
/// `InstanceRecord` lives. The id is lowercase hex without leading zeros, as Dynamo writes it.
pub fn instance_key(namespace: &str, component: &str, endpoint: &str, instance_id: u64) -> String {
    format!("{KEY_ROOT}{namespace}/instances/{component}/{endpoint}/{instance_id:x}")
}

/// `/kvmesh/{ns}/models/{model}/{id:x}`: where a worker's `ModelRecord` lives; the model name
/// is percent-encoded with [`encode_model_segment`].
pub fn model_key(namespace: &str, model: &str, instance_id: u64) -> String {
    let model = encode_model_segment(model);
    format!("{KEY_ROOT}{namespace}/models/{model}/{instance_id:x}")
}

/// The parts of an instance key, so a watcher can tell which instance a delete removed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceKey {
    /// Namespace segment.
    pub namespace: String,
    /// Component segment (`backend`, `router`, ...).
    pub component: String,
    /// Endpoint segment (`generate`, `route`, ...).
    pub endpoint: String,
    /// The instance id, parsed from hex.
    pub instance_id: u64,
}

impl InstanceKey {
    /// The key `record` is stored under.
    pub fn of(record: &kvmesh_proto::v1::InstanceRecord) -> Self {
        Self {
            namespace: record.namespace.clone(),
            component: record.component.clone(),
            endpoint: record.endpoint.clone(),
            instance_id: record.instance_id,
        }
    }

    /// The full key these parts name.
    pub fn key(&self) -> String {
        instance_key(
            &self.namespace,
            &self.component,
            &self.endpoint,
            self.instance_id,
        )
    }
}

/// The parts of a model key, so a watcher can tell which worker a delete removed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelKey {
    /// Namespace segment.
    pub namespace: String,
    /// Served model name (decoded).
    pub model: String,
    /// The worker's instance id, parsed from hex.
    pub instance_id: u64,
}

impl ModelKey {
    /// The key `record` is stored under.
    pub fn of(record: &kvmesh_proto::v1::ModelRecord) -> Self {
        Self {
            namespace: record.namespace.clone(),
            model: record.model.clone(),
            instance_id: record.instance_id,
        }
    }

    /// The full key these parts name.
    pub fn key(&self) -> String {
        model_key(&self.namespace, &self.model, self.instance_id)
    }
}

/// Parses an id written as [`instance_key`] writes it: lowercase hex without leading zeros. Any
/// other spelling (`0A`, `00a`) is not a key, so that one record has exactly one key and a delete
/// of one spelling cannot remove what another spelling registered.
fn parse_hex_id(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = u64::from_str_radix(text, 16).ok()?;
    (format!("{id:x}") == text).then_some(id)
}

/// Splits `/kvmesh/{ns}/{kind}/...` into its segments after the root; `None` for any other key.
fn segments(key: &str) -> Option<Vec<&str>> {
    let rest = key.strip_prefix(KEY_ROOT)?;
    let parts: Vec<&str> = rest.split('/').collect();
    if parts.iter().any(|part| part.is_empty()) {
        return None;
    }
    Some(parts)
}

/// Parses an instance key back into its parts; `None` if `key` is not one.
pub fn parse_instance_key(key: &str) -> Option<InstanceKey> {
    match segments(key)?.as_slice() {
        [namespace, "instances", component, endpoint, id] => Some(InstanceKey {
            namespace: (*namespace).to_owned(),
            component: (*component).to_owned(),
            endpoint: (*endpoint).to_owned(),
            instance_id: parse_hex_id(id)?,
        }),
        _ => None,
    }
}

/// Parses a model key back into its parts (decoding the model name); `None` if `key` is not one.
pub fn parse_model_key(key: &str) -> Option<ModelKey> {
    match segments(key)?.as_slice() {
        [namespace, "models", model, id] => Some(ModelKey {
            namespace: (*namespace).to_owned(),
            model: decode_model_segment(model)?,
            instance_id: parse_hex_id(id)?,
        }),
        _ => None,
    }
}

/// `kvmesh.{ns}.kv.{model}.{partition}`: the subject carrying one partition's KV events for a
/// model (`ns` and `model` written with [`subject_token`]).
pub fn kv_subject(namespace: &str, model: &str, partition: u32) -> String {
    format!(
        "{SUBJECT_ROOT}.{}.kv.{}.{partition}",
        subject_token(namespace),
        subject_token(model)
    )
}

/// `kvmesh.{ns}.kv.*.{partition}`: matches one partition's KV events for every model, which is
/// what an indexer shard that owns the partition consumes.
pub fn kv_partition_filter(namespace: &str, partition: u32) -> String {
    format!(
        "{SUBJECT_ROOT}.{}.kv.*.{partition}",
        subject_token(namespace)
    )
}

/// `KVMESH_KV_{ns}`: the JetStream stream holding a namespace's KV events.
pub fn kv_stream_name(namespace: &str) -> String {
    format!("KVMESH_KV_{}", subject_token(namespace))
}

/// The subjects the namespace's KV stream captures: `kvmesh.{ns}.kv.>`.
pub fn kv_stream_subjects(namespace: &str) -> Vec<String> {
    vec![format!("{SUBJECT_ROOT}.{}.kv.>", subject_token(namespace))]
}

/// `kvmesh.{ns}.load.{model}`: core-NATS subject of worker load metrics.
pub fn load_subject(namespace: &str, model: &str) -> String {
    format!(
        "{SUBJECT_ROOT}.{}.load.{}",
        subject_token(namespace),
        subject_token(model)
    )
}

/// `kvmesh.{ns}.router.{model}`: core-NATS subject of router replica sync.
pub fn router_subject(namespace: &str, model: &str) -> String {
    format!(
        "{SUBJECT_ROOT}.{}.router.{}",
        subject_token(namespace),
        subject_token(model)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_segment_matches_spec_example() {
        assert_eq!(encode_model_segment("Qwen/Qwen3-0.6B"), "Qwen%2FQwen3-0.6B");
        assert_eq!(
            decode_model_segment("Qwen%2FQwen3-0.6B").as_deref(),
            Some("Qwen/Qwen3-0.6B")
        );
        assert_eq!(encode_model_segment("a b~c%"), "a%20b~c%25");
        assert_eq!(encode_model_segment("é"), "%C3%A9");
        assert_eq!(encode_model_segment(".."), "%2E%2E");
        assert_eq!(encode_model_segment("."), "%2E");
        assert_eq!(encode_model_segment("a..b"), "a..b");
    }

    #[test]
    fn model_segment_round_trips_any_text() {
        for name in [
            "",
            ".",
            "..",
            "x/y/z",
            "ü ñ 漢字",
            "%2F",
            "~tilde~",
            "a\u{0}b",
        ] {
            let encoded = encode_model_segment(name);
            assert!(!encoded.contains('/'), "{encoded}");
            assert_eq!(decode_model_segment(&encoded).as_deref(), Some(name));
        }
    }

    #[test]
    fn malformed_model_segments_are_rejected() {
        for bad in ["%", "%2", "%zz", "a/b", "a b", "%FF", "%C3"] {
            assert_eq!(decode_model_segment(bad), None, "{bad}");
        }
    }

    #[test]
    fn other_spellings_of_a_model_segment_are_rejected() {
        // One name, one key: a lowercase escape or an escaped unreserved byte is not the encoding.
        for other in ["%2f", "Qwen%2fQwen3", "%41", "a%2Db", "."] {
            assert_eq!(decode_model_segment(other), None, "{other}");
        }
    }

    #[test]
    fn subject_token_matches_spec_example() {
        assert_eq!(subject_token("Qwen/Qwen3-0.6B"), "Qwen~2FQwen3-0~2E6B");
        assert_eq!(subject_token("dynamo"), "dynamo");
        assert_eq!(subject_token("a.b*c>d e~"), "a~2Eb~2Ac~3Ed~20e~7E");
        assert_eq!(
            decode_subject_token("Qwen~2FQwen3-0~2E6B").as_deref(),
            Some("Qwen/Qwen3-0.6B")
        );
        assert_eq!(decode_subject_token("a.b"), None);
        assert_eq!(decode_subject_token("~4"), None);
    }

    #[test]
    fn keys_match_spec_layout() {
        assert_eq!(
            instance_key("dynamo", "backend", "generate", 0x1a2b),
            "/kvmesh/dynamo/instances/backend/generate/1a2b"
        );
        assert_eq!(
            model_key("dynamo", "Qwen/Qwen3-0.6B", 255),
            "/kvmesh/dynamo/models/Qwen%2FQwen3-0.6B/ff"
        );
        assert_eq!(
            instance_key("ns", "c", "e", 0),
            "/kvmesh/ns/instances/c/e/0"
        );
        assert_eq!(instances_prefix(None), "/kvmesh/");
        assert_eq!(instances_prefix(Some("ns")), "/kvmesh/ns/instances/");
        assert_eq!(models_prefix(Some("ns")), "/kvmesh/ns/models/");
        assert_eq!(models_prefix(None), "/kvmesh/");
        assert_eq!(namespace_prefix("ns"), "/kvmesh/ns/");
    }

    #[test]
    fn keys_parse_back_into_their_parts() {
        let instance = InstanceKey {
            namespace: "dynamo".into(),
            component: "backend".into(),
            endpoint: "generate".into(),
            instance_id: u64::MAX,
        };
        assert_eq!(parse_instance_key(&instance.key()), Some(instance.clone()));
        let model = ModelKey {
            namespace: "ns-abc".into(),
            model: "Qwen/Qwen3-0.6B".into(),
            instance_id: 7,
        };
        assert_eq!(parse_model_key(&model.key()), Some(model.clone()));
        // Each parser rejects the other kind and malformed keys.
        assert_eq!(parse_model_key(&instance.key()), None);
        assert_eq!(parse_instance_key(&model.key()), None);
        for bad in [
            "",
            "/kvmesh/",
            "/other/ns/models/m/1",
            "/kvmesh/ns/models/m/",
            "/kvmesh/ns/models/m/xyz",
            "/kvmesh/ns/models/m/11112222333344445",
            "/kvmesh/ns/models/m%zz/1",
            "/kvmesh/ns/models//1",
            "/kvmesh/ns/models/m/1/extra",
            "/kvmesh/ns/models/m/0a",
            "/kvmesh/ns/models/m/A",
            "/kvmesh/ns/models/m%2f/1",
            "/kvmesh/ns/instances/c/e",
            "/kvmesh//instances/c/e/1",
        ] {
            assert_eq!(parse_model_key(bad), None, "{bad}");
            assert_eq!(parse_instance_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn subjects_match_spec_layout() {
        assert_eq!(
            kv_subject("dynamo", "Qwen/Qwen3-0.6B", 3),
            "kvmesh.dynamo.kv.Qwen~2FQwen3-0~2E6B.3"
        );
        assert_eq!(kv_partition_filter("dynamo", 15), "kvmesh.dynamo.kv.*.15");
        assert_eq!(kv_stream_name("dynamo"), "KVMESH_KV_dynamo");
        assert_eq!(kv_stream_name("a.b"), "KVMESH_KV_a~2Eb");
        assert_eq!(
            kv_stream_subjects("a.b"),
            vec!["kvmesh.a~2Eb.kv.>".to_owned()]
        );
        assert_eq!(load_subject("ns", "m/x"), "kvmesh.ns.load.m~2Fx");
        assert_eq!(router_subject("ns", "m"), "kvmesh.ns.router.m");
    }
}
