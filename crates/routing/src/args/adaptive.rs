//! The flag of the adaptive KV cost weights (a kvmesh addition; docs/routing.md, "Adaptive
//! weights"). Its own struct so the frontend, `kvmesh-router`, `kvmesh up` and `kvmesh bench
//! routing` flatten one definition.

use clap::Args;

use crate::adaptive::KvWeightsMode;

/// Whether the KV cost weights are fixed or learned.
#[derive(Debug, Clone, Args)]
pub struct AdaptiveArgs {
    /// fixed: `--router-kv-overlap-score-credit` and `--router-prefill-load-scale` as given;
    /// auto: learned online from observed time to first token, starting from those values, plus
    /// a decode-stall term (pending prefill × running requests) while the caches have room, with
    /// request imbalance bounded (kvmesh).
    #[arg(
        long,
        env = "KVMESH_ROUTER_KV_WEIGHTS",
        value_enum,
        default_value = "fixed"
    )]
    pub router_kv_weights: KvWeightsMode,
}
