//! The one long-lived `RouteStream` a process keeps to each router replica: routes and reports
//! of every request share it, answers come back by request id, and a failed stream is reopened
//! by the next message after resending, by unary calls, what it may have lost.

use std::collections::VecDeque;
use std::time::Duration;

use futures::StreamExt as _;
use kvmesh_proto::v1 as pb;
use kvmesh_proto::v1::router_client::RouterClient;
use kvmesh_runtime::GrpcErrorCode as _;
use kvmesh_runtime::stream_client::{
    Answers, Incoming, StreamClient, StreamProtocol, StreamSettings,
};
use tokio_stream::wrappers::ReceiverStream;

use crate::wire;

/// A decision from a replica, or the status it failed with.
pub(super) type RouteAnswer = Result<pb::RouteResponse, tonic::Status>;

/// One long-lived `RouteStream` to a replica, shared by every request of this process: routes
/// are answered by request id (a queued one does not hold back the others), reports are sent
/// without an answer. A failed stream fails the routes in flight (the caller then tries another
/// replica) and is reopened by the next message.
#[derive(Clone)]
pub(super) struct RouteChannel {
    stream: StreamClient<RouteStreamProtocol>,
}

/// Limits of a route stream: a route may wait in the replica's queue as long as the request
/// does, so neither the calls in flight nor how long one waits is limited here.
const ROUTE_STREAM: StreamSettings = StreamSettings {
    name: "route stream",
    queue: 4096,
    max_in_flight: None,
    stalled_after: None,
};

impl RouteChannel {
    pub(super) fn spawn(client: RouterClient<tonic::transport::Channel>) -> Self {
        let protocol = RouteStreamProtocol {
            client,
            recent_ends: VecDeque::new(),
        };
        Self {
            stream: StreamClient::spawn(protocol, ROUTE_STREAM),
        }
    }

    pub(super) async fn route(&self, request: pb::RouteRequest) -> RouteAnswer {
        let mut abandon = AbandonOnDrop {
            stream: &self.stream,
            model: request.model.clone(),
            request_id: request.request_id.clone(),
            is_armed: true,
        };
        let message = pb::RouteStreamRequest {
            kind: Some(pb::route_stream_request::Kind::Route(request)),
        };
        let result = self.stream.call(message).await;
        abandon.is_armed = false;
        result
    }

    /// Sends a report over the stream when it is healthy; gives it back otherwise.
    pub(super) fn try_report(&self, report: pb::ReportRequest) -> Result<(), pb::ReportRequest> {
        if !self.stream.is_up() {
            return Err(report);
        }
        self.stream
            .try_cast(report_message(report))
            .map_err(|message| match message.kind {
                Some(pb::route_stream_request::Kind::Report(report)) => report,
                _ => pb::ReportRequest::default(),
            })
    }
}

fn report_message(report: pb::ReportRequest) -> pb::RouteStreamRequest {
    pb::RouteStreamRequest {
        kind: Some(pb::route_stream_request::Kind::Report(report)),
    }
}

/// Tells the replica that a caller stopped waiting for its decision (the client went away while
/// the request queued): the replica takes the request out of its queue, or frees it when the
/// decision was already made, instead of holding its load until expiry.
struct AbandonOnDrop<'a> {
    stream: &'a StreamClient<RouteStreamProtocol>,
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
        let _ = self.stream.try_cast(report_message(report));
    }
}

/// The `RouteStream` protocol: routes answered by request id, reports without an answer, and
/// after a failure the resend of what the replica may have lost.
struct RouteStreamProtocol {
    client: RouterClient<tonic::transport::Channel>,
    /// Terminal reports the current stream took, newest last, at most [`RECENT_ENDS`].
    recent_ends: VecDeque<pb::ReportRequest>,
}

impl StreamProtocol for RouteStreamProtocol {
    type Outgoing = pb::RouteStreamRequest;
    type Incoming = pb::RouteStreamResponse;
    type Answer = pb::RouteResponse;
    /// (request id, model); answers carry the request id, the model goes in a resend.
    type Key = RouteKey;

    async fn open(
        &mut self,
        outgoing: ReceiverStream<pb::RouteStreamRequest>,
    ) -> Result<Incoming<pb::RouteStreamResponse>, tonic::Status> {
        Ok(self
            .client
            .route_stream(outgoing)
            .await?
            .into_inner()
            .boxed())
    }

    fn key(&self, message: &pb::RouteStreamRequest) -> Option<RouteKey> {
        match &message.kind {
            Some(pb::route_stream_request::Kind::Route(route)) => Some(RouteKey {
                request_id: route.request_id.clone(),
                model: route.model.clone(),
            }),
            _ => None,
        }
    }

    fn answer(&self, answer: pb::RouteStreamResponse) -> (Answers<RouteKey>, RouteAnswer) {
        let result = match answer.result {
            Some(pb::route_stream_response::Result::Decision(decision)) => Ok(decision),
            Some(pb::route_stream_response::Result::Failure(failure)) => {
                Err(wire::failure_from_proto(failure))
            }
            None => Err(kvmesh_runtime::ErrorCode::Internal.to_status("empty route answer")),
        };
        let key = RouteKey {
            request_id: answer.request_id,
            model: String::new(),
        };
        (Answers::Key(key), result)
    }

    fn opened(&mut self) {
        self.recent_ends.clear();
    }

    fn sent(&mut self, message: &pb::RouteStreamRequest) {
        if let Some(pb::route_stream_request::Kind::Report(report)) = &message.kind
            && report.terminal != 0
        {
            if self.recent_ends.len() == RECENT_ENDS {
                self.recent_ends.pop_front();
            }
            self.recent_ends.push_back(report.clone());
        }
    }

    fn failed(&mut self, unanswered: Vec<RouteKey>) {
        resend_after_failure(&self.client, &mut self.recent_ends, unanswered);
    }
}

/// A route's request id (what its answer is matched by) and model (what a resend needs).
/// Equal and hashed by request id alone: request ids are never reused.
#[derive(Clone, Debug)]
struct RouteKey {
    request_id: String,
    model: String,
}

impl PartialEq for RouteKey {
    fn eq(&self, other: &Self) -> bool {
        self.request_id == other.request_id
    }
}

impl Eq for RouteKey {}

impl std::hash::Hash for RouteKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.request_id.hash(state);
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
    unanswered: Vec<RouteKey>,
) {
    let mut reports: Vec<pb::ReportRequest> = recent_ends.drain(..).collect();
    reports.extend(unanswered.into_iter().map(|key| pb::ReportRequest {
        model: key.model,
        request_id: key.request_id,
        terminal: pb::TerminalPath::Disconnected as i32,
        ..Default::default()
    }));
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
