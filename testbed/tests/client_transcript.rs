//! Keeps `docs/protocol.md` honest: the session transcript in the doc is generated from the real
//! wire types and codec here, its hex dumps are asserted byte for byte, its JSON renderings of
//! every frame must appear verbatim, and its error-code table must match `ErrorCode`.
//! On a mismatch the failure message prints the block the doc should contain.

use scheduler_core::codec::{APP_MAX_FRAME, encode_frame, from_payload};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, AcceptedState, Ack, Allocate, Allocated, AppRequest, AppResponse,
    ContainerAccepted, ContainerEvent, ContainerEventKind, ErrorCode, ErrorFrame, GrantedContainer,
    Hello, LaunchSpec, Release, StartContainer, Subscribe, Welcome,
};
use scheduler_core::token::{GuaranteedSigner, KeyRing, TokenBody, TokenKey};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, KillReason, NodeId, Resources};
use serde::Serialize;
use std::collections::BTreeMap;

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// One frame of the example session.
enum Frame {
    Request(AppRequest),
    Response(AppResponse),
}

impl Frame {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Frame::Request(r) => encode_frame(r, APP_MAX_FRAME).unwrap(),
            Frame::Response(r) => encode_frame(r, APP_MAX_FRAME).unwrap(),
        }
    }

    fn json(&self) -> String {
        fn pretty<T: Serialize>(t: &T) -> String {
            serde_json::to_string_pretty(t).unwrap()
        }
        match self {
            Frame::Request(r) => pretty(r),
            Frame::Response(r) => pretty(r),
        }
    }
}

const JOB_SUBMIT_MS: u64 = 1_763_800_000_000;
const CONTAINER: ContainerId = ContainerId(7);

fn token() -> scheduler_core::token::ContainerToken {
    // A GUARANTEED token: signed with the coordinator's Ed25519 key, as the guarantor does.
    GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(3, [0x42; 32])))
        .unwrap()
        .sign(TokenBody {
            container_id: CONTAINER,
            node_id: NodeId::from("worker-2"),
            app_id: AppId::from("demo"),
            resources: Resources::new(500, 256),
            container_type: ContainerType::Guaranteed,
            version: 0,
            job_id: JobId::from("job-42"),
            job_submit_time_ms: JOB_SUBMIT_MS,
            priority: 0,
            runtime_estimate_ms: Some(30_000),
            expires_at_ms: JOB_SUBMIT_MS + 600_000,
            key_id: 0,
            node_epoch: 5,
            booking: None,
            times_returned: 0,
        })
        .unwrap()
}

fn event(kind: ContainerEventKind, at_ms: u64) -> Frame {
    Frame::Response(AppResponse::Event(ContainerEvent {
        container_id: CONTAINER,
        node_id: NodeId::from("worker-2"),
        event: kind,
        at_ms,
    }))
}

/// The session of the doc's transcript, in order, with the step names used in the doc.
fn transcript() -> Vec<(&'static str, Frame)> {
    let t = JOB_SUBMIT_MS;
    let hello = |client: &str| {
        Frame::Request(AppRequest::Hello(Hello {
            protocol_version: APP_PROTOCOL_VERSION,
            app_id: "demo".into(),
            app_secret: "s3cret".into(),
            client_name: Some(client.into()),
        }))
    };
    let welcome = |node: &str| {
        Frame::Response(AppResponse::Welcome(Welcome {
            protocol_version: APP_PROTOCOL_VERSION,
            node_id: node.into(),
            max_frame_bytes: APP_MAX_FRAME as u64,
        }))
    };
    vec![
        ("1", hello("example/1.0")),
        ("2", welcome("worker-1")),
        (
            "3",
            Frame::Request(AppRequest::Allocate(Allocate {
                request_id: 1,
                resources: Resources::new(500, 256),
                count: 1,
                priority: 0,
                container_type: ContainerType::Guaranteed,
                locality: None,
                runtime_estimate_ms: Some(30_000),
                job_id: "job-42".into(),
                job_submit_time_ms: t,
                reservation_id: None,
                role: Default::default(),
                allow_shaping: false,
                job: None,
                replaces_shed: Vec::new(),
            })),
        ),
        (
            "4",
            Frame::Response(AppResponse::Allocated(Allocated {
                request_id: 1,
                containers: vec![GrantedContainer {
                    container_id: CONTAINER,
                    node_id: NodeId::from("worker-2"),
                    node_endpoint: "127.0.0.1:7502".into(),
                    container_type: ContainerType::Guaranteed,
                    resources: Resources::new(500, 256),
                    token: token(),
                }],
                remaining: 0,
                unplaced: 0,
                unplaced_reason: None,
            })),
        ),
        ("5", hello("example/1.0")),
        ("6", welcome("worker-2")),
        (
            "7",
            Frame::Request(AppRequest::Subscribe(Subscribe { request_id: 1 })),
        ),
        (
            "8",
            Frame::Response(AppResponse::Ack(Ack { request_id: 1 })),
        ),
        (
            "9",
            Frame::Request(AppRequest::StartContainer(StartContainer {
                request_id: 2,
                token: token(),
                launch: LaunchSpec {
                    command: "/usr/bin/sleep".into(),
                    args: vec!["600".into()],
                    env: BTreeMap::from([("TASK".to_string(), "7".to_string())]),
                    working_dir: Some("/tmp".into()),
                },
            })),
        ),
        (
            "10",
            Frame::Response(AppResponse::ContainerAccepted(ContainerAccepted {
                request_id: 2,
                container_id: CONTAINER,
                state: AcceptedState::Running,
            })),
        ),
        ("11", event(ContainerEventKind::Running, t + 1_204)),
        (
            "12",
            Frame::Request(AppRequest::Release(Release {
                request_id: 2,
                container_id: CONTAINER,
            })),
        ),
        (
            "13",
            Frame::Response(AppResponse::Ack(Ack { request_id: 2 })),
        ),
        (
            "14",
            event(
                ContainerEventKind::Killed {
                    reason: KillReason::Released,
                    message: "released by the application".into(),
                },
                t + 5_310,
            ),
        ),
        (
            "15",
            Frame::Request(AppRequest::StartContainer(StartContainer {
                request_id: 3,
                token: token(),
                launch: LaunchSpec {
                    command: "/usr/bin/sleep".into(),
                    args: vec!["600".into()],
                    ..Default::default()
                },
            })),
        ),
        (
            "16",
            Frame::Response(AppResponse::Error(ErrorFrame::new(
                Some(3),
                ErrorCode::InvalidToken,
                "start_container refused: container token for c0-7 version 0 was already used",
            ))),
        ),
    ]
}

/// `xxd`-style dump: offset, 16 bytes in two groups of 8, printable ASCII.
fn hexdump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (row, chunk) in bytes.chunks(16).enumerate() {
        let mut hex = String::new();
        for (i, b) in chunk.iter().enumerate() {
            if i == 8 {
                hex.push(' ');
            }
            hex.push_str(&format!("{b:02x} "));
        }
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if (0x20..0x7f).contains(&b) {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {hex:<49} |{ascii}|\n", row * 16));
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn step(n: &str) -> Frame {
    transcript()
        .into_iter()
        .find(|(s, _)| *s == n)
        .map(|(_, f)| f)
        .unwrap()
}

#[test]
fn hello_frame_bytes_are_exactly_these() {
    // 4-byte big-endian length 0x54 = 84, then a msgpack map of 5 entries (0x85), "type" first.
    assert_eq!(
        hex(&step("1").bytes()),
        "0000005485a474797065a568656c6c6fb070726f746f636f6c5f76657273696f6e01a66170705f6964a464656d6faa61\
         70705f736563726574a6733363726574ab636c69656e745f6e616d65ab6578616d706c652f312e30"
    );
}

#[test]
fn allocate_and_error_frame_bytes_are_exactly_these() {
    assert_eq!(
        hex(&step("3").bytes()),
        "000000b88aa474797065a8616c6c6f63617465aa726571756573745f696401a97265736f757263657382aa6370755f6d\
         696c6c6973cd01f4aa6d656d6f72795f6d6962cd0100a5636f756e7401a87072696f7269747900ae636f6e7461696e65\
         725f74797065aa47554152414e54454544a86c6f63616c697479c0b372756e74696d655f657374696d6174655f6d73cd\
         7530a66a6f625f6964a66a6f622d3432b26a6f625f7375626d69745f74696d655f6d73cf0000019aaaac2600"
    );
    assert_eq!(
        hex(&step("14").bytes()),
        "0000008185a474797065a56576656e74ac636f6e7461696e65725f696407a76e6f64655f6964a8776f726b65722d32a5\
         6576656e7483a46b696e64a66b696c6c6564a6726561736f6ea872656c6561736564a76d657373616765bb72656c6561\
         73656420627920746865206170706c69636174696f6ea561745f6d73cf0000019aaaac3abe"
    );
}

#[test]
fn the_doc_shows_the_real_hex_dumps() {
    let doc = doc();
    for n in ["1", "3", "14", "16"] {
        let dump = hexdump(&step(n).bytes());
        assert!(
            doc.contains(&dump),
            "docs/protocol.md must contain the hex dump of step {n}:\n{dump}"
        );
    }
}

#[test]
fn the_doc_shows_every_transcript_frame_as_it_is_encoded() {
    let doc = doc();
    for (n, frame) in transcript() {
        let json = frame.json();
        assert!(
            doc.contains(&json),
            "docs/protocol.md must contain step {n} rendered as:\n{json}"
        );
        // And every rendered frame decodes back from its wire bytes.
        let bytes = frame.bytes();
        let len = u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len() - 4);
        match frame {
            Frame::Request(r) => assert_eq!(from_payload::<AppRequest>(&bytes[4..]).unwrap(), r),
            Frame::Response(r) => assert_eq!(from_payload::<AppResponse>(&bytes[4..]).unwrap(), r),
        }
    }
}

#[test]
fn the_doc_error_table_matches_the_error_codes() {
    use ErrorCode::*;
    let doc = doc();
    let all = [
        VersionMismatch,
        BadCredentials,
        HelloRequired,
        MalformedFrame,
        FrameTooLarge,
        UnknownMessage,
        InvalidRequest,
        AskTooLarge,
        QuotaExceeded,
        InvalidToken,
        UnknownContainer,
        PromotionRefused,
        CoordinatorUnavailable,
        Internal,
        TooManyConnections,
    ];
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    for code in all {
        let name = serde_json::to_value(code).unwrap();
        let row = format!(
            "| `{}` | {} | {} |",
            name.as_str().unwrap(),
            yes_no(code.retryable()),
            yes_no(code.closes_connection())
        );
        assert!(
            doc.contains(&row),
            "docs/protocol.md's error table must start a row with: {row}"
        );
    }
}
