//! Decoding of the engine wire: the frames captured from a real vLLM 0.32 engine
//! (`data/vllm-0.32-kv-event-frames.json`, used as test vectors) and every variant
//! docs/kv-events.md ("Engine wire format") allows, plus malformed input.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] functions

use bytes::Bytes;
use kvmesh_kv::compute_block_hashes;
use kvmesh_kv_bridge::convert::Converter;
use kvmesh_kv_bridge::wire::{
    self, BlockRemoved, BlockStored, EngineBatch, EngineEvent, WireError, decode_batch,
    split_frames,
};
use kvmesh_proto::v1::kv_event;
use rmpv::Value;
use serde_json::Value as Json;

const VECTORS: &str = include_str!("data/vllm-0.32-kv-event-frames.json");

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

fn encode(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, value).unwrap();
    out
}

fn s(text: &str) -> Value {
    Value::from(text)
}

fn u(value: u64) -> Value {
    Value::from(value)
}

fn arr(items: Vec<Value>) -> Value {
    Value::Array(items)
}

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (s(k), v)).collect())
}

fn only_event(batch: &EngineBatch) -> &EngineEvent {
    assert_eq!(batch.events.len(), 1);
    batch.events[0].as_ref().unwrap()
}

fn json_u64s(value: &Json) -> Vec<u64> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// Checks one decoded event against the capture's decoding of it.
fn check_event(ours: &EngineEvent, expected: &Json) {
    match (expected["type"].as_str().unwrap(), ours) {
        ("AllBlocksCleared", EngineEvent::Cleared) => {}
        ("BlockRemoved", EngineEvent::Removed(removed)) => {
            assert_eq!(removed.block_hashes, json_u64s(&expected["block_hashes"]));
            assert_eq!(removed.medium.as_deref(), expected["medium"].as_str());
            assert_eq!(removed.group_idx, expected["group_idx"].as_u64().unwrap());
        }
        ("BlockStored", EngineEvent::Stored(stored)) => {
            assert_eq!(stored.block_hashes, json_u64s(&expected["block_hashes"]));
            assert_eq!(
                stored.parent_block_hash,
                expected["parent_block_hash"].as_u64()
            );
            let tokens: Vec<u32> = json_u64s(&expected["token_ids"])
                .into_iter()
                .map(|t| t as u32)
                .collect();
            assert_eq!(stored.token_ids, tokens);
            assert_eq!(stored.block_size, expected["block_size"].as_u64().unwrap());
            assert_eq!(stored.medium.as_deref(), expected["medium"].as_str());
            assert_eq!(stored.lora_name.as_deref(), expected["lora_name"].as_str());
            assert!(stored.mm_hashes.iter().all(Vec::is_empty));
            assert_eq!(
                stored.kv_cache_spec_kind.as_deref(),
                expected["kv_cache_spec_kind"].as_str()
            );
        }
        (tag, other) => panic!("expected {tag}, decoded {other:?}"),
    }
}

#[test]
fn every_captured_vllm_frame_decodes_as_captured() {
    let vectors: Json = serde_json::from_str(VECTORS).unwrap();
    let vectors = vectors.as_array().unwrap();
    assert_eq!(vectors.len(), 6);
    for vector in vectors {
        let what = vector["what"].as_str().unwrap();
        let frames: Vec<Bytes> = vector["frames_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| Bytes::from(unhex(f.as_str().unwrap())))
            .collect();
        let frames = split_frames(frames).unwrap();
        assert_eq!(frames.seq, vector["seq"].as_u64().unwrap(), "{what}");
        assert_eq!(
            frames.topic.as_ref(),
            vector["topic"].as_str().unwrap().as_bytes()
        );
        let batch = decode_batch(&frames.payload).unwrap();
        let expected = &vector["decoded"];
        // serde_json's float parsing may be off by an ulp; the wire value is exact.
        let ts_error = (batch.ts.unwrap() - expected[0].as_f64().unwrap()).abs();
        assert!(ts_error < 1e-6, "{what}");
        assert_eq!(
            batch.dp_rank,
            expected[2].as_u64().map(|r| r as u32),
            "{what}"
        );
        let expected_events = expected[1].as_array().unwrap();
        assert_eq!(batch.events.len(), expected_events.len(), "{what}");
        let converter = Converter::new(32);
        for (ours, theirs) in batch.events.iter().zip(expected_events) {
            let ours = ours.as_ref().unwrap();
            check_event(ours, theirs);
            let conversion = converter.convert(ours);
            assert_eq!(conversion.skip, None, "{what}");
            let event = conversion.event.unwrap();
            if let (EngineEvent::Stored(stored), Some(kv_event::Kind::Stored(out))) =
                (ours, event.kind)
            {
                // kvmesh hashes the tokens itself; the engine's hashes only name the blocks.
                let expected_hashes = compute_block_hashes(&stored.token_ids, 32, 1337);
                let ours: Vec<u64> = out.blocks.iter().map(|b| b.tokens_hash).collect();
                assert_eq!(ours, expected_hashes, "{what}");
                let names: Vec<u64> = out.blocks.iter().map(|b| b.block_hash).collect();
                assert_eq!(names, stored.block_hashes);
                assert_eq!(out.parent_hash, stored.parent_block_hash);
            }
        }
    }
}

#[test]
fn array_form_events_and_map_form_batch() {
    let stored = arr(vec![
        s("BlockStored"),
        arr(vec![u(1), u(2)]),
        Value::Nil,
        arr((1..=8).map(u).collect()),
        u(4),
    ]);
    let removed = arr(vec![s("BlockRemoved"), arr(vec![u(2)]), s("CPU")]);
    let cleared = arr(vec![s("AllBlocksCleared"), u(99)]);
    let batch = map(vec![
        ("ts", Value::F64(1.5)),
        ("events", arr(vec![stored, removed, cleared])),
        ("dp_rank", u(3)),
        ("unknown_key", s("ignored")),
    ]);
    let batch = decode_batch(&encode(&batch)).unwrap();
    assert_eq!(batch.dp_rank, Some(3));
    assert_eq!(batch.ts, Some(1.5));
    let events: Vec<EngineEvent> = batch.events.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        events,
        [
            EngineEvent::Stored(BlockStored {
                block_hashes: vec![1, 2],
                token_ids: (1..=8).collect(),
                block_size: 4,
                ..Default::default()
            }),
            EngineEvent::Removed(BlockRemoved {
                block_hashes: vec![2],
                medium: Some("CPU".into()),
                group_idx: 0,
            }),
            EngineEvent::Cleared,
        ]
    );
}

#[test]
fn array_batch_without_dp_rank_and_full_trailing_fields() {
    let stored = arr(vec![
        s("BlockStored"),
        arr(vec![u(1)]),
        u(7),
        arr((1..=4).map(u).collect()),
        u(4),
        u(12),
        s("GPU"),
        s("my-lora"),
        arr(vec![Value::Nil]),
        u(0),
        s("full_attention"),
        Value::Nil,
        s("extra trailing element"),
    ]);
    let batch = decode_batch(&encode(&arr(vec![Value::F64(2.0), arr(vec![stored])]))).unwrap();
    assert_eq!(batch.dp_rank, None);
    let EngineEvent::Stored(event) = only_event(&batch) else {
        panic!("not stored")
    };
    assert_eq!(event.parent_block_hash, Some(7));
    assert_eq!(event.lora_name.as_deref(), Some("my-lora"));
    let conversion = Converter::new(4).convert(only_event(&batch));
    let Some(kv_event::Kind::Stored(out)) = conversion.event.and_then(|e| e.kind) else {
        panic!("not converted")
    };
    assert_eq!(out.blocks[0].tokens_hash, 15671544057904749233);
}

#[test]
fn hash_values_as_u64_i64_and_bytes() {
    assert_eq!(wire::hash_value(&u(u64::MAX), "h"), Ok(u64::MAX));
    assert_eq!(wire::hash_value(&Value::from(-1i64), "h"), Ok(u64::MAX));
    assert_eq!(
        wire::hash_value(&Value::from(-2i64), "h"),
        Ok(0xffff_ffff_ffff_fffe)
    );
    let digest: Vec<u8> = (0u8..32).collect();
    assert_eq!(
        wire::hash_value(&Value::Binary(digest), "h"),
        Ok(u64::from_be_bytes([24, 25, 26, 27, 28, 29, 30, 31]))
    );
    assert_eq!(
        wire::hash_value(&Value::Binary(vec![1, 2]), "h"),
        Ok(0x0102)
    );
    assert!(wire::hash_value(&Value::Binary(Vec::new()), "h").is_err());
    assert!(wire::hash_value(&s("12"), "h").is_err());
    assert!(wire::hash_value(&Value::F64(1.0), "h").is_err());

    let event = map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            arr(vec![Value::from(-5i64), Value::Binary(vec![0xff; 8])]),
        ),
    ]);
    let batch = decode_batch(&encode(&arr(vec![Value::F64(0.0), arr(vec![event])]))).unwrap();
    assert_eq!(
        only_event(&batch),
        &EngineEvent::Removed(BlockRemoved {
            block_hashes: vec![(-5i64) as u64, u64::MAX],
            medium: None,
            group_idx: 0,
        })
    );
}

#[test]
fn bigram_token_ids_flatten() {
    let pairs = arr(vec![
        arr(vec![u(1), u(2)]),
        arr(vec![u(2), u(3)]),
        arr(vec![u(3), u(4)]),
    ]);
    let event = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(vec![u(9)])),
        ("parent_block_hash", Value::Nil),
        ("token_ids", pairs),
        ("block_size", u(4)),
    ]);
    let batch = decode_batch(&encode(&arr(vec![Value::F64(0.0), arr(vec![event])]))).unwrap();
    let EngineEvent::Stored(stored) = only_event(&batch) else {
        panic!("not stored")
    };
    assert_eq!(stored.token_ids, [1, 2, 3, 4]);
}

#[test]
fn non_main_groups_are_skipped() {
    let stored = |extra: Vec<(&str, Value)>| {
        let mut fields = vec![
            ("type", s("BlockStored")),
            ("block_hashes", arr(vec![u(9)])),
            ("token_ids", arr((0..4).map(u).collect())),
            ("block_size", u(4)),
        ];
        fields.extend(extra);
        map(fields)
    };
    let converter = Converter::new(4);
    for (extra, is_main) in [
        (vec![], true),
        (vec![("group_idx", u(1))], false),
        (vec![("kv_cache_spec_kind", s("sliding_window"))], false),
        (vec![("kv_cache_spec_kind", s("sink_full_attention"))], true),
    ] {
        let event = wire::decode_event(&stored(extra)).unwrap();
        assert_eq!(event.is_main_group(), is_main);
        assert_eq!(converter.convert(&event).event.is_some(), is_main);
    }
    let removed = arr(vec![s("BlockRemoved"), arr(vec![u(1)]), s("GPU"), u(2)]);
    assert!(!wire::decode_event(&removed).unwrap().is_main_group());
}

#[test]
fn multimodal_from_extra_keys_and_block_mm_infos() {
    let digest = |prefix: &str| format!("{prefix:0<16}{}", "ab".repeat(24));
    let extra_keys = arr(vec![
        arr(vec![
            s(&digest("0000000000000009")),
            s("my-lora"),
            s(&digest("0000000000000005")),
        ]),
        Value::Nil,
    ]);
    let base = |mm_key: &str, mm: Value| {
        map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", arr(vec![u(1), u(2)])),
            ("token_ids", arr((1..=8).map(u).collect())),
            ("block_size", u(4)),
            (mm_key, mm),
        ])
    };
    let converter = Converter::new(4);
    let tokens_hashes = |event: &Value| {
        let event = wire::decode_event(event).unwrap();
        match converter.convert(&event).event.and_then(|e| e.kind) {
            Some(kv_event::Kind::Stored(out)) => {
                out.blocks.iter().map(|b| b.tokens_hash).collect::<Vec<_>>()
            }
            other => panic!("not stored: {other:?}"),
        }
    };
    let plain = compute_block_hashes(&[5, 6, 7, 8], 4, 1337)[0];
    assert_eq!(
        tokens_hashes(&base("extra_keys", extra_keys)),
        [235436700144873471, plain]
    );
    let infos = arr(vec![
        map(vec![(
            "mm_objects",
            arr(vec![
                map(vec![("mm_hash", u(9)), ("offsets", arr(vec![]))]),
                map(vec![("mm_hash", u(5))]),
            ]),
        )]),
        Value::Nil,
    ]);
    assert_eq!(
        tokens_hashes(&base("block_mm_infos", infos)),
        [235436700144873471, plain]
    );
}

#[test]
fn malformed_input_is_an_error_not_a_panic() {
    assert_eq!(
        split_frames(vec![Bytes::from_static(b"t"), Bytes::new()]),
        Err(WireError::FrameCount(2))
    );
    assert_eq!(
        split_frames(vec![
            Bytes::new(),
            Bytes::from_static(b"\0\0\0\x01"),
            Bytes::new()
        ]),
        Err(WireError::SeqFrame(4))
    );
    for payload in [
        &b""[..],
        b"\xc1",                         // never-used msgpack marker
        b"\x93\xcb\x41",                 // truncated
        b"\x91\x90\x00",                 // trailing bytes
        b"\xa3abc",                      // a string, not a batch
        b"\x92\xcb\0\0\0\0\0\0\0\0\x05", // events is not an array
    ] {
        assert!(decode_batch(payload).is_err(), "{payload:?}");
    }
    let deep: Vec<u8> = std::iter::repeat_n(0x91u8, 100_000).collect();
    assert!(decode_batch(&deep).is_err());
    let negative_rank = arr(vec![Value::F64(0.0), arr(vec![]), Value::from(-1i64)]);
    assert!(matches!(
        decode_batch(&encode(&negative_rank)),
        Err(WireError::Batch(_))
    ));

    // Bad events fail one by one; their neighbours still decode.
    let bad_events = vec![
        arr(vec![]),
        arr(vec![u(5)]),
        map(vec![("no_type", u(1))]),
        arr(vec![s("Mystery")]),
        arr(vec![s("BlockStored"), arr(vec![u(1)])]),
        arr(vec![
            s("BlockStored"),
            arr(vec![u(1)]),
            Value::Nil,
            arr(vec![Value::from(-3i64)]),
            u(4),
        ]),
        arr(vec![
            s("BlockStored"),
            arr(vec![u(1)]),
            Value::Nil,
            arr(vec![u(1)]),
            s("32"),
        ]),
        arr(vec![s("BlockRemoved"), s("not a list")]),
        arr(vec![s("BlockRemoved"), arr(vec![Value::Boolean(true)])]),
        s("not an event"),
        arr(vec![s("AllBlocksCleared")]),
    ];
    let batch = decode_batch(&encode(&arr(vec![Value::F64(0.0), arr(bad_events)]))).unwrap();
    let kinds: Vec<&str> = batch
        .events
        .iter()
        .map(|e| e.as_ref().map_or_else(WireError::kind, |_| "ok"))
        .collect();
    assert_eq!(
        kinds,
        [
            "event",
            "event",
            "event",
            "unknown_type",
            "event",
            "event",
            "event",
            "event",
            "event",
            "event",
            "ok"
        ]
    );
}
