//! What a process reports about the backends it depends on: its discovery registration and its
//! event plane. `/health` turns a [`DependencyReport`] into `degraded` with reasons, and
//! [`DependencyMetrics`] into gauges, so an operator sees a lost lease or a missing NATS while the
//! process keeps serving.

use std::sync::Arc;

use prometheus::{IntCounter, IntGauge, Registry};

use crate::discovery::{Discovery, RegistrationState, RegistrationStatus};
use crate::event_plane::EventPlane;

/// The backends a process depends on, read live whenever health is asked for.
#[derive(Clone)]
pub struct Dependencies {
    discovery: Arc<dyn Discovery>,
    events: Arc<dyn EventPlane>,
}

impl std::fmt::Debug for Dependencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dependencies").finish_non_exhaustive()
    }
}

impl Dependencies {
    /// Reports on `discovery` (this process's registration) and `events`.
    pub fn new(discovery: Arc<dyn Discovery>, events: Arc<dyn EventPlane>) -> Self {
        Self { discovery, events }
    }

    /// How they stand now.
    pub fn report(&self) -> DependencyReport {
        DependencyReport {
            registration: *self.discovery.registration().borrow(),
            is_events_connected: self.events.is_connected(),
        }
    }
}

/// How a process's backends stand at one moment.
#[derive(Debug, Clone, Copy)]
pub struct DependencyReport {
    /// The discovery registration.
    pub registration: RegistrationStatus,
    /// Whether the event plane is connected (KV events, published load, replica sync).
    pub is_events_connected: bool,
}

impl DependencyReport {
    /// Whether anything is short of normal.
    pub fn is_degraded(&self) -> bool {
        !self.reasons().is_empty()
    }

    /// One line per thing short of normal, for `/health`.
    pub fn reasons(&self) -> Vec<String> {
        let mut reasons: Vec<String> = registration_reason(&self.registration)
            .into_iter()
            .collect();
        if !self.is_events_connected {
            reasons.push(EVENTS_DOWN.to_owned());
        }
        reasons
    }
}

/// The `/health` reason of a disconnected event plane.
pub const EVENTS_DOWN: &str =
    "event plane: not connected; kv routing without kv events or published load, reconnecting";

/// The `/health` reason of a registration that is not held, if it is not.
pub fn registration_reason(registration: &RegistrationStatus) -> Option<String> {
    let for_s = registration.since.elapsed().as_secs();
    match registration.state {
        RegistrationState::Held => None,
        RegistrationState::Unreachable => Some(format!(
            "discovery: unreachable for {for_s} s; serving with the last known mesh"
        )),
        RegistrationState::Lost => Some(format!(
            "discovery: registration lost {for_s} s ago; re-registering"
        )),
    }
}

/// Gauges of a process's backends, refreshed from a [`DependencyReport`] at each scrape.
#[derive(Clone)]
pub struct DependencyMetrics {
    registered: IntGauge,
    lease_losses: IntCounter,
    events_connected: IntGauge,
}

impl DependencyMetrics {
    /// Registers `kvmesh_discovery_registered`, `kvmesh_discovery_lease_losses_total` and
    /// `kvmesh_event_plane_connected` in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let registered = IntGauge::new(
            "kvmesh_discovery_registered",
            "1 while this process's discovery registration is held, 0 while it is lost or discovery is unreachable",
        )?;
        let lease_losses = IntCounter::new(
            "kvmesh_discovery_lease_losses_total",
            "Times this process's discovery lease was lost and re-registered",
        )?;
        let events_connected = IntGauge::new(
            "kvmesh_event_plane_connected",
            "1 while the event plane (NATS) is connected",
        )?;
        registry.register(Box::new(registered.clone()))?;
        registry.register(Box::new(lease_losses.clone()))?;
        registry.register(Box::new(events_connected.clone()))?;
        Ok(Self {
            registered,
            lease_losses,
            events_connected,
        })
    }

    /// Sets the gauges from `report`.
    pub fn observe(&self, report: &DependencyReport) {
        let is_held = report.registration.state == RegistrationState::Held;
        self.registered.set(i64::from(is_held));
        let counted = self.lease_losses.get();
        self.lease_losses
            .inc_by(report.registration.num_losses.saturating_sub(counted));
        self.events_connected
            .set(i64::from(report.is_events_connected));
    }
}
