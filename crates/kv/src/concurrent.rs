//! The concurrent index: queries on the caller's thread while apply lanes write.
//!
//! # Design
//!
//! Workers are split over `lanes` (`--router-event-threads`): worker `w` belongs to lane
//! `xxh3_64(LE64(w)) mod lanes` (the same function as [`crate::kv_partition`]). Each lane owns a
//! [`RadixIndex`] of *its* workers only, behind its own reader-writer lock, and one OS thread that
//! drains the lane's queue and applies batches in arrival order — so each worker's events apply
//! strictly in stream order while different lanes apply in parallel, and writers never contend with
//! each other.
//!
//! Queries take no lock at all. Each lane's index keeps everything a query reads (node index,
//! node records, member lists, member infos) in atomics inside chunks that never move, reached
//! through a layout the writer republishes when it adds a chunk; freed records and lists are only
//! reused after every query that might still see them has finished (an epoch grace period). A
//! query walks the lanes' indexes on the caller's thread, up to four together (each window of
//! path keys is touched in every lane before any is probed, so their cache misses overlap), and
//! merges the rows: lanes hold disjoint workers, so the merge is a union plus an element-wise sum of frequencies, exactly
//! like the fan-out over shards. Writers never wait for queries and queries never wait for
//! writers; a query sees each node as some prefix of its worker's events left it. Because every
//! lane's index is a plain [`RadixIndex`], the answers, digest and counts are by construction
//! those of a single-threaded index fed the same events (the property tests check it, after a
//! flush).
//!
//! The rest of a lane's state (member lookups, counters, digest) belongs to its apply thread; the
//! administrative reads ([`ConcurrentIndex::digest`], counts, dumps) take a per-lane mutex that
//! the apply thread holds for at most about `LOCK_BUDGET_OPS` block operations at a time.
//!
//! Splitting by worker costs some memory when workers share prefixes (a shared node exists once
//! per lane that has a member holding it) and makes a query visit every lane; both are bounded by
//! the lane count, which is small (one per core).

use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::counters::EventCounters;
use crate::events::{KvEventBatch, WorkerKey};
use crate::hashing::kv_partition;
use crate::radix::{IndexDump, RadixIndex, Shared, WorkerCursor, find_into};
use crate::scores::OverlapScores;

/// Block operations a lane's apply thread does per hold of its mutex (bounds how long an
/// administrative read waits).
const LOCK_BUDGET_OPS: usize = 4096;
/// Default batches queued per lane before [`ConcurrentIndex::apply`] blocks.
pub const DEFAULT_QUEUE_CAPACITY: usize = 4096;

/// Error returned when a lane's apply thread is gone (it panicked); the index no longer updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneClosed;

impl std::fmt::Display for LaneClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kv index apply lane stopped")
    }
}

impl std::error::Error for LaneClosed {}

enum Msg {
    Batch(KvEventBatch),
    Load(Vec<KvEventBatch>, Vec<WorkerCursor>),
    Barrier(SyncSender<()>),
}

struct Lane {
    /// The lane's index, owned by its apply thread between messages.
    index: Arc<Mutex<RadixIndex>>,
    tx: Option<SyncSender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

/// A [`RadixIndex`] split over apply lanes, queried without locks (see the module docs).
pub struct ConcurrentIndex {
    lanes: Vec<Lane>,
    /// What queries read of each lane, without the mutex (in lane order).
    shareds: Vec<Arc<Shared>>,
}

impl std::fmt::Debug for ConcurrentIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrentIndex")
            .field("lanes", &self.lanes.len())
            .finish()
    }
}

impl ConcurrentIndex {
    /// An empty index with `lanes` apply threads (at least 1) and the default queue capacity.
    pub fn new(lanes: usize) -> Self {
        Self::with_queue_capacity(lanes, DEFAULT_QUEUE_CAPACITY)
    }

    /// An empty index whose lanes queue at most `capacity` batches each; [`Self::apply`] blocks
    /// when a lane's queue is full, which pushes back on the event consumer.
    pub fn with_queue_capacity(lanes: usize, capacity: usize) -> Self {
        let mut shareds = Vec::with_capacity(lanes.max(1));
        let lanes = (0..lanes.max(1))
            .map(|lane| {
                let index = RadixIndex::new();
                shareds.push(Arc::clone(index.shared()));
                let index = Arc::new(Mutex::new(index));
                let (tx, rx) = sync_channel(capacity.max(1));
                let lane_index = Arc::clone(&index);
                let thread = std::thread::Builder::new()
                    .name(format!("kv-apply-{lane}"))
                    .spawn(move || run_lane(&lane_index, &rx))
                    .ok();
                Lane {
                    index,
                    tx: thread.is_some().then_some(tx),
                    thread,
                }
            })
            .collect();
        Self { lanes, shareds }
    }

    /// Number of apply lanes.
    pub fn num_lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Lane a worker's events apply on.
    pub fn lane_of(&self, worker_id: u64) -> usize {
        kv_partition(worker_id, self.lanes.len() as u32) as usize
    }

    /// Queues a batch on its worker's lane. Returns once queued (blocking while the queue is full),
    /// not once applied; use [`Self::flush`] to wait for application.
    pub fn apply(&self, batch: KvEventBatch) -> Result<(), LaneClosed> {
        let lane = &self.lanes[self.lane_of(batch.worker_id)];
        send(lane, Msg::Batch(batch))
    }

    /// Queues a batch on its worker's lane if the lane has room, without blocking: `Ok(None)`
    /// once queued, `Ok(Some(batch))` handing the batch back when the queue is full. Lets an
    /// async consumer queue without leaving its executor thread, and wait only when it must.
    pub fn try_apply(&self, batch: KvEventBatch) -> Result<Option<KvEventBatch>, LaneClosed> {
        let lane = &self.lanes[self.lane_of(batch.worker_id)];
        let tx = lane.tx.as_ref().ok_or(LaneClosed)?;
        match tx.try_send(Msg::Batch(batch)) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(Msg::Batch(batch))) => Ok(Some(batch)),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(LaneClosed),
        }
    }

    /// Queues a worker-removed marker (docs/kv-events.md, "Worker removal"): the worker's blocks
    /// go and later events for it are ignored, in stream order with its other batches.
    pub fn remove_worker(&self, worker_id: u64) -> Result<(), LaneClosed> {
        self.apply(KvEventBatch::worker_removed(worker_id))
    }

    /// Whether `worker_id` is removed (a worker-removed marker applied, no readmission since), and
    /// how many times it was readmitted: what names its next marker.
    pub fn removal_state(&self, worker_id: u64) -> (bool, u32) {
        let index = read(&self.lanes[self.lane_of(worker_id)]);
        (
            index.is_worker_removed(worker_id),
            index.num_readmissions(worker_id),
        )
    }

    /// Waits until every batch queued before the call is applied (the drain step of a consistent
    /// cut; docs/indexer.md, "Concurrency").
    pub fn flush(&self) -> Result<(), LaneClosed> {
        let mut acks = Vec::with_capacity(self.lanes.len());
        for lane in &self.lanes {
            let (ack_tx, ack_rx) = sync_channel(1);
            send(lane, Msg::Barrier(ack_tx))?;
            acks.push(ack_rx);
        }
        for ack in acks {
            ack.recv().map_err(|_| LaneClosed)?;
        }
        Ok(())
    }

    /// Matches a sequence of local hashes against every lane (see [`RadixIndex::find_matches`])
    /// without taking any lock, while the lanes apply events.
    pub fn find_matches(&self, local_hashes: &[u64]) -> OverlapScores {
        let mut out = OverlapScores::default();
        find_into(&self.shareds, local_hashes, &mut out);
        out.sort();
        out
    }

    /// Sum of the lanes' digests: the digest of the union (flush first for a consistent cut).
    pub fn digest(&self) -> u64 {
        self.fold(0u64, |sum, index| sum.wrapping_add(index.digest()))
    }

    /// (block, member) entries over all lanes.
    pub fn num_blocks(&self) -> u64 {
        self.fold(0, |sum, index| sum + index.num_blocks())
    }

    /// Known (worker, dp_rank) pairs over all lanes, sorted.
    pub fn workers(&self) -> Vec<WorkerKey> {
        let mut workers = self.fold(Vec::new(), |mut all, index| {
            all.extend(index.workers());
            all
        });
        workers.sort_unstable();
        workers
    }

    /// Distinct worker ids (a worker's dp ranks share a lane, so lanes never count one twice).
    pub fn num_workers(&self) -> usize {
        self.fold(0, |sum, index| sum + index.num_workers())
    }

    /// Blocks held by one member.
    pub fn tree_size(&self, worker: WorkerKey) -> u64 {
        read(&self.lanes[self.lane_of(worker.worker_id)]).tree_size(worker)
    }

    /// Last applied event id of one member.
    pub fn last_event_id(&self, worker: WorkerKey) -> Option<u64> {
        read(&self.lanes[self.lane_of(worker.worker_id)]).last_event_id(worker)
    }

    /// Outcome counters summed over lanes.
    pub fn counters(&self) -> EventCounters {
        self.fold(EventCounters::default(), |mut sum, index| {
            sum.add(&index.counters());
            sum
        })
    }

    /// Heap bytes of all lanes' indexes.
    pub fn memory_bytes(&self) -> usize {
        self.fold(0, |sum, index| sum + index.memory_bytes())
    }

    /// Flushes, then dumps every lane (lanes hold disjoint workers, so the union is the state).
    /// The caller must stop queueing batches for the cut to be consistent.
    pub fn dump(&self) -> Result<IndexDump, LaneClosed> {
        self.flush()?;
        let mut dump = self.fold(IndexDump::default(), |mut all, index| {
            let part = index.dump();
            all.cursors.extend(part.cursors);
            all.batches.extend(part.batches);
            all
        });
        dump.cursors.sort_unstable();
        dump.batches.sort_by_key(|batch| !batch.worker_removed);
        Ok(dump)
    }

    /// Loads a dump (a snapshot) into the lanes and waits until it is applied.
    pub fn load_dump(&self, dump: &IndexDump) -> Result<(), LaneClosed> {
        let lanes = self.lanes.len();
        let mut batches: Vec<Vec<KvEventBatch>> = vec![Vec::new(); lanes];
        let mut cursors: Vec<Vec<WorkerCursor>> = vec![Vec::new(); lanes];
        for batch in &dump.batches {
            batches[self.lane_of(batch.worker_id)].push(batch.clone());
        }
        for cursor in &dump.cursors {
            cursors[self.lane_of(cursor.worker.worker_id)].push(*cursor);
        }
        for ((lane, batches), cursors) in self.lanes.iter().zip(batches).zip(cursors) {
            send(lane, Msg::Load(batches, cursors))?;
        }
        self.flush()
    }

    /// Runs `f` over each lane's index under its mutex, accumulating a value.
    pub fn fold<T>(&self, init: T, mut f: impl FnMut(T, &RadixIndex) -> T) -> T {
        let mut acc = init;
        for lane in &self.lanes {
            acc = f(acc, &read(lane));
        }
        acc
    }
}

impl Drop for ConcurrentIndex {
    fn drop(&mut self) {
        for lane in &mut self.lanes {
            lane.tx = None;
        }
        for lane in &mut self.lanes {
            if let Some(thread) = lane.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn send(lane: &Lane, msg: Msg) -> Result<(), LaneClosed> {
    lane.tx
        .as_ref()
        .ok_or(LaneClosed)?
        .send(msg)
        .map_err(|_| LaneClosed)
}

fn read(lane: &Lane) -> MutexGuard<'_, RadixIndex> {
    lane.index.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The apply thread of one lane.
fn run_lane(index: &Mutex<RadixIndex>, rx: &Receiver<Msg>) {
    let mut applied: Vec<KvEventBatch> = Vec::new();
    let mut acks: Vec<SyncSender<()>> = Vec::new();
    while let Ok(first) = rx.recv() {
        let mut guard = index.lock().unwrap_or_else(PoisonError::into_inner);
        let mut budget = LOCK_BUDGET_OPS;
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            match msg {
                Msg::Batch(batch) => {
                    guard.apply(&batch);
                    budget = budget.saturating_sub(batch.block_ops().max(1));
                    applied.push(batch);
                }
                Msg::Load(batches, cursors) => {
                    for batch in &batches {
                        guard.load_batch(batch);
                    }
                    for cursor in cursors {
                        guard.set_cursor(cursor.worker, cursor.last_event_id);
                    }
                    budget = 0;
                }
                Msg::Barrier(ack) => acks.push(ack),
            }
            if budget == 0 {
                break;
            }
            next = rx.try_recv().ok();
        }
        drop(guard);
        // Free the batches and wake flushers outside the mutex.
        applied.clear();
        for ack in acks.drain(..) {
            let _ = ack.send(());
        }
    }
}
