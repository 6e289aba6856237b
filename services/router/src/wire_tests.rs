use super::*;

#[test]
fn sync_events_round_trip() {
    let kinds = [
        SyncKind::Add {
            token_sequence_hashes: vec![1, 2, 3],
            track_prefill_tokens: false,
            expected_output_tokens: Some(7),
            initial_prefill_tokens: Some(40),
            expected_prefill_duration_ms: None,
            lora_name: Some("adapter".into()),
        },
        SyncKind::MarkPrefillCompleted,
        SyncKind::Free {
            path: TerminalPath::Completed,
        },
        SyncKind::Free {
            path: TerminalPath::Cancelled,
        },
        SyncKind::SessionBind {
            session_id: "s1".into(),
        },
    ];
    for (i, kind) in kinds.into_iter().enumerate() {
        let event = SyncEvent {
            router_id: "r1".into(),
            request_id: "q1".into(),
            worker: WorkerKey::new(9, 2),
            kind,
            forwarded_by: (i % 2 == 1).then(|| "r2".to_string()),
        };
        assert_eq!(sync_from_proto(sync_to_proto(&event)), Some(event));
    }
    assert_eq!(sync_from_proto(pb::RouterSyncEvent::default()), None);
}

#[test]
fn absent_track_prefill_means_true() {
    let event = pb::RouterSyncEvent {
        kind: Some(pb::router_sync_event::Kind::Add(
            pb::RouterSyncAdd::default(),
        )),
        ..Default::default()
    };
    let Some(SyncEvent {
        kind: SyncKind::Add {
            track_prefill_tokens,
            ..
        },
        ..
    }) = sync_from_proto(event)
    else {
        panic!("an add event");
    };
    assert!(track_prefill_tokens);
}

#[test]
fn hints_and_terminal_paths_round_trip() {
    let hints = RoutingHints {
        backend_instance_id: Some(5),
        dp_rank: Some(1),
        allowed_worker_ids: Some(vec![5, 6]),
        priority: -3,
        strict_priority: 2,
        expected_output_tokens: Some(100),
        session_id: Some("abc".into()),
        session_bind_ttl: Some(Duration::from_secs(30)),
        config_override: Some(RouterConfigOverride {
            overlap_score_credit: Some(0.5),
            ..Default::default()
        }),
        cache_salt: None,
        caller_instance_id: None,
    };
    let wire = hints_to_proto(&hints);
    let back = hints_from_proto(
        Some(&wire),
        &[5, 6],
        30,
        hints
            .config_override
            .as_ref()
            .map(override_to_proto)
            .as_ref(),
    );
    assert_eq!(back, hints);
    for path in [
        TerminalPath::Completed,
        TerminalPath::Error,
        TerminalPath::Cancelled,
        TerminalPath::Disconnected,
        TerminalPath::Migrated,
    ] {
        assert_eq!(
            terminal_from_proto(terminal_to_proto(path) as i32),
            Some(path)
        );
    }
    assert_eq!(terminal_from_proto(0), None);
    assert_eq!(terminal_from_proto(99), None);
}

#[test]
#[allow(
    clippy::disallowed_methods,
    reason = "statuses as other peers send them"
)]
fn route_errors_cross_grpc_whatever_their_message() {
    use kvmesh_runtime::ErrorCode;
    for error in [
        RouteError::NoEndpoint,
        RouteError::NotReady,
        RouteError::Overloaded,
        RouteError::BadRequest("bad".into()),
        RouteError::Cancelled,
        RouteError::UnknownModel("m".into()),
        RouteError::Worker {
            code: ErrorCode::InvalidArgument,
            message: "prompt too long".into(),
        },
    ] {
        let status = error.to_status();
        assert_eq!(RouteError::from_status(&status, "m"), Some(error.clone()));
        // The kind survives a message that says something else.
        let reworded = tonic::Status::with_metadata(
            status.code(),
            match &error {
                RouteError::BadRequest(message) => message.clone(),
                RouteError::Worker { message, .. } => message.clone(),
                _ => "reworded by a newer replica".to_string(),
            },
            status.metadata().clone(),
        );
        assert_eq!(RouteError::from_status(&reworded, "m"), Some(error.clone()));
        // And it survives the RouteStream's failure message.
        let streamed = failure_from_proto(failure_to_proto(&reworded));
        assert_eq!(RouteError::from_status(&streamed, "m"), Some(error));
    }
    // A replica's own failure carries no routing reason: try another replica.
    assert_eq!(
        RouteError::from_status(&tonic::Status::unavailable("connection refused"), "m"),
        None
    );
    assert_eq!(
        RouteError::from_status(&ErrorCode::Unavailable.to_status("stopping"), "m"),
        None
    );
}
