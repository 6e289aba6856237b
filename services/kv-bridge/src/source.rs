//! One engine publisher (one dp rank): the SUB socket, sequence tracking with gap recovery
//! through the engine's replay socket, and the turning of each batch into [`RankEvents`].

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use kvmesh_proto::v1::{KvCleared, KvEvent, StorageTier, kv_event};

use crate::convert::Converter;
use crate::guard::{self, Guarding};
use crate::metrics::BridgeMetrics;
use crate::publish::RankEvents;
use crate::wire::{self, WireError};

/// How long one replay request may take, connection included.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(2);

/// Sequence number the engine's replay socket sends as its end marker.
const REPLAY_END: u64 = u64::MAX;

/// Where one engine publisher is and how to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceConfig {
    /// ZMQ endpoint of the engine's PUB socket (or the address to bind).
    pub endpoint: String,
    /// Bind the SUB socket (the engine connects) instead of connecting to the engine.
    pub bind: bool,
    /// Topic prefix to subscribe to.
    pub topic: String,
    /// The dp rank of batches that carry none.
    pub dp_rank: u32,
    /// The engine's replay (ROUTER) endpoint, if it has one.
    pub replay_endpoint: Option<String>,
}

/// What a batch's sequence number says about the batches before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqStep {
    /// The first batch seen.
    First,
    /// The batch right after the previous one.
    Next,
    /// `missing` batches were lost, starting at `from`.
    Gap {
        /// First missing sequence number.
        from: u64,
        /// Number of missing batches.
        missing: u64,
    },
    /// The sequence went backwards or repeated: the engine's publisher restarted.
    Reset,
}

/// Tracks one publisher's sequence numbers.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    last: Option<u64>,
}

impl SeqTracker {
    /// Records `seq` and says how it relates to the previous one.
    pub fn observe(&mut self, seq: u64) -> SeqStep {
        let step = match self.last {
            None => SeqStep::First,
            Some(last) if last.checked_add(1) == Some(seq) => SeqStep::Next,
            Some(last) if seq > last => SeqStep::Gap {
                from: last + 1,
                missing: seq - last - 1,
            },
            Some(_) => SeqStep::Reset,
        };
        self.last = Some(seq);
        step
    }
}

/// Decodes and converts one payload; malformed parts and skipped events are counted.
pub struct BatchProcessor {
    converter: Converter,
    default_rank: u32,
    metrics: BridgeMetrics,
}

impl BatchProcessor {
    /// A processor for batches of the publisher serving `default_rank`.
    pub fn new(converter: Converter, default_rank: u32, metrics: BridgeMetrics) -> Self {
        Self {
            converter,
            default_rank,
            metrics,
        }
    }

    /// The kvmesh events of one msgpack payload; `None` when it had none to publish.
    pub fn process(&self, payload: &[u8]) -> Option<RankEvents> {
        let batch = match wire::decode_batch(payload) {
            Ok(batch) => batch,
            Err(error) => {
                self.malformed(&error);
                return None;
            }
        };
        let mut events = Vec::with_capacity(batch.events.len());
        for event in batch.events {
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    self.malformed(&error);
                    continue;
                }
            };
            let conversion = self.converter.convert(&event);
            if let Some(skip) = conversion.skip {
                self.metrics
                    .skipped
                    .with_label_values(&[skip.label()])
                    .inc();
                tracing::debug!(reason = skip.label(), "engine event skipped");
            }
            self.metrics
                .dropped_blocks
                .inc_by(conversion.dropped_blocks);
            events.extend(conversion.event);
        }
        (!events.is_empty()).then(|| RankEvents {
            dp_rank: batch.dp_rank.unwrap_or(self.default_rank),
            events,
        })
    }

    fn malformed(&self, error: &WireError) {
        self.metrics
            .malformed
            .with_label_values(&[error.kind()])
            .inc();
        tracing::warn!(%error, "malformed engine kv event skipped");
    }
}

/// A SUB socket subscribed to the topic, bound or connecting (the connection completes in the
/// background: the engine may start later). Every TCP endpoint goes through a size-limiting
/// relay ([`crate::guard`]); `config`'s endpoints are rewritten to the relays' where the socket
/// connects.
pub async fn open_sub(config: &mut SourceConfig, guarding: &Guarding) -> anyhow::Result<SubSocket> {
    let mut options = SocketOptions::default();
    options.no_connect_timeout();
    let mut socket = SubSocket::with_options(options);
    socket.subscribe(&config.topic).await?;
    config
        .endpoint
        .parse::<zeromq::Endpoint>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.endpoint))?;
    if let Some(replay) = config.replay_endpoint.as_deref()
        && let Some(address) = guard::tcp_address(replay)
    {
        config.replay_endpoint = Some(guarding.relay_to(address).await?);
    }
    match (config.bind, guard::tcp_address(&config.endpoint)) {
        (true, Some(address)) => {
            let public = guarding.bind_address(address);
            let internal = socket
                .bind("tcp://127.0.0.1:0")
                .await
                .map_err(|e| anyhow::anyhow!("bind the relay's socket: {e}"))?;
            let bound = guarding
                .relay_from(&public, &internal.to_string())
                .await
                .map_err(|e| anyhow::anyhow!("bind {public}: {e}"))?;
            tracing::info!(address = %bound, dp_rank = config.dp_rank, "kv event socket bound");
        }
        (true, None) => {
            let bound = socket
                .bind(&config.endpoint)
                .await
                .map_err(|e| anyhow::anyhow!("bind {}: {e}", config.endpoint))?;
            tracing::info!(endpoint = %bound, dp_rank = config.dp_rank, "kv event socket bound");
        }
        (false, Some(address)) => config.endpoint = guarding.relay_to(address).await?,
        (false, None) => {}
    }
    Ok(socket)
}

/// Reads the engine's batches until `shutdown`, sending converted events to the publisher.
pub async fn run_source(
    config: SourceConfig,
    mut socket: SubSocket,
    processor: BatchProcessor,
    events_tx: mpsc::Sender<RankEvents>,
    shutdown: CancellationToken,
) {
    if !config.bind {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            connected = socket.connect(&config.endpoint) => match connected {
                Ok(()) => tracing::info!(endpoint = %config.endpoint, dp_rank = config.dp_rank, "kv event socket connected"),
                Err(error) => {
                    tracing::error!(%error, endpoint = %config.endpoint, "cannot connect to the engine");
                    return;
                }
            },
        }
    }
    let metrics = processor.metrics.clone();
    let mut seq = SeqTracker::default();
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return,
            message = socket.recv() => message,
        };
        let frames = match message {
            Ok(message) => message.into_vec(),
            Err(error) => {
                tracing::debug!(%error, "kv event socket receive failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        metrics.batches_received.inc();
        let frames = match wire::split_frames(frames) {
            Ok(frames) => frames,
            Err(error) => {
                processor.malformed(&error);
                continue;
            }
        };
        match seq.observe(frames.seq) {
            SeqStep::Next => {}
            SeqStep::First => {
                tracing::info!(
                    seq = frames.seq,
                    dp_rank = config.dp_rank,
                    "first engine kv batch"
                );
            }
            SeqStep::Reset => {
                metrics.zmq_seq_resets.inc();
                tracing::warn!(
                    seq = frames.seq,
                    dp_rank = config.dp_rank,
                    "engine kv sequence went backwards: the engine restarted, its cache is gone"
                );
                // Nothing the engine stored before survives its restart: without a clear the
                // index would keep promising those blocks.
                let cleared = RankEvents {
                    dp_rank: config.dp_rank,
                    events: vec![KvEvent {
                        event_id: 0,
                        tier: StorageTier::Device as i32,
                        kind: Some(kv_event::Kind::Cleared(KvCleared {})),
                    }],
                };
                let sent = tokio::select! {
                    _ = shutdown.cancelled() => false,
                    sent = events_tx.send(cleared) => sent.is_ok(),
                };
                if !sent {
                    return;
                }
            }
            SeqStep::Gap { from, missing } => {
                let recovered = match &config.replay_endpoint {
                    Some(endpoint) => replay(endpoint, from, frames.seq).await,
                    None => Vec::new(),
                };
                metrics.zmq_replayed_batches.inc_by(recovered.len() as u64);
                let lost = missing - recovered.len() as u64;
                if lost > 0 {
                    metrics.zmq_gaps.inc();
                    metrics.zmq_missed_batches.inc_by(lost);
                    tracing::warn!(
                        from,
                        missing = lost,
                        dp_rank = config.dp_rank,
                        "engine kv batches lost"
                    );
                }
                for payload in recovered {
                    if !forward(&processor, &payload, &events_tx, &shutdown).await {
                        return;
                    }
                }
            }
        }
        if !forward(&processor, &frames.payload, &events_tx, &shutdown).await {
            return;
        }
    }
}

/// Converts one batch and hands it to the publisher, waiting while its queue is full (the event
/// plane is down). Returns false at shutdown or when the publisher is gone (also only at
/// shutdown, when losing the tail is expected).
async fn forward(
    processor: &BatchProcessor,
    payload: &[u8],
    events_tx: &mpsc::Sender<RankEvents>,
    shutdown: &CancellationToken,
) -> bool {
    let Some(events) = processor.process(payload) else {
        return true;
    };
    tokio::select! {
        _ = shutdown.cancelled() => false,
        sent = events_tx.send(events) => sent.is_ok(),
    }
}

/// Asks the engine's replay socket for batches `from..until` and returns their payloads in
/// order. Returns what it got (possibly nothing) when the engine does not answer in time or its
/// buffer no longer holds them all; only a gap-free prefix is returned, so the order stays
/// exact.
pub async fn replay(endpoint: &str, from: u64, until: u64) -> Vec<Bytes> {
    match tokio::time::timeout(REPLAY_TIMEOUT, replay_inner(endpoint, from, until)).await {
        Ok(Ok(payloads)) => payloads,
        Ok(Err(error)) => {
            tracing::warn!(%error, %endpoint, "kv event replay failed");
            Vec::new()
        }
        Err(_) => {
            tracing::warn!(%endpoint, "kv event replay timed out");
            Vec::new()
        }
    }
}

async fn replay_inner(endpoint: &str, from: u64, until: u64) -> anyhow::Result<Vec<Bytes>> {
    let mut socket = DealerSocket::new();
    socket.connect(endpoint).await?;
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&from.to_be_bytes()));
    socket.send(request).await?;
    let mut payloads = Vec::new();
    let mut expected = from;
    loop {
        let mut frames = socket.recv().await?.into_vec();
        // Answers are ["", topic, seq, payload] (some engines omit the topic).
        if frames.first().is_some_and(|f| f.is_empty()) {
            frames.remove(0);
        }
        let (seq, payload) = match frames.as_slice() {
            [_, seq, payload] | [seq, payload] => (wire::parse_seq(seq)?, payload.clone()),
            other => anyhow::bail!("replay answer with {} frames", other.len()),
        };
        if seq == REPLAY_END || seq >= until {
            break;
        }
        if seq < expected {
            continue;
        }
        if seq > expected {
            break; // the engine's buffer no longer holds `expected`
        }
        payloads.push(payload);
        expected += 1;
        if expected == until {
            break;
        }
    }
    Ok(payloads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_steps() {
        let mut seq = SeqTracker::default();
        assert_eq!(seq.observe(5), SeqStep::First);
        assert_eq!(seq.observe(6), SeqStep::Next);
        assert_eq!(
            seq.observe(9),
            SeqStep::Gap {
                from: 7,
                missing: 2
            }
        );
        assert_eq!(seq.observe(3), SeqStep::Reset);
        assert_eq!(seq.observe(4), SeqStep::Next);
        assert_eq!(seq.observe(4), SeqStep::Reset);
    }

    fn payload(dp_rank: rmpv::Value) -> Vec<u8> {
        use rmpv::Value;
        let stored = Value::Array(vec![
            "BlockStored".into(),
            Value::Array(vec![1.into()]),
            Value::Nil,
            Value::Array((0..4).map(Value::from).collect()),
            4.into(),
        ]);
        let events = Value::Array(vec![stored, Value::Array(vec!["Unknown".into()])]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &Value::Array(vec![0.5.into(), events, dp_rank]))
            .unwrap();
        out
    }

    #[test]
    fn batch_rank_overrides_the_configured_rank() {
        let metrics = BridgeMetrics::new().unwrap();
        let processor = BatchProcessor::new(Converter::new(4), 2, metrics.clone());
        let with_rank = processor.process(&payload(5.into())).unwrap();
        assert_eq!((with_rank.dp_rank, with_rank.events.len()), (5, 1));
        let without = processor.process(&payload(rmpv::Value::Nil)).unwrap();
        assert_eq!(without.dp_rank, 2);
        assert_eq!(
            metrics.malformed.with_label_values(&["unknown_type"]).get(),
            2
        );
        assert!(processor.process(b"\x90").is_none());
        assert_eq!(metrics.malformed.with_label_values(&["payload"]).get(), 1);
    }
}
