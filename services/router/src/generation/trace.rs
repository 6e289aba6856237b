//! The seam's spans (docs/tracing.md): one per routing decision, with the chosen worker and its
//! expected overlap, and one per worker attempt. Every function returns at once while tracing is
//! off.

use kvmesh_routing::error::RouteError;
use kvmesh_runtime::otel::{KeyValue, Trace};

use crate::decider::RouteLease;

/// Records a decision (or its failure) on `span` and ends it.
pub(super) fn decided(
    span: &Trace,
    lease: Result<Box<dyn RouteLease>, RouteError>,
) -> Result<Box<dyn RouteLease>, RouteError> {
    if !span.is_active() {
        return lease;
    }
    match &lease {
        Ok(lease) => span.set_with(|| decision_attributes(lease.decision())),
        Err(error) => span.fail(error),
    }
    span.end();
    lease
}

/// The attributes of a routing decision, the same on the frontend's and a replica's span.
pub(crate) fn decision_attributes(decision: &kvmesh_routing::request::Decision) -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("kvmesh.worker_id", format!("{:x}", decision.worker_id)),
        KeyValue::new("kvmesh.overlap_blocks", i64::from(decision.overlap_blocks)),
        KeyValue::new(
            "kvmesh.cached_tokens",
            i64::try_from(decision.cached_tokens).unwrap_or(i64::MAX),
        ),
        KeyValue::new(
            "kvmesh.required_blocks",
            i64::try_from(decision.required_blocks).unwrap_or(i64::MAX),
        ),
    ];
    if let Some(rank) = decision.dp_rank {
        attributes.push(KeyValue::new("kvmesh.dp_rank", i64::from(rank)));
    }
    attributes
}

/// Names the worker and the attempt (0 first) on a worker attempt's span.
pub(super) fn attempt(span: &Trace, worker_id: u64, attempt: usize) {
    span.set_with(|| {
        vec![
            KeyValue::new("kvmesh.worker_id", format!("{worker_id:x}")),
            KeyValue::new("kvmesh.attempt", attempt as i64),
        ]
    });
}
