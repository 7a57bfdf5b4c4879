//! Keeps `docs/protocol.md` true to the code: the hex dumps in it must be exactly the frames the
//! Rust codec produces for the messages described next to them, and its error-code table must
//! list every `ErrorCode` with the `retryable` / `closes_connection` values the code has.
//! (`testbed/tests/client_transcript.rs` checks the byte-exact reference session of §15.)
//!
//! A dump sits between `<!-- frame:NAME -->` and `<!-- /frame:NAME -->` as a fenced block in
//! `hexdump -C` layout; the error table between `<!-- error-codes -->` and `<!-- /error-codes -->`.
//! On a mismatch the test prints the block the document should contain.

use scheduler_core::codec::{APP_MAX_FRAME, LENGTH_PREFIX, encode_frame, from_payload};
use scheduler_core::protocol::app::{
    APP_PROTOCOL_VERSION, Allocate, AppRequest, AppResponse, ErrorCode, ErrorFrame, Hello, Welcome,
};
use scheduler_core::{ContainerType, Resources};

fn protocol_md() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"))
}

/// The text between `<!-- NAME -->` and `<!-- /NAME -->` (exactly one occurrence of each).
fn section<'a>(doc: &'a str, name: &str) -> &'a str {
    let open = format!("<!-- {name} -->");
    let close = format!("<!-- /{name} -->");
    assert_eq!(
        doc.matches(&open).count(),
        1,
        "docs/protocol.md must contain the marker {open} exactly once"
    );
    assert_eq!(
        doc.matches(&close).count(),
        1,
        "docs/protocol.md must contain the marker {close} exactly once"
    );
    let start = doc.find(&open).map(|i| i + open.len()).unwrap_or_default();
    let end = doc.find(&close).unwrap_or_default();
    assert!(start <= end, "{open} must come before {close}");
    &doc[start..end]
}

/// `hexdump -C` layout: offset, 16 bytes in two groups of 8, printable ASCII.
fn hexdump(bytes: &[u8]) -> String {
    let mut out = String::new();
    for (line, chunk) in bytes.chunks(16).enumerate() {
        let mut hex = String::new();
        for i in 0..16 {
            if i == 8 {
                hex.push(' ');
            }
            match chunk.get(i) {
                Some(b) => hex.push_str(&format!("{b:02x} ")),
                None => hex.push_str("   "),
            }
        }
        let ascii: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {hex} |{ascii}|\n", line * 16));
    }
    out
}

/// The fenced block the document must hold for `frame`.
fn expected_block(frame: &[u8]) -> String {
    format!("\n```text\n{}```\n", hexdump(frame))
}

fn check_frame(doc: &str, name: &str, frame: &[u8]) {
    let got = section(doc, &format!("frame:{name}"));
    let want = expected_block(frame);
    assert!(
        got == want,
        "hex dump `{name}` in docs/protocol.md is out of date; it should read:\n\
         <!-- frame:{name} -->{want}<!-- /frame:{name} -->"
    );
}

fn hello() -> AppRequest {
    AppRequest::Hello(Hello {
        protocol_version: APP_PROTOCOL_VERSION,
        app_id: "demo".into(),
        app_secret: "s3cret".into(),
        client_name: Some("example/1.0".into()),
    })
}

fn welcome() -> AppResponse {
    AppResponse::Welcome(Welcome {
        protocol_version: APP_PROTOCOL_VERSION,
        node_id: "w1".into(),
        max_frame_bytes: APP_MAX_FRAME as u64,
    })
}

fn allocate() -> AppRequest {
    AppRequest::Allocate(Allocate {
        request_id: 1,
        resources: Resources::new(500, 256),
        count: 2,
        priority: 0,
        container_type: ContainerType::Queueable,
        locality: None,
        runtime_estimate_ms: Some(2000),
        job_id: "job-1".into(),
        job_submit_time_ms: 1_700_000_000_000,
        reservation_id: None,
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: Vec::new(),
    })
}

fn error_frame() -> AppResponse {
    AppResponse::Error(ErrorFrame::new(
        None,
        ErrorCode::HelloRequired,
        "the first frame must be a hello",
    ))
}

#[test]
fn hex_dumps_are_the_codec_output() {
    let doc = protocol_md();
    let hello = encode_frame(&hello(), APP_MAX_FRAME).expect("hello encodes");
    check_frame(&doc, "hello", &hello);
    let welcome = encode_frame(&welcome(), APP_MAX_FRAME).expect("welcome encodes");
    check_frame(&doc, "welcome", &welcome);
    let allocate = encode_frame(&allocate(), APP_MAX_FRAME).expect("allocate encodes");
    check_frame(&doc, "allocate", &allocate);
    let error = encode_frame(&error_frame(), APP_MAX_FRAME).expect("error encodes");
    check_frame(&doc, "error", &error);
}

#[test]
fn documented_frames_decode_to_the_documented_messages() {
    // The other direction: what a client copies from the document is what the worker reads.
    for (frame, message) in [
        (
            encode_frame(&hello(), APP_MAX_FRAME).expect("hello encodes"),
            hello(),
        ),
        (
            encode_frame(&allocate(), APP_MAX_FRAME).expect("allocate encodes"),
            allocate(),
        ),
    ] {
        let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        assert_eq!(
            len,
            frame.len() - LENGTH_PREFIX,
            "length prefix is the payload length"
        );
        let decoded: AppRequest = from_payload(&frame[LENGTH_PREFIX..]).expect("decodes");
        assert_eq!(decoded, message);
    }
    let frame = encode_frame(&welcome(), APP_MAX_FRAME).expect("welcome encodes");
    let decoded: AppResponse = from_payload(&frame[LENGTH_PREFIX..]).expect("decodes");
    assert_eq!(decoded, welcome());
}

/// Every error code with its wire name. The match has no wildcard arm, so a new `ErrorCode`
/// variant fails to compile here until it is added (and then documented).
fn all_error_codes() -> Vec<(ErrorCode, &'static str)> {
    let codes = [
        ErrorCode::VersionMismatch,
        ErrorCode::BadCredentials,
        ErrorCode::HelloRequired,
        ErrorCode::MalformedFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::UnknownMessage,
        ErrorCode::InvalidRequest,
        ErrorCode::AskTooLarge,
        ErrorCode::QuotaExceeded,
        ErrorCode::InvalidToken,
        ErrorCode::UnknownContainer,
        ErrorCode::PromotionRefused,
        ErrorCode::GuaranteedCapacityExceeded,
        ErrorCode::CoordinatorUnavailable,
        ErrorCode::Internal,
        ErrorCode::TooManyConnections,
        ErrorCode::ReservationRejected,
        ErrorCode::UnknownReservation,
    ];
    codes
        .into_iter()
        .map(|c| {
            let name = match c {
                ErrorCode::VersionMismatch => "version_mismatch",
                ErrorCode::BadCredentials => "bad_credentials",
                ErrorCode::HelloRequired => "hello_required",
                ErrorCode::MalformedFrame => "malformed_frame",
                ErrorCode::FrameTooLarge => "frame_too_large",
                ErrorCode::UnknownMessage => "unknown_message",
                ErrorCode::InvalidRequest => "invalid_request",
                ErrorCode::AskTooLarge => "ask_too_large",
                ErrorCode::QuotaExceeded => "quota_exceeded",
                ErrorCode::InvalidToken => "invalid_token",
                ErrorCode::UnknownContainer => "unknown_container",
                ErrorCode::PromotionRefused => "promotion_refused",
                ErrorCode::GuaranteedCapacityExceeded => "guaranteed_capacity_exceeded",
                ErrorCode::CoordinatorUnavailable => "coordinator_unavailable",
                ErrorCode::Internal => "internal",
                ErrorCode::TooManyConnections => "too_many_connections",
                ErrorCode::ReservationRejected => "reservation_rejected",
                ErrorCode::UnknownReservation => "unknown_reservation",
            };
            (c, name)
        })
        .collect()
}

#[test]
fn error_code_table_matches_the_code() {
    let doc = protocol_md();
    let table = section(&doc, "error-codes");
    // Rows look like: | `code` | yes/no (retryable) | yes/no (closes) | meaning |
    let mut rows = std::collections::BTreeMap::new();
    for line in table.lines().filter(|l| l.trim_start().starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert!(
            cells.len() >= 6,
            "error table row has too few cells: {line}"
        );
        let code = cells[1].trim_matches('`').to_string();
        assert!(
            rows.insert(code.clone(), (cells[2].to_string(), cells[3].to_string()))
                .is_none(),
            "error code {code} is listed twice"
        );
    }
    let codes = all_error_codes();
    assert_eq!(
        rows.len(),
        codes.len(),
        "the error table lists {:?}; the code has {} codes",
        rows.keys().collect::<Vec<_>>(),
        codes.len()
    );
    for (code, name) in codes {
        // The wire name is what serde writes (a bare value, not a frame: plain rmp-serde).
        let wire: String =
            rmp_serde::from_slice(&scheduler_core::codec::to_payload(&code).expect("code encodes"))
                .expect("code decodes as a string");
        assert_eq!(wire, name);
        let (retryable, closes) = rows
            .get(name)
            .unwrap_or_else(|| panic!("error code `{name}` is missing from docs/protocol.md"));
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        assert_eq!(
            retryable,
            yes_no(code.retryable()),
            "retryable column of `{name}`"
        );
        assert_eq!(
            closes,
            yes_no(code.closes_connection()),
            "closes-connection column of `{name}`"
        );
    }
}

/// `1048576` as the document writes numbers: groups of three digits separated by spaces.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

#[test]
fn limits_table_lists_every_bound_with_its_value() {
    use scheduler_core::protocol::app::MAX_CONTAINERS_PER_ALLOCATE;
    use scheduler_core::protocol::limits::*;
    let doc = protocol_md();
    let table = section(&doc, "limits");
    let bounds: [(&str, u64); 21] = [
        ("APP_MAX_FRAME", APP_MAX_FRAME as u64),
        (
            "MAX_CONTAINERS_PER_ALLOCATE",
            MAX_CONTAINERS_PER_ALLOCATE.into(),
        ),
        ("HELLO_MAX_FRAME", HELLO_MAX_FRAME as u64),
        ("MAX_APP_ID_BYTES", MAX_APP_ID_BYTES as u64),
        ("MAX_APP_SECRET_BYTES", MAX_APP_SECRET_BYTES as u64),
        ("MAX_CLIENT_NAME_BYTES", MAX_CLIENT_NAME_BYTES as u64),
        ("MAX_JOB_ID_BYTES", MAX_JOB_ID_BYTES as u64),
        ("MAX_RUNTIME_ESTIMATE_MS", MAX_RUNTIME_ESTIMATE_MS),
        ("MAX_LOCALITY_NAME_BYTES", MAX_LOCALITY_NAME_BYTES as u64),
        ("MAX_LOCALITY_NAMES", MAX_LOCALITY_NAMES as u64),
        ("MAX_PATH_BYTES", MAX_PATH_BYTES as u64),
        ("MAX_ARGS", MAX_ARGS as u64),
        ("MAX_ENV_VARS", MAX_ENV_VARS as u64),
        ("MAX_ENV_NAME_BYTES", MAX_ENV_NAME_BYTES as u64),
        ("MAX_LAUNCH_BYTES", MAX_LAUNCH_BYTES as u64),
        ("MAX_SIGNATURE_BYTES", MAX_SIGNATURE_BYTES as u64),
        ("MAX_CONTAINERS_PER_NODE", MAX_CONTAINERS_PER_NODE as u64),
        ("MAX_RESERVATION_ID_BYTES", MAX_RESERVATION_ID_BYTES as u64),
        ("MAX_RESERVATION_STAGES", MAX_RESERVATION_STAGES as u64),
        ("MAX_RESERVATIONS_PER_APP", MAX_RESERVATIONS_PER_APP as u64),
        (
            "MAX_WAITING_GUARANTEED_ASKS_PER_APP",
            MAX_WAITING_GUARANTEED_ASKS_PER_APP as u64,
        ),
    ];
    for (name, value) in bounds {
        let marker = format!("(`{name}`)");
        let rows: Vec<&str> = table.lines().filter(|l| l.contains(&marker)).collect();
        assert_eq!(
            rows.len(),
            1,
            "docs/protocol.md §10 must have exactly one row set by `{name}`"
        );
        let cells: Vec<&str> = rows[0].split('|').map(str::trim).collect();
        let want = grouped(value);
        assert!(
            cells.get(2).is_some_and(|v| v.contains(&want)),
            "§10 row of `{name}` should give its value {want}: {}",
            rows[0]
        );
    }
}
