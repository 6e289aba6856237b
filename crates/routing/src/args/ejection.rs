//! The flags of failing-worker ejection (kvmesh additions; docs/routing.md, "Ejection of failing
//! workers").

use std::time::Duration;

use clap::Args;

use super::values::positive;
use crate::health::EjectionConfig;

/// When a failing worker leaves routing, and for how long.
#[derive(Debug, Clone, Args)]
pub struct EjectionArgs {
    /// Consecutive failures (unreachable, internal error, silent past its deadline) that eject a
    /// worker from routing; 0 never ejects (kvmesh).
    #[arg(long, env = "KVMESH_ROUTER_EJECTION_FAILURES", default_value_t = 3)]
    pub router_ejection_failures: u32,
    /// Seconds of a worker's first ejection; each failed probe doubles it (kvmesh).
    #[arg(long, env = "KVMESH_ROUTER_EJECTION_BASE_SECS", default_value_t = 5.0, value_parser = positive, allow_negative_numbers = true)]
    pub router_ejection_base_secs: f64,
    /// Longest ejection in seconds (kvmesh).
    #[arg(long, env = "KVMESH_ROUTER_EJECTION_MAX_SECS", default_value_t = 300.0, value_parser = positive, allow_negative_numbers = true)]
    pub router_ejection_max_secs: f64,
}

impl EjectionArgs {
    /// The configuration these flags describe (the maximum is at least the base).
    pub fn to_config(&self) -> EjectionConfig {
        let base = Duration::from_secs_f64(self.router_ejection_base_secs.min(1e9));
        let max = Duration::from_secs_f64(self.router_ejection_max_secs.min(1e9)).max(base);
        EjectionConfig {
            consecutive_failures: self.router_ejection_failures,
            base_backoff: base,
            max_backoff: max,
        }
    }
}
