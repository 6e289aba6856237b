use super::*;

#[test]
fn wildcards_follow_nats_rules() {
    assert!(subject_matches("a.*.c", "a.b.c"));
    assert!(!subject_matches("a.*.c", "a.b.c.d"));
    assert!(!subject_matches("a.*", "a"));
    assert!(subject_matches("a.>", "a.b"));
    assert!(subject_matches("a.>", "a.b.c"));
    assert!(!subject_matches("a.>", "a"));
    assert!(subject_matches(">", "a"));
    assert!(subject_matches("a.b", "a.b"));
    assert!(!subject_matches("a.b", "a.bc"));
    assert!(!subject_matches("a.b.c", "a.b"));
}

#[test]
fn overlap_and_validation() {
    assert!(patterns_overlap("a.>", "a.b.*"));
    assert!(patterns_overlap("a.*.c", "a.b.*"));
    assert!(!patterns_overlap("a.b", "a.c"));
    assert!(!patterns_overlap("a.b", "a.b.c"));
    assert!(validate_subject("a.b", false).is_ok());
    assert!(validate_subject("a.*.>", true).is_ok());
    for bad in ["", "a..b", "a.>.b", "a b", "a.*", "a.b>"] {
        assert!(validate_subject(bad, false).is_err(), "{bad}");
    }
    assert!(validate_subject("a.b*", true).is_err());
}

#[tokio::test]
async fn messages_older_than_max_age_are_skipped() {
    let plane = MemEventPlane::new();
    let config = StreamConfig {
        name: "AGED".into(),
        subjects: vec!["aged.>".into()],
        max_age: Duration::from_millis(200),
        duplicate_window: Duration::from_millis(100),
    };
    plane.ensure_stream(&config).await.unwrap();
    assert_eq!(
        plane
            .publish_durable("aged.x", "1", Bytes::new())
            .await
            .unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Past the window, the same id is stored again.
    assert_eq!(
        plane
            .publish_durable("aged.x", "1", Bytes::new())
            .await
            .unwrap(),
        2
    );
    let mut consumer = plane.consume("AGED", &[], 1).await.unwrap();
    let first = futures::StreamExt::next(&mut consumer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.sequence, 2, "aged-out sequence 1 is skipped");
}

#[tokio::test]
async fn only_ids_older_than_the_window_expire() {
    let plane = MemEventPlane::new();
    let config = StreamConfig {
        name: "DEDUP".into(),
        subjects: vec!["dedup.>".into()],
        max_age: Duration::ZERO,
        duplicate_window: Duration::from_millis(2000),
    };
    plane.ensure_stream(&config).await.unwrap();
    let publish = |id: &'static str| plane.publish_durable("dedup.x", id, Bytes::new());
    assert_eq!(publish("old").await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(publish("new").await.unwrap(), 2);
    assert_eq!(publish("old").await.unwrap(), 1, "inside the window");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // 2.4 s after "old", 1.2 s after "new" (0.8 s of slack): only "old" has left the window.
    assert_eq!(publish("old").await.unwrap(), 3);
    assert_eq!(publish("new").await.unwrap(), 2);
    assert_eq!(publish("old").await.unwrap(), 3);
}

#[tokio::test]
async fn a_stream_past_its_byte_or_id_bound_drops_its_oldest_first() {
    let one = stored_bytes("big.x", &Bytes::from(vec![0u8; 1000]));
    let plane = MemEventPlane::with_limits(StreamLimits {
        max_bytes: 10 * one,
        max_ids: 3,
    });
    let config = StreamConfig {
        name: "BIG".into(),
        subjects: vec!["big.>".into()],
        max_age: Duration::from_secs(3600),
        duplicate_window: Duration::from_secs(120),
    };
    plane.ensure_stream(&config).await.unwrap();
    for n in 1..=25u64 {
        let id = n.to_string();
        let payload = Bytes::from(vec![n as u8; 1000]);
        assert_eq!(
            plane.publish_durable("big.x", &id, payload).await.unwrap(),
            n
        );
    }
    // Ten messages fit: the first fifteen went, oldest first.
    assert_eq!(plane.first_sequence("BIG").await.unwrap(), 16);
    assert_eq!(plane.last_sequence("BIG").await.unwrap(), 25);
    let mut consumer = plane.consume("BIG", &[], 1).await.unwrap();
    let first = futures::StreamExt::next(&mut consumer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.sequence, first.payload[0]), (16, 16));
    // Three ids are remembered: a repeat of one of them is a duplicate, an older id is new.
    assert_eq!(
        plane
            .publish_durable("big.x", "25", Bytes::new())
            .await
            .unwrap(),
        25
    );
    assert_eq!(
        plane
            .publish_durable("big.x", "20", Bytes::new())
            .await
            .unwrap(),
        26
    );
}
