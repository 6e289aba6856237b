//! A size limit on every ZMTP frame and message the engine sends, enforced before the socket
//! library sees the bytes.
//!
//! The `zeromq` crate's decoder reserves a read buffer from a frame's 64-bit length field and
//! keeps the frames of a multipart message until its last one, with no limit on either. So every
//! TCP connection between the bridge and an engine goes through a relay in this process that
//! reads the engine's byte stream with [`FrameGuard`] — counting lengths, storing nothing — and
//! cuts the connection as soon as a frame header announces more than the limit. The socket
//! library reconnects as it does after any dropped connection; the batches lost meanwhile are
//! replayed or counted as a gap. `ipc://` endpoints are local files and are not relayed.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::metrics::BridgeMetrics;

/// Length of the ZMTP 3 greeting, which precedes the frames.
const GREETING_LEN: u64 = 64;

/// Bytes read from the engine at a time.
const READ_CHUNK: usize = 64 * 1024;

/// A frame or message announced larger than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("zmq message of {announced} bytes exceeds the limit of {limit} bytes")]
pub struct Oversized {
    /// Bytes the message would have with the frame just announced.
    pub announced: u64,
    /// The limit.
    pub limit: u64,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Greeting {
        left: u64,
    },
    Flags,
    Len {
        is_long: bool,
        has_more: bool,
        is_command: bool,
        read: u8,
        value: u64,
    },
    Body {
        left: u64,
    },
}

/// Follows the framing of one direction of a ZMTP 3 connection and refuses a frame whose
/// announced length would take its message (or command) past `limit` bytes, before any of its
/// body is read.
#[derive(Debug, Clone)]
pub struct FrameGuard {
    limit: u64,
    state: State,
    /// Bytes of the data frames of the message in progress.
    message_len: u64,
}

impl FrameGuard {
    /// A guard at the start of a connection (the greeting comes first).
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            state: State::Greeting { left: GREETING_LEN },
            message_len: 0,
        }
    }

    /// Reads the next bytes of the stream; an error means the connection must be dropped.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), Oversized> {
        while let Some((&byte, rest)) = bytes.split_first() {
            match &mut self.state {
                State::Greeting { left } | State::Body { left } if *left > 0 => {
                    let take = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    *left -= take as u64;
                    bytes = &bytes[take..];
                    self.end_of_body();
                    continue;
                }
                State::Greeting { .. } | State::Body { .. } => {
                    self.end_of_body();
                    continue;
                }
                State::Flags => {
                    self.state = State::Len {
                        is_long: byte & 0b010 != 0,
                        has_more: byte & 0b001 != 0,
                        is_command: byte & 0b100 != 0,
                        read: 0,
                        value: 0,
                    };
                }
                State::Len {
                    is_long,
                    has_more,
                    is_command,
                    read,
                    value,
                } => {
                    *value = (*value << 8) | u64::from(byte);
                    *read += 1;
                    if *read == if *is_long { 8 } else { 1 } {
                        let (len, has_more, is_command) = (*value, *has_more, *is_command);
                        let announced = if is_command {
                            len
                        } else {
                            self.message_len.saturating_add(len)
                        };
                        if announced > self.limit {
                            return Err(Oversized {
                                announced,
                                limit: self.limit,
                            });
                        }
                        if !is_command {
                            self.message_len = announced;
                        }
                        self.state = State::Body { left: len };
                        // A message ends with its first frame without MORE.
                        if !has_more && !is_command {
                            self.message_len = 0;
                        }
                        self.end_of_body();
                    }
                }
            }
            bytes = rest;
        }
        Ok(())
    }

    /// After the greeting or a frame body is complete, the next byte is a frame's flags.
    fn end_of_body(&mut self) {
        if let State::Greeting { left: 0 } | State::Body { left: 0 } = self.state {
            self.state = State::Flags;
        }
    }
}

/// What every relay of a bridge shares: the size limit, the address a wildcard bind endpoint
/// listens on, the counter of dropped connections, and when to stop.
#[derive(Clone)]
pub struct Guarding {
    /// `--zmq-max-message-bytes`.
    pub limit: u64,
    /// `--zmq-bind-host`.
    pub bind_host: String,
    /// Where dropped connections are counted.
    pub metrics: BridgeMetrics,
    /// Stops accepting and relaying.
    pub stop: CancellationToken,
}

impl Guarding {
    /// A relay to the engine at `address` (`host:port`); its endpoint for the socket library.
    pub async fn relay_to(&self, address: &str) -> std::io::Result<String> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let local = listener.local_addr()?;
        tokio::spawn(accept_loop(
            listener,
            Target::Engine(address.to_string()),
            self.clone(),
        ));
        Ok(format!("tcp://{local}"))
    }

    /// Listens on `public` (`host:port`) for engines, relaying each to the socket bound at
    /// `bridge` (`tcp://127.0.0.1:port`); the address it listens on.
    pub async fn relay_from(&self, public: &str, bridge: &str) -> std::io::Result<SocketAddr> {
        let bridge = tcp_address(bridge).unwrap_or(bridge).to_string();
        let listener = TcpListener::bind(public).await?;
        let local = listener.local_addr()?;
        tokio::spawn(accept_loop(listener, Target::Bridge(bridge), self.clone()));
        Ok(local)
    }

    /// The `host:port` a bind endpoint's `address` listens on: a wildcard host (`*`, `0.0.0.0`,
    /// `::`) means `--zmq-bind-host`, loopback unless told otherwise.
    pub fn bind_address(&self, address: &str) -> String {
        let (host, port) = address.rsplit_once(':').unwrap_or((address, ""));
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if !matches!(bare, "*" | "0.0.0.0" | "::") {
            return address.to_string();
        }
        if self.bind_host.contains(':') {
            format!("[{}]:{port}", self.bind_host)
        } else {
            format!("{}:{port}", self.bind_host)
        }
    }
}

/// The `host:port` of a `tcp://` endpoint; `None` for other transports.
pub fn tcp_address(endpoint: &str) -> Option<&str> {
    endpoint.strip_prefix("tcp://")
}

/// Which side an accepted connection comes from, and where its peer is.
#[derive(Debug, Clone)]
enum Target {
    /// Accepted from the bridge's socket; the engine is at this `host:port`.
    Engine(String),
    /// Accepted from an engine; the bridge's socket is at this `host:port`.
    Bridge(String),
}

async fn accept_loop(listener: TcpListener, target: Target, guarding: Guarding) {
    let Guarding {
        limit,
        metrics,
        stop,
        ..
    } = guarding;
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "zmq relay accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let (metrics, stop, target) = (metrics.clone(), stop.clone(), target.clone());
        tokio::spawn(async move {
            let peer = match &target {
                Target::Engine(address) | Target::Bridge(address) => address.as_str(),
            };
            let other = match TcpStream::connect(peer).await {
                Ok(other) => other,
                Err(error) => {
                    tracing::debug!(%error, %peer, "zmq relay cannot connect");
                    return;
                }
            };
            let (engine, bridge) = match target {
                Target::Engine(_) => (other, stream),
                Target::Bridge(_) => (stream, other),
            };
            tokio::select! {
                () = stop.cancelled() => {}
                result = relay(engine, bridge, limit) => {
                    if let Err(error) = result {
                        metrics.zmq_oversized.inc();
                        tracing::warn!(%error, "dropping the engine connection");
                    }
                }
            }
        });
    }
}

/// Copies both directions until either side closes; the engine's bytes pass through the guard.
async fn relay(engine: TcpStream, bridge: TcpStream, limit: u64) -> Result<(), Oversized> {
    let _ = (engine.set_nodelay(true), bridge.set_nodelay(true));
    let (mut engine_rx, mut engine_tx) = engine.into_split();
    let (mut bridge_rx, mut bridge_tx) = bridge.into_split();
    let upstream = async {
        let _ = tokio::io::copy(&mut bridge_rx, &mut engine_tx).await;
        Ok(())
    };
    let downstream = async {
        let mut guard = FrameGuard::new(limit);
        let mut buffer = vec![0u8; READ_CHUNK];
        loop {
            let read = match engine_rx.read(&mut buffer).await {
                Ok(0) | Err(_) => return Ok(()),
                Ok(read) => read,
            };
            guard.feed(&buffer[..read])?;
            if bridge_tx.write_all(&buffer[..read]).await.is_err() {
                return Ok(());
            }
        }
    };
    tokio::select! {
        result = upstream => result,
        result = downstream => result,
    }
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
