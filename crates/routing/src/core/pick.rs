//! Choosing among eligible candidates and recording the choice (docs/routing.md: "Modes",
//! "Cost function", "Selection", "Load tracking").

use std::time::Duration;

use kvmesh_kv::{OverlapScores, WorkerKey};

use super::RouterCore;
use super::decide::{Candidate, Plan};
use crate::config::RouterMode;
use crate::core::PreparedRequest;
use crate::cost::{CandidateLoad, CostPolicy, EffectiveKv, RequestShape, kv_cost, lmetric_cost};
use crate::modes;
use crate::request::{Decision, TerminalPath};
use crate::select::select_index;
use crate::sync::SyncKind;
use crate::tracker::TrackAdd;

impl RouterCore {
    /// Picks a candidate (the soft-bound one when eligible, else by mode) and records it.
    pub(super) fn select_and_record(
        &mut self,
        prepared: PreparedRequest,
        eff: &EffectiveKv,
        plan: &Plan,
        candidates: &[Candidate],
        overlap: Option<&OverlapScores>,
        now: Duration,
    ) -> Decision {
        let preferred = plan
            .preferred
            .and_then(|p| candidates.iter().position(|c| c.key == p));
        let index = match preferred {
            Some(index) => index,
            None => self.choose(&prepared, eff, candidates, overlap),
        };
        let chosen = candidates[index].key;
        let device_overlap = overlap.map_or(0, |o| o.device(chosen));
        self.record(prepared, eff, plan, chosen, device_overlap, now)
    }

    fn choose(
        &mut self,
        prepared: &PreparedRequest,
        eff: &EffectiveKv,
        candidates: &[Candidate],
        overlap: Option<&OverlapScores>,
    ) -> usize {
        let inflight = || -> Vec<u32> {
            candidates
                .iter()
                .map(|c| self.tracker.inflight(c.key.worker_id))
                .collect()
        };
        match self.config.mode {
            RouterMode::Kv => self.choose_kv(prepared, eff, candidates, overlap),
            RouterMode::RoundRobin => modes::round_robin(candidates.len(), &mut self.rr_counter),
            RouterMode::Random => modes::random(candidates.len(), &mut self.rng),
            RouterMode::PowerOfTwo => {
                let counts = inflight();
                modes::power_of_two(&counts, &mut self.rng)
            }
            RouterMode::LeastLoaded => {
                let counts = inflight();
                modes::least_loaded(&counts, &mut self.rng)
            }
            RouterMode::DeviceAwareWeighted => {
                let counts = inflight();
                let is_cpu: Vec<bool> = candidates.iter().map(|c| c.is_cpu).collect();
                let ratio = self.config.encoder_cuda_to_cpu_ratio;
                modes::device_aware(&is_cpu, &counts, ratio, &mut self.rng)
            }
            RouterMode::Direct => 0,
        }
    }

    fn choose_kv(
        &mut self,
        prepared: &PreparedRequest,
        eff: &EffectiveKv,
        candidates: &[Candidate],
        overlap: Option<&OverlapScores>,
    ) -> usize {
        let track_blocks = self.config.kv.track_active_blocks;
        let reuse_hashes: &[u64] = if eff.assume_kv_reuse {
            &prepared.seq_hashes
        } else {
            &[]
        };
        let num_blocks = prepared.seq_hashes.len() as u64;
        let rows = overlap.map_or(&[][..], |o| &o.scores[..]);
        let mut row_at = 0;
        let mut loads = Vec::with_capacity(candidates.len());
        let mut min_prefill = u64::MAX;
        for c in candidates {
            // Candidates and rows are both sorted by key: merge instead of searching.
            while row_at < rows.len() && rows[row_at].worker < c.key {
                row_at += 1;
            }
            let row = rows.get(row_at).filter(|r| r.worker == c.key);
            let view = self.tracker.view(c.key, reuse_hashes);
            min_prefill = min_prefill.min(view.prefill_tokens);
            loads.push(CandidateLoad {
                device_overlap: row.map_or(0, |r| r.device),
                host_overlap: row.map_or(0, |r| r.host_pinned),
                disk_overlap: row.map_or(0, |r| r.disk),
                active_prefill_tokens: view.prefill_tokens,
                has_load_entry: view.has_entry,
                decode_blocks: if track_blocks {
                    view.active_blocks + num_blocks - view.present as u64
                } else {
                    0
                },
                active_requests: view.requests,
            });
        }
        let shape = RequestShape {
            isl: prepared.isl,
            block_size: self.block_size,
            min_active_prefill_tokens: if min_prefill == u64::MAX {
                0
            } else {
                min_prefill
            },
        };
        let score = match self.config.kv.cost_policy {
            CostPolicy::Default => kv_cost,
            CostPolicy::Lmetric => lmetric_cost,
        };
        let costs: Vec<f64> = loads
            .iter()
            .map(|load| score(&eff.weights, &shape, load))
            .collect();
        if let Some(adaptive) = &self.adaptive {
            let keys: Vec<WorkerKey> = candidates.iter().map(|c| c.key).collect();
            let allowed = adaptive.under_share_cap(&keys);
            if allowed.iter().any(|a| !a) {
                let kept: Vec<usize> = (0..costs.len()).filter(|&i| allowed[i]).collect();
                let kept_costs: Vec<f64> = kept.iter().map(|&i| costs[i]).collect();
                let at = select_index(&kept_costs, eff.temperature, &mut self.rng).unwrap_or(0);
                return kept.get(at).copied().unwrap_or(0);
            }
        }
        select_index(&costs, eff.temperature, &mut self.rng).unwrap_or(0)
    }

    /// Tracks the routed request, binds its session, feeds the approximate and side indexes and
    /// publishes the sync events.
    fn record(
        &mut self,
        prepared: PreparedRequest,
        eff: &EffectiveKv,
        plan: &Plan,
        chosen: WorkerKey,
        device_overlap: u32,
        now: Duration,
    ) -> Decision {
        let is_kv = self.config.mode == RouterMode::Kv;
        let block = u64::from(self.block_size);
        let kv = &self.config.kv;
        let hashes: Vec<u64> = if !is_kv || !kv.track_active_blocks {
            Vec::new()
        } else if eff.assume_kv_reuse {
            prepared.seq_hashes.clone()
        } else {
            (0..prepared.seq_hashes.len())
                .map(|_| self.rng.next_u64())
                .collect()
        };
        // Tracked in every mode: busy detection and the queue read it; only kv mode knows an
        // overlap to subtract.
        let prefill_tokens = if eff.weights.track_prefill_tokens {
            prepared
                .isl
                .saturating_sub(u64::from(device_overlap) * block)
        } else {
            0
        };
        let osl = if is_kv && kv.track_output_blocks {
            prepared.hints.expected_output_tokens
        } else {
            None
        };
        if is_kv && (kv.overlap_score_credit > 0.0 || eff.queries_index()) {
            for index in [self.approx.as_mut(), self.side.as_mut()]
                .into_iter()
                .flatten()
            {
                index.record_routing_decision(
                    chosen,
                    &prepared.local_hashes,
                    &prepared.seq_hashes,
                    now,
                );
            }
        }
        let key = self.key(&prepared.request_id);
        if let Some(previous) = self.tracker.free(&key) {
            // A caller reused a request id (a retry after a lost answer): the earlier request is
            // replaced, and what it held (its session reference included) goes with it.
            self.release_session(&key, &previous, TerminalPath::Cancelled, now);
            let path = TerminalPath::Cancelled;
            self.emit(&key, previous.worker, SyncKind::Free { path });
        }
        let session = plan
            .session
            .as_ref()
            .map(|s| self.sessions.acquire(&s.id, chosen, s.mode, s.ttl, now));
        self.emit(
            &key,
            chosen,
            SyncKind::Add {
                token_sequence_hashes: hashes.clone(),
                track_prefill_tokens: eff.weights.track_prefill_tokens,
                expected_output_tokens: prepared.hints.expected_output_tokens,
                initial_prefill_tokens: Some(prefill_tokens),
                expected_prefill_duration_ms: None,
                lora_name: prepared.lora_name.clone(),
            },
        );
        if let Some(hold) = &session {
            self.emit(
                &key,
                chosen,
                SyncKind::SessionBind {
                    session_id: hold.id.clone(),
                },
            );
        }
        self.health.routed(chosen.worker_id, &key, now);
        let cache = self.cache_shares(chosen);
        if let Some(adaptive) = self.adaptive.as_mut() {
            let observed = (
                self.tracker.prefill_tokens(chosen),
                prefill_tokens,
                self.tracker.active_blocks(chosen),
                self.tracker.requests_on(chosen),
            );
            adaptive.on_routed(key.clone(), chosen, now, self.block_size, observed, cache);
        }
        self.tracker.add(
            key,
            TrackAdd {
                worker: chosen,
                hashes,
                prefill_tokens,
                isl: prepared.isl,
                osl,
                started_at: now,
                session,
                owner: prepared.hints.caller_instance_id,
            },
        );
        Decision {
            worker_id: chosen.worker_id,
            dp_rank: if is_kv {
                Some(chosen.dp_rank)
            } else {
                plan.pin_rank
            },
            overlap_blocks: device_overlap,
            cached_tokens: u64::from(device_overlap) * block,
            required_blocks: prepared.isl.div_ceil(block),
            request_id: prepared.request_id,
        }
    }
}
