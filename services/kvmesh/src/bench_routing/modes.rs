//! The policies `kvmesh bench routing` compares (`--mode`).

use clap::ValueEnum;
use kvmesh_routing::{CostPolicy, KvRouterConfig, KvWeightsMode, RouterConfig, RouterMode};

use super::Settings;
use super::handler::Policy;

/// A routing policy to simulate (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    /// Every mode below, in this order.
    All,
    /// Product mode `round-robin`.
    RoundRobin,
    /// Product mode `random`.
    Random,
    /// Product mode `power-of-two`.
    PowerOfTwo,
    /// Product mode `least-loaded`.
    LeastLoaded,
    /// Product mode `device-aware-weighted` (identical devices: least-loaded in one group).
    DeviceAwareWeighted,
    /// Product mode `kv` with the event-fed index.
    Kv,
    /// Product mode `kv` without KV events (`--no-router-kv-events`, approximate index).
    KvApprox,
    /// Product mode `kv` with the event-fed index and `--router-kv-weights auto`: credit and
    /// scale learned online, starting from the flags' values.
    KvAuto,
    /// Comparison policy, not a product mode yet: `kv` scored by new prefill × batch size
    /// (`adjusted_prefill · (decode_blocks + 1)`), no weights.
    Lmetric,
    /// Reference policy, not a product mode: longest cached prefix (exact, from the engines' KV
    /// events) among workers whose assigned work is at most `--greedy-cap` × the mean.
    LoadCappedGreedy,
}

impl ModeArg {
    /// Every concrete mode, in report order.
    pub const CONCRETE: [ModeArg; 10] = [
        ModeArg::RoundRobin,
        ModeArg::Random,
        ModeArg::PowerOfTwo,
        ModeArg::LeastLoaded,
        ModeArg::DeviceAwareWeighted,
        ModeArg::Kv,
        ModeArg::KvApprox,
        ModeArg::KvAuto,
        ModeArg::Lmetric,
        ModeArg::LoadCappedGreedy,
    ];

    /// The mode's name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModeArg::All => "all",
            ModeArg::RoundRobin => "round-robin",
            ModeArg::Random => "random",
            ModeArg::PowerOfTwo => "power-of-two",
            ModeArg::LeastLoaded => "least-loaded",
            ModeArg::DeviceAwareWeighted => "device-aware-weighted",
            ModeArg::Kv => "kv",
            ModeArg::KvApprox => "kv-approx",
            ModeArg::KvAuto => "kv-auto",
            ModeArg::Lmetric => "lmetric",
            ModeArg::LoadCappedGreedy => "load-capped-greedy",
        }
    }

    /// `all` expanded, duplicates dropped, order kept.
    pub fn expand(modes: &[ModeArg]) -> Vec<ModeArg> {
        let mut out = Vec::new();
        for &mode in modes {
            let group: &[ModeArg] = if mode == ModeArg::All {
                &ModeArg::CONCRETE
            } else {
                std::slice::from_ref(&mode)
            };
            for &m in group {
                if !out.contains(&m) {
                    out.push(m);
                }
            }
        }
        out
    }

    pub(super) fn policy(self, settings: &Settings) -> Policy {
        let router = |mode: RouterMode, kv: KvRouterConfig| {
            Policy::Router(Box::new(RouterConfig {
                kv,
                ..RouterConfig::with_mode(mode)
            }))
        };
        let kv = settings.kv.clone();
        match self {
            ModeArg::All | ModeArg::RoundRobin => router(RouterMode::RoundRobin, kv),
            ModeArg::Random => router(RouterMode::Random, kv),
            ModeArg::PowerOfTwo => router(RouterMode::PowerOfTwo, kv),
            ModeArg::LeastLoaded => router(RouterMode::LeastLoaded, kv),
            ModeArg::DeviceAwareWeighted => router(RouterMode::DeviceAwareWeighted, kv),
            ModeArg::Kv => router(
                RouterMode::Kv,
                KvRouterConfig {
                    use_kv_events: true,
                    ..kv
                },
            ),
            ModeArg::KvApprox => router(
                RouterMode::Kv,
                KvRouterConfig {
                    use_kv_events: false,
                    predicted_ttl: None,
                    ..kv
                },
            ),
            ModeArg::KvAuto => router(
                RouterMode::Kv,
                KvRouterConfig {
                    use_kv_events: true,
                    weights: KvWeightsMode::Auto,
                    ..kv
                },
            ),
            ModeArg::Lmetric => router(
                RouterMode::Kv,
                KvRouterConfig {
                    use_kv_events: true,
                    weights: KvWeightsMode::Fixed,
                    cost_policy: CostPolicy::Lmetric,
                    ..kv
                },
            ),
            ModeArg::LoadCappedGreedy => Policy::LoadCappedGreedy {
                cap: settings.greedy_cap,
            },
        }
    }
}
