//! Active-load tracking (docs/routing.md, "Load tracking"): what every routed request still costs
//! its worker.
//!
//! Per (worker, dp_rank) the tracker keeps the number of active requests, a reference-counted
//! multiset of block hashes and the prefill tokens not yet computed. A request enters at
//! dispatch ([`Tracker::add`]), loses its prefill at its first token, grows placeholder blocks as
//! it generates, and leaves through [`Tracker::free`] — whatever way it ended — or through expiry.
//!
//! Decisions need "how many of this request's blocks does the rank already hold?" for every
//! candidate. Tracked prompt blocks are sequence hashes, and a sequence hash names its whole
//! prefix, so the hashes a rank holds of any one prompt form a prefix of it: the count is found
//! by binary search (O(log n) lookups per candidate rather than one per block).

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::Duration;

use kvmesh_kv::WorkerKey;

use crate::rng::Rng;
use crate::session::SessionHold;

/// Longest sequence (prompt + generated tokens) whose output blocks are tracked. Token counts
/// arrive in callers' reports; past any real context length they only cost memory.
const MAX_TRACKED_SEQUENCE_TOKENS: u64 = 1 << 22;

/// (router id, request id): requests of replicas are tracked next to our own.
pub(crate) type ReqKey = (Arc<str>, String);

type HashCounts = kvmesh_kv::BlockHashMap<u32>;

/// Multiply-xor hashing of small integer keys ((worker, rank) pairs, worker ids): the rank table
/// is read once per candidate per decision, so it must be cheaper than SipHash or a B-tree walk.
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

/// One tracked request.
#[derive(Debug, Clone)]
pub(crate) struct ActiveRequest {
    pub worker: WorkerKey,
    /// Prompt blocks held (sequence hashes, or fresh random ones without KV reuse).
    pub hashes: Vec<u64>,
    /// Output placeholder blocks (random hashes).
    pub placeholders: Vec<u64>,
    /// Prefill tokens still counted (0 once the first token arrived, or when untracked).
    pub prefill_tokens: u64,
    pub isl: u64,
    pub generated: u64,
    /// Expected output length when the request's exclusive blocks decay (output tracking on).
    pub osl: Option<u32>,
    pub started_at: Duration,
    /// Session binding the request holds a reference on (local requests only).
    pub session: Option<SessionHold>,
    /// The discovery instance whose departure releases the request (a remote caller, or the
    /// replica that routed it).
    pub owner: Option<u64>,
}

/// What to track for a new request.
#[derive(Debug, Clone)]
pub(crate) struct TrackAdd {
    pub worker: WorkerKey,
    pub hashes: Vec<u64>,
    pub prefill_tokens: u64,
    pub isl: u64,
    pub osl: Option<u32>,
    pub started_at: Duration,
    pub session: Option<SessionHold>,
    pub owner: Option<u64>,
}

/// Load of one (worker, dp_rank).
#[derive(Debug, Default)]
pub(crate) struct RankLoad {
    pub num_requests: u32,
    refs: HashCounts,
    pub prefill_tokens: u64,
    /// Requests whose exclusive blocks decay with progress.
    decaying: BTreeSet<ReqKey>,
}

/// What a decision reads about one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RankView {
    pub has_entry: bool,
    pub prefill_tokens: u64,
    pub requests: u32,
    pub active_blocks: u64,
    pub present: usize,
}

/// A read-only view of one rank's tracked load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RankLoadSnapshot {
    /// Requests active on the rank.
    pub active_requests: u32,
    /// Weighted distinct blocks held (`active_blocks` of docs/routing.md, "Load tracking").
    pub active_blocks: u64,
    /// Prefill tokens not yet computed.
    pub prefill_tokens: u64,
}

/// The tracker (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    ranks: FastMap<WorkerKey, RankLoad>,
    inflight: FastMap<u64, u32>,
    requests: HashMap<ReqKey, ActiveRequest>,
    by_start: BTreeSet<(Duration, ReqKey)>,
}

impl Tracker {
    /// Starts tracking a request; an entry under the same key is freed first.
    pub fn add(&mut self, key: ReqKey, add: TrackAdd) {
        self.free(&key);
        let rank = self.ranks.entry(add.worker).or_default();
        rank.num_requests += 1;
        rank.prefill_tokens = rank.prefill_tokens.saturating_add(add.prefill_tokens);
        for &hash in &add.hashes {
            *rank.refs.entry(hash).or_insert(0) += 1;
        }
        if add.osl.is_some() {
            rank.decaying.insert(key.clone());
        }
        *self.inflight.entry(add.worker.worker_id).or_insert(0) += 1;
        self.by_start.insert((add.started_at, key.clone()));
        self.requests.insert(
            key,
            ActiveRequest {
                worker: add.worker,
                hashes: add.hashes,
                placeholders: Vec::new(),
                prefill_tokens: add.prefill_tokens,
                isl: add.isl,
                generated: 0,
                osl: add.osl,
                started_at: add.started_at,
                session: add.session,
                owner: add.owner,
            },
        );
    }

    /// Removes the prefill entry (first token). Returns whether anything changed.
    pub fn mark_prefill_done(&mut self, key: &ReqKey) -> bool {
        let Some(request) = self.requests.get_mut(key) else {
            return false;
        };
        if request.prefill_tokens == 0 {
            return false;
        }
        if let Some(rank) = self.ranks.get_mut(&request.worker) {
            rank.prefill_tokens = rank.prefill_tokens.saturating_sub(request.prefill_tokens);
        }
        request.prefill_tokens = 0;
        true
    }

    /// Records `num_tokens` more generated tokens (counts come from callers' reports); with output tracking, adds one placeholder
    /// block each time `ceil((ISL + generated) / B)` grows.
    pub fn add_output_tokens(
        &mut self,
        key: &ReqKey,
        num_tokens: u64,
        block_size: u32,
        track_output_blocks: bool,
        rng: &mut Rng,
    ) {
        let Some(request) = self.requests.get_mut(key) else {
            return;
        };
        request.generated = request.generated.saturating_add(num_tokens);
        if !track_output_blocks {
            return;
        }
        let block = u64::from(block_size.max(1));
        let tracked = request
            .isl
            .saturating_add(request.generated)
            .min(request.isl.max(MAX_TRACKED_SEQUENCE_TOKENS));
        let wanted = tracked.div_ceil(block) - request.isl.div_ceil(block);
        let Some(rank) = self.ranks.get_mut(&request.worker) else {
            return;
        };
        while (request.placeholders.len() as u64) < wanted {
            let hash = rng.next_u64();
            *rank.refs.entry(hash).or_insert(0) += 1;
            request.placeholders.push(hash);
        }
    }

    /// Stops tracking a request and releases everything it held.
    pub fn free(&mut self, key: &ReqKey) -> Option<ActiveRequest> {
        let request = self.requests.remove(key)?;
        self.by_start.remove(&(request.started_at, key.clone()));
        if let Some(rank) = self.ranks.get_mut(&request.worker) {
            rank.num_requests = rank.num_requests.saturating_sub(1);
            rank.prefill_tokens = rank.prefill_tokens.saturating_sub(request.prefill_tokens);
            for hash in request.hashes.iter().chain(&request.placeholders) {
                if let Some(count) = rank.refs.get_mut(hash) {
                    *count -= 1;
                    if *count == 0 {
                        rank.refs.remove(hash);
                    }
                }
            }
            rank.decaying.remove(key);
        }
        if let Some(count) = self.inflight.get_mut(&request.worker.worker_id) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.inflight.remove(&request.worker.worker_id);
            }
        }
        Some(request)
    }

    /// Frees every request started at or before `cutoff`.
    pub fn expire(&mut self, cutoff: Duration) -> Vec<(ReqKey, ActiveRequest)> {
        let mut expired = Vec::new();
        while let Some((started, _)) = self.by_start.first() {
            if *started > cutoff {
                break;
            }
            let Some((_, key)) = self.by_start.pop_first() else {
                break;
            };
            if let Some(request) = self.free(&key) {
                expired.push((key, request));
            }
        }
        expired
    }

    /// Frees every request on a worker that left and forgets its ranks.
    pub fn remove_worker(&mut self, worker_id: u64) -> Vec<(ReqKey, ActiveRequest)> {
        let keys: Vec<ReqKey> = self
            .requests
            .iter()
            .filter(|(_, r)| r.worker.worker_id == worker_id)
            .map(|(k, _)| k.clone())
            .collect();
        let mut freed: Vec<(ReqKey, ActiveRequest)> = keys
            .into_iter()
            .filter_map(|key| self.free(&key).map(|r| (key, r)))
            .collect();
        freed.sort_by(|a, b| a.0.cmp(&b.0));
        self.ranks.retain(|key, _| key.worker_id != worker_id);
        self.inflight.remove(&worker_id);
        freed
    }

    /// Frees every request owned by the discovery instance `owner`, in key order.
    pub fn remove_owned_by(&mut self, owner: u64) -> Vec<(ReqKey, ActiveRequest)> {
        let mut keys: Vec<ReqKey> = self
            .requests
            .iter()
            .filter(|(_, r)| r.owner == Some(owner))
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|key| self.free(&key).map(|r| (key, r)))
            .collect()
    }

    /// The tracked request under `key`.
    pub fn get(&self, key: &ReqKey) -> Option<&ActiveRequest> {
        self.requests.get(key)
    }

    /// Number of tracked requests (all origins).
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Requests in flight on a worker (all ranks): the table of the non-kv modes.
    pub fn inflight(&self, worker_id: u64) -> u32 {
        self.inflight.get(&worker_id).copied().unwrap_or(0)
    }

    /// Prefill tokens tracked on a rank.
    pub fn prefill_tokens(&self, worker: WorkerKey) -> u64 {
        self.ranks.get(&worker).map_or(0, |r| r.prefill_tokens)
    }

    /// Requests active on a rank.
    pub fn requests_on(&self, worker: WorkerKey) -> u32 {
        self.ranks.get(&worker).map_or(0, |r| r.num_requests)
    }

    /// Weighted distinct blocks on a rank: shared blocks and blocks of requests without an
    /// expected output length weigh 1; blocks used only by a decaying request weigh
    /// `max(0, 1 − generated / max(osl, 1))`.
    pub fn active_blocks(&self, worker: WorkerKey) -> u64 {
        self.ranks
            .get(&worker)
            .map_or(0, |rank| self.weighted_blocks(rank))
    }

    /// Everything a decision reads about one rank, from one lookup; `present` counts the leading
    /// `hashes` the rank holds.
    pub fn view(&self, worker: WorkerKey, hashes: &[u64]) -> RankView {
        let Some(rank) = self.ranks.get(&worker) else {
            return RankView::default();
        };
        let present = match (hashes.first(), hashes.last()) {
            // Most ranks hold none of a prompt, some hold all of it: one lookup each.
            (Some(first), Some(last)) if !rank.refs.is_empty() => {
                if !rank.refs.contains_key(first) {
                    0
                } else if rank.refs.contains_key(last) {
                    hashes.len()
                } else {
                    hashes.partition_point(|hash| rank.refs.contains_key(hash))
                }
            }
            _ => 0,
        };
        RankView {
            has_entry: true,
            prefill_tokens: rank.prefill_tokens,
            requests: rank.num_requests,
            active_blocks: self.weighted_blocks(rank),
            present,
        }
    }

    fn weighted_blocks(&self, rank: &RankLoad) -> u64 {
        let distinct = rank.refs.len() as u64;
        if rank.decaying.is_empty() {
            return distinct;
        }
        let mut discount = 0.0;
        for key in &rank.decaying {
            let Some(request) = self.requests.get(key) else {
                continue;
            };
            let osl = f64::from(request.osl.unwrap_or(1).max(1));
            let weight = (1.0 - request.generated as f64 / osl).max(0.0);
            let shared = request
                .hashes
                .partition_point(|hash| rank.refs.get(hash).is_some_and(|&count| count >= 2));
            let exclusive = request.placeholders.len() + request.hashes.len() - shared;
            discount += (1.0 - weight) * exclusive as f64;
        }
        (distinct as f64 - discount).max(0.0).round() as u64
    }

    /// A snapshot of one rank (all zeros when unknown).
    pub fn snapshot(&self, worker: WorkerKey) -> RankLoadSnapshot {
        RankLoadSnapshot {
            active_requests: self.requests_on(worker),
            active_blocks: self.active_blocks(worker),
            prefill_tokens: self.prefill_tokens(worker),
        }
    }

    /// Ranks the tracker knows, in order.
    pub fn ranks(&self) -> Vec<WorkerKey> {
        let mut keys: Vec<WorkerKey> = self.ranks.keys().copied().collect();
        keys.sort_unstable();
        keys
    }
}

#[cfg(test)]
#[path = "tracker_tests.rs"]
mod tests;
