//! The one long-lived `RouteStream` a process keeps to each router replica: routes and reports
//! of every request share it, answers come back by request id, and a failed stream is reopened
//! by the next message after resending, by unary calls, what it may have lost.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kvmesh_proto::v1 as pb;
use kvmesh_proto::v1::router_client::RouterClient;
use kvmesh_runtime::GrpcErrorCode as _;
use tokio::sync::{mpsc, oneshot};

use crate::wire;

/// A decision from a replica, or the status it failed with.
pub(super) type RouteAnswer = Result<pb::RouteResponse, tonic::Status>;

/// What goes to a replica over its `RouteStream`.
enum Outgoing {
    Route(Box<pb::RouteRequest>, oneshot::Sender<RouteAnswer>),
    Report(pb::ReportRequest),
}

/// One long-lived `RouteStream` to a replica, shared by every request of this process: routes
/// are answered by request id (a queued one does not hold back the others), reports are sent
/// without an answer. A failed stream fails the routes in flight (the caller then tries another
/// replica) and is reopened by the next message.
#[derive(Clone)]
pub(super) struct RouteChannel {
    tx: mpsc::Sender<Outgoing>,
    /// Set while a stream is open and has not failed: reports take the stream only then, and
    /// fall back to unary calls with failover otherwise.
    is_up: Arc<AtomicBool>,
}

/// Messages that may wait for the stream task before senders block.
const ROUTE_STREAM_QUEUE: usize = 4096;

impl RouteChannel {
    pub(super) fn spawn(client: RouterClient<tonic::transport::Channel>) -> Self {
        let (tx, rx) = mpsc::channel(ROUTE_STREAM_QUEUE);
        let is_up = Arc::new(AtomicBool::new(false));
        tokio::spawn(run_route_stream(client, rx, is_up.clone()));
        Self { tx, is_up }
    }

    pub(super) async fn route(&self, request: pb::RouteRequest) -> RouteAnswer {
        let (reply, answer) = oneshot::channel();
        let mut abandon = AbandonOnDrop {
            tx: &self.tx,
            model: request.model.clone(),
            request_id: request.request_id.clone(),
            is_armed: false,
        };
        self.tx
            .send(Outgoing::Route(Box::new(request), reply))
            .await
            .map_err(|_| kvmesh_runtime::ErrorCode::Unavailable.to_status("route stream closed"))?;
        abandon.is_armed = true;
        let result = answer.await.unwrap_or_else(|_| {
            Err(kvmesh_runtime::ErrorCode::Unavailable.to_status("route stream closed"))
        });
        abandon.is_armed = false;
        result
    }

    /// Sends a report over the stream when it is healthy; gives it back otherwise.
    pub(super) fn try_report(&self, report: pb::ReportRequest) -> Result<(), pb::ReportRequest> {
        if !self.is_up.load(Ordering::Acquire) {
            return Err(report);
        }
        match self.tx.try_send(Outgoing::Report(report)) {
            Ok(()) => Ok(()),
            Err(error) => match error.into_inner() {
                Outgoing::Report(report) => Err(report),
                // Only a report was sent; nothing else can come back.
                Outgoing::Route(..) => Ok(()),
            },
        }
    }
}

/// Tells the replica that a caller stopped waiting for its decision (the client went away while
/// the request queued): the replica takes the request out of its queue, or frees it when the
/// decision was already made, instead of holding its load until expiry.
struct AbandonOnDrop<'a> {
    tx: &'a mpsc::Sender<Outgoing>,
    model: String,
    request_id: String,
    is_armed: bool,
}

impl Drop for AbandonOnDrop<'_> {
    fn drop(&mut self) {
        if !self.is_armed {
            return;
        }
        let report = pb::ReportRequest {
            model: std::mem::take(&mut self.model),
            request_id: std::mem::take(&mut self.request_id),
            terminal: pb::TerminalPath::Disconnected as i32,
            ..Default::default()
        };
        // Best effort: a full or closed stream leaves the request to expiry.
        let _ = self.tx.try_send(Outgoing::Report(report));
    }
}

/// Terminal reports remembered per stream, to send again if the stream fails after taking them.
const RECENT_ENDS: usize = 1024;

/// After a stream failed: what it may have lost goes again as unary calls, best effort. Each is
/// harmless when the replica already had it (freeing is idempotent and route ids are never
/// reused): the ends of the last [`RECENT_ENDS`] requests, and a disconnect for every route
/// that was waiting for its answer (the replica may have decided it, and the caller is routing
/// it elsewhere). Stops at the first call that cannot reach the replica.
fn resend_after_failure(
    client: &RouterClient<tonic::transport::Channel>,
    recent_ends: &mut VecDeque<pb::ReportRequest>,
    unanswered: Vec<(String, String)>,
) {
    let mut reports: Vec<pb::ReportRequest> = recent_ends.drain(..).collect();
    reports.extend(
        unanswered
            .into_iter()
            .map(|(model, request_id)| pb::ReportRequest {
                model,
                request_id,
                terminal: pb::TerminalPath::Disconnected as i32,
                ..Default::default()
            }),
    );
    if reports.is_empty() {
        return;
    }
    let mut client = client.clone();
    tokio::spawn(async move {
        for report in reports {
            let call = tokio::time::timeout(Duration::from_secs(2), client.report(report)).await;
            if !matches!(call, Ok(Ok(_))) {
                return;
            }
        }
    });
}

async fn run_route_stream(
    mut client: RouterClient<tonic::transport::Channel>,
    mut rx: mpsc::Receiver<Outgoing>,
    is_up: Arc<AtomicBool>,
) {
    let mut recent_ends: VecDeque<pb::ReportRequest> = VecDeque::new();
    let mut waiting: HashMap<String, (String, oneshot::Sender<RouteAnswer>)> = HashMap::new();
    // Fails every waiting route; returns their (model, request id).
    let fail_all = |waiting: &mut HashMap<String, (String, oneshot::Sender<RouteAnswer>)>,
                    status: &tonic::Status| {
        waiting
            .drain()
            .map(|(request_id, (model, reply))| {
                let _ = reply.send(Err(status.clone()));
                (model, request_id)
            })
            .collect::<Vec<_>>()
    };
    let to_message = |outgoing: Outgoing,
                      waiting: &mut HashMap<String, (String, oneshot::Sender<RouteAnswer>)>,
                      recent_ends: &mut VecDeque<pb::ReportRequest>| {
        let kind = match outgoing {
            Outgoing::Route(request, reply) => {
                waiting.insert(request.request_id.clone(), (request.model.clone(), reply));
                pb::route_stream_request::Kind::Route(*request)
            }
            Outgoing::Report(report) => {
                if report.terminal != 0 {
                    if recent_ends.len() == RECENT_ENDS {
                        recent_ends.pop_front();
                    }
                    recent_ends.push_back(report.clone());
                }
                pb::route_stream_request::Kind::Report(report)
            }
        };
        pb::RouteStreamRequest { kind: Some(kind) }
    };
    loop {
        let Some(first) = rx.recv().await else {
            return;
        };
        recent_ends.clear();
        let (out_tx, out_rx) = mpsc::channel(ROUTE_STREAM_QUEUE);
        if out_tx
            .try_send(to_message(first, &mut waiting, &mut recent_ends))
            .is_err()
        {
            fail_all(
                &mut waiting,
                &kvmesh_runtime::ErrorCode::Unavailable.to_status("route stream closed"),
            );
            continue;
        }
        let mut answers = match client
            .route_stream(tokio_stream::wrappers::ReceiverStream::new(out_rx))
            .await
        {
            Ok(response) => response.into_inner(),
            Err(status) => {
                // Nothing reached the replica: no stream was opened.
                fail_all(&mut waiting, &status);
                continue;
            }
        };
        is_up.store(true, Ordering::Release);
        let failure = loop {
            tokio::select! {
                outgoing = rx.recv() => {
                    let Some(outgoing) = outgoing else { return };
                    if out_tx.send(to_message(outgoing, &mut waiting, &mut recent_ends)).await.is_err() {
                        break kvmesh_runtime::ErrorCode::Unavailable.to_status("route stream closed");
                    }
                }
                answer = answers.next() => match answer {
                    Some(Ok(answer)) => {
                        let Some((_, reply)) = waiting.remove(&answer.request_id) else { continue };
                        let result = match answer.result {
                            Some(pb::route_stream_response::Result::Decision(decision)) => Ok(decision),
                            Some(pb::route_stream_response::Result::Failure(failure)) => {
                                Err(wire::failure_from_proto(failure))
                            }
                            None => Err(kvmesh_runtime::ErrorCode::Internal.to_status("empty route answer")),
                        };
                        let _ = reply.send(result);
                    }
                    Some(Err(status)) => break status,
                    None => break kvmesh_runtime::ErrorCode::Unavailable.to_status("route stream ended"),
                },
            }
        };
        is_up.store(false, Ordering::Release);
        let unanswered = fail_all(&mut waiting, &failure);
        resend_after_failure(&client, &mut recent_ends, unanswered);
    }
}
