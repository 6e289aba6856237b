//! Pins, priorities and the session id from request headers (router.md §9, §10, §15).
//!
//! The frontend fills [`RoutingHints`] from `nvext` first and then applies the headers, which win.
//! Kept here so the frontend, the gRPC service and the processor host read them identically.

use crate::error::RouteError;
use crate::request::RoutingHints;

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

/// Applies routing headers to `hints` (names case-insensitive). With `is_nvext_disabled`
/// (`DYN_DISABLE_FRONTEND_NVEXT`) the pin and priority headers are ignored; the session id
/// still applies. A malformed number is a 400 naming the header.
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
    fn nvext_disabled_ignores_pins_but_not_sessions() {
        let mut hints = RoutingHints::default();
        apply_headers(
            &mut hints,
            [
                ("x-dynamo-worker-instance-id", "7"),
                ("x-dynamo-session-id", "s"),
            ],
            true,
        )
        .unwrap();
        assert_eq!(hints.backend_instance_id, None);
        assert_eq!(hints.session_id.as_deref(), Some("s"));
        let error = apply_headers(&mut hints, [("x-dp-rank", "x")], false).unwrap_err();
        assert!(matches!(error, RouteError::BadRequest(ref m) if m.contains("x-dp-rank")));
    }
}
