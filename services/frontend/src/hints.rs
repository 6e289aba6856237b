//! Pins, priorities and the session id from request headers (docs/routing.md:
//! "Pins and routing headers", "Queue", "Session affinity").
//!
//! The frontend fills [`RoutingHints`] from `nvext` first and then applies the headers, which win.
//! HTTP concerns, so they live with the HTTP edge; the router sees only the [`RoutingHints`].

use kvmesh_routing::RouteError;
use kvmesh_routing::RoutingHints;

/// Worker pin (backend and decode worker), canonical name first.
pub const WORKER_INSTANCE_ID: [&str; 2] = ["x-dynamo-worker-instance-id", "x-worker-instance-id"];
/// Data-parallel rank pin.
pub const DP_RANK: [&str; 3] = ["x-dynamo-dp-rank", "x-dp-rank", "x-data-parallel-rank"];
/// Queue priority.
pub const REQUEST_PRIORITY: &str = "x-dynamo-request-priority";
/// Strict queue priority class.
pub const REQUEST_STRICT_PRIORITY: &str = "x-dynamo-request-strict-priority";
/// Session affinity key.
pub const SESSION_ID: &str = "x-dynamo-session-id";
/// Cache salt; wins over the body's `cache_salt`.
pub const TENANT_ID: &str = "x-tenant-id";

/// Applies routing headers to `hints` (names case-insensitive). With `is_nvext_disabled`
/// (`DYN_DISABLE_FRONTEND_NVEXT`) the pin and priority headers are ignored; the session id and
/// the tenant id (the cache salt) still apply. A malformed number is a 400 naming the header.
pub fn apply_headers<'a>(
    hints: &mut RoutingHints,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    is_nvext_disabled: bool,
) -> Result<(), RouteError> {
    for (name, value) in headers {
        let is = |names: &[&str]| names.iter().any(|n| n.eq_ignore_ascii_case(name));
        if is(&[SESSION_ID]) {
            let value = value.trim();
            if !value.is_empty() {
                hints.session_id = Some(value.to_string());
            }
            continue;
        }
        if is(&[TENANT_ID]) {
            let value = value.trim();
            if !value.is_empty() {
                hints.cache_salt = Some(value.to_string());
            }
            continue;
        }
        if is_nvext_disabled {
            continue;
        }
        if is(&WORKER_INSTANCE_ID) {
            hints.backend_instance_id = Some(number(name, value)?);
        } else if is(&DP_RANK) {
            hints.dp_rank = Some(number(name, value)?);
        } else if is(&[REQUEST_PRIORITY]) {
            hints.priority = number(name, value)?;
        } else if is(&[REQUEST_STRICT_PRIORITY]) {
            hints.strict_priority = number(name, value)?;
        }
    }
    Ok(())
}

/// Fills `hints` from a request's `nvext` object (docs/http-api.md, "nvext"): pins
/// (`backend_instance_id`, `decode_worker_id`, `dp_rank`), `agent_hints` (`priority`,
/// `strict_priority`, `osl`) and `session_control` with action `bind` (session stickiness with
/// its `timeout`, 300 s by default). Apply headers afterwards: they win. A field of the wrong type
/// is a 400 naming it.
pub fn apply_nvext(hints: &mut RoutingHints, nvext: &serde_json::Value) -> Result<(), RouteError> {
    let Some(nvext) = nvext.as_object() else {
        return Err(RouteError::BadRequest("nvext must be an object".into()));
    };
    if let Some(id) = field::<u64>(nvext, "nvext", "decode_worker_id")? {
        hints.backend_instance_id = Some(id);
    }
    if let Some(id) = field::<u64>(nvext, "nvext", "backend_instance_id")? {
        hints.backend_instance_id = Some(id);
    }
    if let Some(rank) = field::<u32>(nvext, "nvext", "dp_rank")? {
        hints.dp_rank = Some(rank);
    }
    match nvext.get("agent_hints") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(agent)) => {
            if let Some(priority) = field::<i32>(agent, "nvext.agent_hints", "priority")? {
                hints.priority = priority;
            }
            if let Some(strict) = field::<u32>(agent, "nvext.agent_hints", "strict_priority")? {
                hints.strict_priority = strict;
            }
            if let Some(osl) = field::<u32>(agent, "nvext.agent_hints", "osl")? {
                hints.expected_output_tokens = Some(osl);
            }
        }
        Some(_) => {
            return Err(RouteError::BadRequest(
                "nvext.agent_hints must be an object".into(),
            ));
        }
    }
    match nvext.get("session_control") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(control)) => {
            let session_id = control
                .get("session_id")
                .and_then(serde_json::Value::as_str)
                .filter(|id| !id.trim().is_empty())
                .ok_or_else(|| {
                    RouteError::BadRequest(
                        "nvext.session_control.session_id must be a non-empty string".into(),
                    )
                })?;
            let action = control
                .get("action")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("bind");
            let timeout = field::<u64>(control, "nvext.session_control", "timeout")?
                .unwrap_or(DEFAULT_SESSION_BIND_SECS);
            match action {
                "bind" => {
                    hints.session_id = Some(session_id.trim().to_string());
                    hints.session_bind_ttl = Some(std::time::Duration::from_secs(timeout));
                }
                // Engine session RPCs are not part of this release: the request routes as usual.
                "open" | "close" => {}
                other => {
                    return Err(RouteError::BadRequest(format!(
                        "nvext.session_control.action must be bind, open or close, not {other:?}"
                    )));
                }
            }
        }
        Some(_) => {
            return Err(RouteError::BadRequest(
                "nvext.session_control must be an object".into(),
            ));
        }
    }
    Ok(())
}

/// Idle TTL of a `session_control` binding without `timeout`.
const DEFAULT_SESSION_BIND_SECS: u64 = 300;

fn field<T: serde::de::DeserializeOwned>(
    object: &serde_json::Map<String, serde_json::Value>,
    parent: &str,
    name: &str,
) -> Result<Option<T>, RouteError> {
    match object.get(name) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value.clone())
            .map(Some)
            .map_err(|_| {
                RouteError::BadRequest(format!("{parent}.{name} has an invalid value: {value}"))
            }),
    }
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, RouteError> {
    value
        .trim()
        .parse()
        .map_err(|_| RouteError::BadRequest(format!("invalid {name} header: {value:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_win_and_aliases_work() {
        let mut hints = RoutingHints {
            backend_instance_id: Some(1),
            priority: 3,
            ..RoutingHints::default()
        };
        apply_headers(
            &mut hints,
            [
                ("X-Worker-Instance-Id", "42"),
                ("x-data-parallel-rank", "2"),
                ("x-dynamo-request-priority", "-4"),
                ("x-dynamo-request-strict-priority", "1"),
                ("X-Dynamo-Session-ID", "abc"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(hints.backend_instance_id, Some(42));
        assert_eq!(hints.dp_rank, Some(2));
        assert_eq!(hints.priority, -4);
        assert_eq!(hints.strict_priority, 1);
        assert_eq!(hints.session_id.as_deref(), Some("abc"));
    }

    #[test]
    fn nvext_fields_fill_hints_and_headers_win() {
        let mut hints = RoutingHints::default();
        let nvext = serde_json::json!({
            "backend_instance_id": 9,
            "dp_rank": 1,
            "agent_hints": {"priority": 5, "strict_priority": 2, "osl": 64},
            "session_control": {"session_id": "conv-1", "action": "bind", "timeout": 30},
        });
        apply_nvext(&mut hints, &nvext).unwrap();
        assert_eq!(hints.backend_instance_id, Some(9));
        assert_eq!(hints.dp_rank, Some(1));
        assert_eq!(hints.priority, 5);
        assert_eq!(hints.strict_priority, 2);
        assert_eq!(hints.expected_output_tokens, Some(64));
        assert_eq!(hints.session_id.as_deref(), Some("conv-1"));
        assert_eq!(
            hints.session_bind_ttl,
            Some(std::time::Duration::from_secs(30))
        );
        apply_headers(&mut hints, [("x-dynamo-worker-instance-id", "3")], false).unwrap();
        assert_eq!(hints.backend_instance_id, Some(3));
    }

    #[test]
    fn bad_nvext_fields_are_400s_naming_the_field() {
        for (nvext, field) in [
            (
                serde_json::json!({"backend_instance_id": "x"}),
                "nvext.backend_instance_id",
            ),
            (serde_json::json!({"dp_rank": -1}), "nvext.dp_rank"),
            (
                serde_json::json!({"agent_hints": {"priority": 1.5}}),
                "nvext.agent_hints.priority",
            ),
            (serde_json::json!({"agent_hints": 3}), "nvext.agent_hints"),
            (
                serde_json::json!({"session_control": {"action": "bind"}}),
                "session_id",
            ),
            (
                serde_json::json!({"session_control": {"session_id": "s", "action": "x"}}),
                "action",
            ),
            (serde_json::json!([1]), "nvext"),
        ] {
            let error = apply_nvext(&mut RoutingHints::default(), &nvext).unwrap_err();
            assert!(
                matches!(error, RouteError::BadRequest(ref m) if m.contains(field)),
                "{nvext}: {error}"
            );
        }
    }

    #[test]
    fn nvext_disabled_ignores_pins_but_not_sessions() {
        let mut hints = RoutingHints::default();
        apply_headers(
            &mut hints,
            [
                ("x-dynamo-worker-instance-id", "7"),
                ("x-dynamo-session-id", "s"),
                ("X-Tenant-Id", " tenant-a "),
            ],
            true,
        )
        .unwrap();
        assert_eq!(hints.backend_instance_id, None);
        assert_eq!(hints.session_id.as_deref(), Some("s"));
        assert_eq!(hints.cache_salt.as_deref(), Some("tenant-a"));
        let error = apply_headers(&mut hints, [("x-dp-rank", "x")], false).unwrap_err();
        assert!(matches!(error, RouteError::BadRequest(ref m) if m.contains("x-dp-rank")));
    }
}
