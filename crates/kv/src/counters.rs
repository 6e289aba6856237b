//! Outcome counters of event application, shaped for `kvmesh_indexer_events_applied_total`.

/// Event type label of `kvmesh_indexer_events_applied_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A stored event.
    Stored,
    /// A removed event.
    Removed,
    /// A cleared event.
    Cleared,
}

impl EventType {
    /// Every type, in label order.
    pub const ALL: [EventType; 3] = [EventType::Stored, EventType::Removed, EventType::Cleared];

    /// The Prometheus label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Stored => "stored",
            EventType::Removed => "removed",
            EventType::Cleared => "cleared",
        }
    }
}

/// Status label of `kvmesh_indexer_events_applied_total` (docs/indexer.md, "Metrics").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventStatus {
    /// Applied in full.
    Ok,
    /// A stored event whose parent the member does not hold: dropped whole.
    ParentBlockNotFound,
    /// A removed event naming at least one hash the member does not hold in that tier; the known
    /// hashes were still removed.
    BlockNotFound,
    /// A stored event that references itself (a hash repeated, parent included), or whose path
    /// collides with another path's 64-bit key, or that does not fit the index: dropped.
    InvalidBlock,
}

impl EventStatus {
    /// Every status, in label order.
    pub const ALL: [EventStatus; 4] = [
        EventStatus::Ok,
        EventStatus::ParentBlockNotFound,
        EventStatus::BlockNotFound,
        EventStatus::InvalidBlock,
    ];

    /// The Prometheus label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Ok => "ok",
            EventStatus::ParentBlockNotFound => "parent_block_not_found",
            EventStatus::BlockNotFound => "block_not_found",
            EventStatus::InvalidBlock => "invalid_block",
        }
    }
}

/// Counts of one event type by status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatusCounts {
    /// Applied in full.
    pub ok: u64,
    /// Dropped: unknown parent.
    pub parent_block_not_found: u64,
    /// Partly applied: unknown hashes ignored.
    pub block_not_found: u64,
    /// Dropped: self-reference, key collision or full index.
    pub invalid_block: u64,
}

impl StatusCounts {
    /// The count for one status.
    pub fn get(&self, status: EventStatus) -> u64 {
        match status {
            EventStatus::Ok => self.ok,
            EventStatus::ParentBlockNotFound => self.parent_block_not_found,
            EventStatus::BlockNotFound => self.block_not_found,
            EventStatus::InvalidBlock => self.invalid_block,
        }
    }

    pub(crate) fn bump(&mut self, status: EventStatus) {
        match status {
            EventStatus::Ok => self.ok += 1,
            EventStatus::ParentBlockNotFound => self.parent_block_not_found += 1,
            EventStatus::BlockNotFound => self.block_not_found += 1,
            EventStatus::InvalidBlock => self.invalid_block += 1,
        }
    }

    fn add(&mut self, other: &StatusCounts) {
        self.ok += other.ok;
        self.parent_block_not_found += other.parent_block_not_found;
        self.block_not_found += other.block_not_found;
        self.invalid_block += other.invalid_block;
    }
}

/// Everything the index counts while applying events, cumulative since creation.
///
/// Exists so the indexer service can export its Prometheus metrics without the index depending
/// on a metrics library: read it (cheap copy) and set counters from the differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventCounters {
    /// Stored events by status.
    pub stored: StatusCounts,
    /// Removed events by status.
    pub removed: StatusCounts,
    /// Cleared events by status (always `ok`).
    pub cleared: StatusCounts,
    /// Events skipped because their id was not above the member's last applied id.
    pub duplicates: u64,
    /// Events applied after a jump in event ids (`kvmesh_indexer_event_gaps_total`).
    pub gaps: u64,
    /// Events skipped because their worker was removed earlier.
    pub ignored_removed_worker: u64,
    /// Worker-removed markers that removed a worker (repeats are no-ops and not counted).
    pub workers_removed: u64,
}

impl EventCounters {
    /// Counts of one event type.
    pub fn of(&self, event_type: EventType) -> &StatusCounts {
        match event_type {
            EventType::Stored => &self.stored,
            EventType::Removed => &self.removed,
            EventType::Cleared => &self.cleared,
        }
    }

    /// Every (type, status, count) triple, for exporting the labelled counter.
    pub fn applied(&self) -> impl Iterator<Item = (EventType, EventStatus, u64)> + '_ {
        EventType::ALL.into_iter().flat_map(move |event_type| {
            EventStatus::ALL
                .into_iter()
                .map(move |status| (event_type, status, self.of(event_type).get(status)))
        })
    }

    /// Adds another index's counters (lanes, shards).
    pub fn add(&mut self, other: &EventCounters) {
        self.stored.add(&other.stored);
        self.removed.add(&other.removed);
        self.cleared.add(&other.cleared);
        self.duplicates += other.duplicates;
        self.gaps += other.gaps;
        self.ignored_removed_worker += other.ignored_removed_worker;
        self.workers_removed += other.workers_removed;
    }

    pub(crate) fn bump(&mut self, event_type: EventType, status: EventStatus) {
        match event_type {
            EventType::Stored => self.stored.bump(status),
            EventType::Removed => self.removed.bump(status),
            EventType::Cleared => self.cleared.bump(status),
        }
    }
}
