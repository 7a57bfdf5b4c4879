//! The seeded generator of hostile frames: valid messages of both protocols, turned into a
//! msgpack value tree, mutated field by field (wrong types, huge and negative numbers, NaN,
//! long strings, deep nesting, missing, unknown and duplicated keys, other `type` tags), encoded
//! (sometimes non-canonically), then mutated as bytes (truncation, trailing bytes, bit flips,
//! headers whose lengths lie) and framed with length prefixes that may lie too.
//!
//! Everything is a pure function of a [`Rng`] seeded from `(seed, case index)`, so any case can
//! be replayed alone (`testbed fuzz --seed S --first-case I --cases 1`).

use scheduler_core::codec::to_payload;
use scheduler_core::coordinator::{ContainerNotice, NoticeKind};
use scheduler_core::distributed::{
    ClusterSummary, ClusterView, DirectoryDelta, NodeDirectoryEntry, SlotLoad,
};
use scheduler_core::node::{ContainerJob, ContainerStatus, Placement};
use scheduler_core::protocol::app::{
    self, AcceptedState, Allocate, AppRequest, AppResponse, ContainerEvent, ContainerEventKind,
    ErrorCode, ErrorFrame, GrantedContainer, LaunchSpec, Locality, ShedContainer,
};
use scheduler_core::protocol::cluster::{self, CoordinatorToWorker, WorkerToCoordinator};
use scheduler_core::queue_delay::QueueDelay;
use scheduler_core::quota::QueueableQuota;
use scheduler_core::reservation::book::ReprovisionCause;
use scheduler_core::reservation::{AllocationInterval, Interpreter, ReservationDefinition, Stage};
use scheduler_core::token::{
    ContainerToken, IssuerNodeKey, NodeSessionSecret, PublicKeyRing, PublicTokenKey, TokenBody,
};
use scheduler_core::{AppId, ContainerId, ContainerType, JobId, KillReason, NodeId, Resources};
use std::collections::BTreeMap;

/// SplitMix64: tiny, fast, and the same on every platform and `rand` version.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of case `index` of a run seeded with `seed`.
    pub fn for_case(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// `0..max` random bytes.
    pub fn some_bytes(&mut self, max: u64) -> Vec<u8> {
        let n = self.below(max) as usize;
        self.bytes(n)
    }

    /// An integer that is interesting more often than uniform: edges, small, any.
    pub fn interesting_u64(&mut self) -> u64 {
        match self.below(6) {
            0 => *self.pick(&[
                0,
                1,
                0x7f,
                0x80,
                0xff,
                0x100,
                0xffff,
                0x1_0000,
                u32::MAX as u64,
            ]),
            1 => *self.pick(&[u64::MAX, u64::MAX - 1, i64::MAX as u64, 1 << 63, 1 << 40]),
            2 => self.below(10),
            3 => self.below(100_000),
            _ => self.next_u64(),
        }
    }

    pub fn word(&mut self) -> String {
        let len = self.below(12) as usize;
        (0..len)
            .map(|_| *self.pick(b"abcdefghijklmnopqrstuvwxyz_-0123456789") as char)
            .collect()
    }
}

/// A msgpack value as the fuzzer sees it. `Raw` bytes are written as they are (a header that
/// lies about what follows, garbage in the middle of a map).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    UInt(u64),
    Int(i64),
    F32(f32),
    F64(f64),
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Ext(i8, Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Raw(Vec<u8>),
}

impl Value {
    pub fn str(s: &str) -> Value {
        Value::Str(s.as_bytes().to_vec())
    }
}

/// Parse one canonical msgpack value (the output of `codec::to_payload`). `None` on anything
/// unexpected: only used on payloads this crate encoded itself.
pub fn parse(bytes: &[u8]) -> Option<Value> {
    let mut pos = 0;
    let v = parse_at(bytes, &mut pos, 0)?;
    (pos == bytes.len()).then_some(v)
}

fn take<'a>(b: &'a [u8], pos: &mut usize, n: usize) -> Option<&'a [u8]> {
    let s = b.get(*pos..pos.checked_add(n)?)?;
    *pos += n;
    Some(s)
}

fn be(b: &[u8], pos: &mut usize, n: usize) -> Option<u64> {
    Some(
        take(b, pos, n)?
            .iter()
            .fold(0u64, |acc, &x| (acc << 8) | x as u64),
    )
}

fn parse_at(b: &[u8], pos: &mut usize, depth: usize) -> Option<Value> {
    if depth > 64 {
        return None;
    }
    let m = *b.get(*pos)?;
    *pos += 1;
    let array = |n: u64, pos: &mut usize| -> Option<Value> {
        let mut items = Vec::new();
        for _ in 0..n {
            items.push(parse_at(b, pos, depth + 1)?);
        }
        Some(Value::Array(items))
    };
    let map = |n: u64, pos: &mut usize| -> Option<Value> {
        let mut items = Vec::new();
        for _ in 0..n {
            let k = parse_at(b, pos, depth + 1)?;
            let v = parse_at(b, pos, depth + 1)?;
            items.push((k, v));
        }
        Some(Value::Map(items))
    };
    let bytes =
        |n: u64, pos: &mut usize| -> Option<Vec<u8>> { Some(take(b, pos, n as usize)?.to_vec()) };
    Some(match m {
        0x00..=0x7f => Value::UInt(m as u64),
        0x80..=0x8f => map((m & 0x0f) as u64, pos)?,
        0x90..=0x9f => array((m & 0x0f) as u64, pos)?,
        0xa0..=0xbf => Value::Str(bytes((m & 0x1f) as u64, pos)?),
        0xc0 => Value::Nil,
        0xc2 => Value::Bool(false),
        0xc3 => Value::Bool(true),
        0xc4 => {
            let n = be(b, pos, 1)?;
            Value::Bin(bytes(n, pos)?)
        }
        0xc5 => {
            let n = be(b, pos, 2)?;
            Value::Bin(bytes(n, pos)?)
        }
        0xc6 => {
            let n = be(b, pos, 4)?;
            Value::Bin(bytes(n, pos)?)
        }
        0xca => Value::F32(f32::from_bits(be(b, pos, 4)? as u32)),
        0xcb => Value::F64(f64::from_bits(be(b, pos, 8)?)),
        0xcc => Value::UInt(be(b, pos, 1)?),
        0xcd => Value::UInt(be(b, pos, 2)?),
        0xce => Value::UInt(be(b, pos, 4)?),
        0xcf => Value::UInt(be(b, pos, 8)?),
        0xd0 => Value::Int(be(b, pos, 1)? as u8 as i8 as i64),
        0xd1 => Value::Int(be(b, pos, 2)? as u16 as i16 as i64),
        0xd2 => Value::Int(be(b, pos, 4)? as u32 as i32 as i64),
        0xd3 => Value::Int(be(b, pos, 8)? as i64),
        0xd9 => {
            let n = be(b, pos, 1)?;
            Value::Str(bytes(n, pos)?)
        }
        0xda => {
            let n = be(b, pos, 2)?;
            Value::Str(bytes(n, pos)?)
        }
        0xdb => {
            let n = be(b, pos, 4)?;
            Value::Str(bytes(n, pos)?)
        }
        0xdc => {
            let n = be(b, pos, 2)?;
            array(n, pos)?
        }
        0xdd => {
            let n = be(b, pos, 4)?;
            array(n, pos)?
        }
        0xde => {
            let n = be(b, pos, 2)?;
            map(n, pos)?
        }
        0xdf => {
            let n = be(b, pos, 4)?;
            map(n, pos)?
        }
        0xe0..=0xff => Value::Int(m as i8 as i64),
        _ => return None, // ext types: never produced by the encoder
    })
}

/// Encode a value. With `odd` set, lengths and integers sometimes use a wider header than
/// needed (legal msgpack that canonical encoders never write).
pub fn encode(v: &Value, rng: &mut Rng, odd: bool, out: &mut Vec<u8>) {
    let wide = |rng: &mut Rng| odd && rng.chance(1, 4);
    match v {
        Value::Nil => out.push(0xc0),
        Value::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Value::UInt(n) => {
            let n = *n;
            if wide(rng) {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            } else if n < 0x80 {
                out.push(n as u8);
            } else if n <= 0xff {
                out.extend_from_slice(&[0xcc, n as u8]);
            } else if n <= 0xffff {
                out.push(0xcd);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            } else if n <= 0xffff_ffff {
                out.push(0xce);
                out.extend_from_slice(&(n as u32).to_be_bytes());
            } else {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Value::Int(n) => {
            let n = *n;
            if n >= 0 && !wide(rng) {
                encode(&Value::UInt(n as u64), rng, odd, out);
            } else if (-32..0).contains(&n) && !wide(rng) {
                out.push(n as i8 as u8);
            } else if i8::try_from(n).is_ok() && !wide(rng) {
                out.extend_from_slice(&[0xd0, n as i8 as u8]);
            } else if i16::try_from(n).is_ok() && !wide(rng) {
                out.push(0xd1);
                out.extend_from_slice(&(n as i16).to_be_bytes());
            } else if i32::try_from(n).is_ok() && !wide(rng) {
                out.push(0xd2);
                out.extend_from_slice(&(n as i32).to_be_bytes());
            } else {
                out.push(0xd3);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Value::F32(f) => {
            out.push(0xca);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Value::F64(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Value::Str(s) => {
            header(
                out,
                s.len(),
                [Some(0xa0), Some(0xd9), Some(0xda), Some(0xdb)],
                wide(rng),
            );
            out.extend_from_slice(s);
        }
        Value::Bin(s) => {
            header(
                out,
                s.len(),
                [None, Some(0xc4), Some(0xc5), Some(0xc6)],
                wide(rng),
            );
            out.extend_from_slice(s);
        }
        Value::Ext(t, data) => {
            match data.len() {
                1 => out.push(0xd4),
                2 => out.push(0xd5),
                4 => out.push(0xd6),
                8 => out.push(0xd7),
                16 => out.push(0xd8),
                n => {
                    out.push(0xc7);
                    out.push(n.min(255) as u8);
                }
            }
            out.push(*t as u8);
            out.extend_from_slice(&data[..data.len().min(255)]);
        }
        Value::Array(items) => {
            header(
                out,
                items.len(),
                [Some(0x90), None, Some(0xdc), Some(0xdd)],
                wide(rng),
            );
            for i in items {
                encode(i, rng, odd, out);
            }
        }
        Value::Map(items) => {
            header(
                out,
                items.len(),
                [Some(0x80), None, Some(0xde), Some(0xdf)],
                wide(rng),
            );
            for (k, v) in items {
                encode(k, rng, odd, out);
                encode(v, rng, odd, out);
            }
        }
        Value::Raw(b) => out.extend_from_slice(b),
    }
}

/// A length header: [fix marker (4 or 5 bits of length), 8-bit, 16-bit, 32-bit].
fn header(out: &mut Vec<u8>, len: usize, markers: [Option<u8>; 4], wide: bool) {
    let fix_max = if markers[0] == Some(0xa0) { 31 } else { 15 };
    match markers {
        [Some(fix), ..] if len <= fix_max && !wide => out.push(fix | len as u8),
        [_, Some(m8), ..] if len <= 0xff && !wide => out.extend_from_slice(&[m8, len as u8]),
        [_, _, Some(m16), _] if len <= 0xffff && !wide => {
            out.push(m16);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        [_, _, _, Some(m32)] => {
            out.push(m32);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
        _ => unreachable!("every header kind has a 32-bit form"),
    }
}

/// Which protocol's messages to start from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    App,
    Cluster,
}

fn rid(rng: &mut Rng) -> u64 {
    if rng.chance(1, 8) {
        rng.interesting_u64()
    } else {
        rng.below(1000)
    }
}

fn resources(rng: &mut Rng) -> Resources {
    if rng.chance(1, 8) {
        Resources::new(rng.interesting_u64(), rng.interesting_u64())
    } else {
        Resources::new(rng.below(4000) + 1, rng.below(4096) + 1)
    }
}

fn container_type(rng: &mut Rng) -> ContainerType {
    if rng.chance(1, 2) {
        ContainerType::Guaranteed
    } else {
        ContainerType::Queueable
    }
}

fn cid(rng: &mut Rng) -> ContainerId {
    if rng.chance(1, 4) {
        ContainerId(rng.interesting_u64())
    } else {
        ContainerId::new(rng.below(8) as u32, rng.below(100))
    }
}

fn token(rng: &mut Rng) -> ContainerToken {
    ContainerToken {
        body: TokenBody {
            container_id: cid(rng),
            node_id: NodeId::from(rng.word()),
            app_id: AppId::new(rng.word()),
            resources: resources(rng),
            container_type: container_type(rng),
            version: rng.below(3) as u32,
            job_id: JobId::from(rng.word()),
            job_submit_time_ms: rng.interesting_u64(),
            priority: rng.below(5) as u32,
            runtime_estimate_ms: rng.chance(1, 2).then(|| rng.interesting_u64()),
            expires_at_ms: rng.interesting_u64(),
            key_id: rng.below(3) as u32,
            node_epoch: rng.below(3) as u32,
            booking: None,
            times_returned: 0,
        },
        signature: {
            let n = if rng.chance(1, 2) { 32 } else { 64 };
            hex(&rng.bytes(n))
        },
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A valid `allocate`, with any field values the type allows.
pub fn allocate(rng: &mut Rng) -> Allocate {
    Allocate {
        request_id: rid(rng),
        resources: resources(rng),
        count: if rng.chance(1, 8) {
            rng.interesting_u64() as u32
        } else {
            rng.below(4) as u32 + 1
        },
        priority: rng.below(5) as u32,
        container_type: container_type(rng),
        locality: rng.chance(1, 3).then(|| Locality {
            nodes: (0..rng.below(3)).map(|_| rng.word()).collect(),
            racks: (0..rng.below(2)).map(|_| rng.word()).collect(),
            relax: rng.chance(1, 2),
        }),
        runtime_estimate_ms: rng.chance(1, 2).then(|| rng.interesting_u64()),
        job_id: rng.word(),
        job_submit_time_ms: rng.interesting_u64(),
        reservation_id: rng.chance(1, 4).then(|| rng.word()),
        role: Default::default(),
        allow_shaping: false,
        job: None,
        replaces_shed: (0..if rng.chance(1, 4) { rng.below(3) } else { 0 })
            .map(|_| ShedContainer {
                container_id: cid(rng),
                node_id: NodeId::from(rng.word()),
            })
            .collect(),
    }
}

/// A reservation definition of any values the types allow (stages, windows, NaN penalties).
fn reservation_definition(rng: &mut Rng) -> ReservationDefinition {
    ReservationDefinition {
        arrival_ms: rng.interesting_u64(),
        deadline_ms: rng.interesting_u64(),
        interpreter: *rng.pick(&[
            Interpreter::All,
            Interpreter::Any,
            Interpreter::Order,
            Interpreter::OrderNoGap,
        ]),
        stages: (0..rng.below(3))
            .map(|_| Stage {
                containers: rng.interesting_u64() as u32,
                gang: rng.below(4) as u32,
                duration_ms: rng.interesting_u64(),
                size: resources(rng),
            })
            .collect(),
        recurrence_ms: rng.chance(1, 2).then(|| rng.interesting_u64()),
        alignment_penalty: float(rng),
    }
}

fn allocation(rng: &mut Rng) -> Vec<AllocationInterval> {
    (0..rng.below(3))
        .map(|_| AllocationInterval {
            start_ms: rng.interesting_u64(),
            end_ms: rng.interesting_u64(),
            cpu_millis: rng.interesting_u64(),
            memory_mib: rng.interesting_u64(),
        })
        .collect()
}

fn reprovision_cause(rng: &mut Rng) -> ReprovisionCause {
    if rng.chance(1, 2) {
        ReprovisionCause::Replanned
    } else {
        ReprovisionCause::Stretched {
            extra: resources(rng),
            until_ms: rng.interesting_u64(),
        }
    }
}

fn reservation_op(rng: &mut Rng) -> cluster::ReservationOp {
    match rng.below(4) {
        0 => cluster::ReservationOp::Reserve {
            reservation_id: rng.word(),
            definition: reservation_definition(rng),
        },
        1 => cluster::ReservationOp::Update {
            reservation_id: rng.word(),
            definition: reservation_definition(rng),
        },
        2 => cluster::ReservationOp::Delete {
            reservation_id: rng.word(),
        },
        _ => cluster::ReservationOp::List,
    }
}

fn reservation_summary(rng: &mut Rng) -> app::ReservationSummary {
    app::ReservationSummary {
        reservation_id: rng.word(),
        definition: reservation_definition(rng),
        allocated_now: resources(rng),
        used: resources(rng),
    }
}

/// A valid app request; `hello` uses `creds` (app id, secret) when given.
pub fn app_request(rng: &mut Rng, creds: Option<(&str, &str)>) -> AppRequest {
    match rng.below(11) {
        0 => AppRequest::Hello(app::Hello {
            protocol_version: if rng.chance(7, 8) {
                app::APP_PROTOCOL_VERSION
            } else {
                rng.interesting_u64() as u32
            },
            app_id: creds.map_or_else(|| rng.word(), |c| c.0.to_string()),
            app_secret: creds.map_or_else(|| rng.word(), |c| c.1.to_string()),
            client_name: rng.chance(1, 2).then(|| rng.word()),
        }),
        1 => AppRequest::Allocate(allocate(rng)),
        2 => AppRequest::Release(app::Release {
            request_id: rid(rng),
            container_id: cid(rng),
        }),
        3 => AppRequest::Promote(app::Promote {
            request_id: rid(rng),
            container_id: cid(rng),
        }),
        4 => AppRequest::StartContainer(app::StartContainer {
            request_id: rid(rng),
            token: token(rng),
            launch: LaunchSpec {
                command: rng.word(),
                args: (0..rng.below(3)).map(|_| rng.word()).collect(),
                env: (0..rng.below(3))
                    .map(|_| (rng.word(), rng.word()))
                    .collect::<BTreeMap<_, _>>(),
                working_dir: rng.chance(1, 2).then(|| rng.word()),
            },
        }),
        5 => AppRequest::StopContainer(app::StopContainer {
            request_id: rid(rng),
            container_id: cid(rng),
        }),
        6 => AppRequest::Reserve(app::Reserve {
            request_id: rid(rng),
            reservation_id: rng.word(),
            definition: reservation_definition(rng),
        }),
        7 => AppRequest::UpdateReservation(app::UpdateReservation {
            request_id: rid(rng),
            reservation_id: rng.word(),
            definition: reservation_definition(rng),
        }),
        8 => AppRequest::DeleteReservation(app::DeleteReservation {
            request_id: rid(rng),
            reservation_id: rng.word(),
        }),
        9 => AppRequest::ListReservations(app::ListReservations {
            request_id: rid(rng),
        }),
        _ => AppRequest::Subscribe(app::Subscribe {
            request_id: rid(rng),
        }),
    }
}

fn granted(rng: &mut Rng) -> GrantedContainer {
    GrantedContainer {
        container_id: cid(rng),
        node_id: NodeId::from(rng.word()),
        node_endpoint: format!("{}:{}", rng.word(), rng.below(65536)),
        container_type: container_type(rng),
        resources: resources(rng),
        token: token(rng),
    }
}

fn error_code(rng: &mut Rng) -> ErrorCode {
    *rng.pick(&[
        ErrorCode::VersionMismatch,
        ErrorCode::MalformedFrame,
        ErrorCode::InvalidRequest,
        ErrorCode::QuotaExceeded,
        ErrorCode::InvalidToken,
        ErrorCode::CoordinatorUnavailable,
        ErrorCode::Internal,
    ])
}

/// A valid app response (what clients decode).
pub fn app_response(rng: &mut Rng) -> AppResponse {
    match rng.below(11) {
        0 => AppResponse::Welcome(app::Welcome {
            protocol_version: 1,
            node_id: rng.word(),
            max_frame_bytes: rng.interesting_u64(),
        }),
        1 => AppResponse::Allocated(app::Allocated {
            request_id: rid(rng),
            containers: (0..rng.below(3)).map(|_| granted(rng)).collect(),
            remaining: rng.below(3) as u32,
            unplaced: rng.below(3) as u32,
            unplaced_reason: rng.chance(1, 2).then(|| rng.word()),
        }),
        2 => AppResponse::Promoted(app::Promoted {
            request_id: rid(rng),
            container_id: cid(rng),
            token: token(rng),
        }),
        3 => AppResponse::ContainerAccepted(app::ContainerAccepted {
            request_id: rid(rng),
            container_id: cid(rng),
            state: if rng.chance(1, 2) {
                AcceptedState::Running
            } else {
                AcceptedState::Queued
            },
        }),
        4 => AppResponse::Ack(app::Ack {
            request_id: rid(rng),
        }),
        5 => AppResponse::Event(ContainerEvent {
            container_id: cid(rng),
            node_id: NodeId::from(rng.word()),
            event: match rng.below(5) {
                0 => ContainerEventKind::Queued,
                1 => ContainerEventKind::Running,
                2 => ContainerEventKind::Completed {
                    exit_code: rng.next_u64() as i32,
                },
                3 => ContainerEventKind::Killed {
                    reason: KillReason::Lost,
                    message: rng.word(),
                },
                _ => ContainerEventKind::Promoted {
                    version: rng.below(4) as u32,
                },
            },
            at_ms: rng.interesting_u64(),
        }),
        6 => AppResponse::Reservation(app::ReservationAccepted {
            request_id: rid(rng),
            reservation_id: rng.word(),
            allocation: allocation(rng),
        }),
        7 => AppResponse::Reservations(app::ReservationList {
            request_id: rid(rng),
            reservations: (0..rng.below(3))
                .map(|_| reservation_summary(rng))
                .collect(),
            free: allocation(rng),
        }),
        8 => AppResponse::ReservationReprovisioned(app::ReservationReprovisioned {
            reservation_id: rng.word(),
            allocation: allocation(rng),
            cause: reprovision_cause(rng),
            at_ms: rng.interesting_u64(),
        }),
        9 => AppResponse::ReservationCancelled(app::ReservationCancelled {
            reservation_id: rng.word(),
            reason: rng.word(),
            at_ms: rng.interesting_u64(),
        }),
        _ => AppResponse::Error(ErrorFrame::new(
            rng.chance(1, 2).then(|| rid(rng)),
            error_code(rng),
            rng.word(),
        )),
    }
}

fn status(rng: &mut Rng) -> ContainerStatus {
    ContainerStatus {
        usage: None,
        id: cid(rng),
        app_id: AppId::new(rng.word()),
        container_type: container_type(rng),
        resources: resources(rng),
        placement: *rng.pick(&[
            Placement::Running,
            Placement::Queued,
            Placement::WaitingGuaranteed,
        ]),
        version: rng.below(3) as u32,
        job: rng.chance(1, 2).then(|| ContainerJob {
            job_id: JobId::from(rng.word()),
            job_submit_time_ms: rng.interesting_u64(),
            priority: rng.below(4) as u32,
            runtime_estimate_ms: rng.chance(1, 2).then(|| rng.interesting_u64()),
        }),
        grant_token: None,
    }
}

fn float(rng: &mut Rng) -> f64 {
    match rng.below(6) {
        0 => *rng.pick(&[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            f64::MAX,
            f64::MIN_POSITIVE,
        ]),
        _ => rng.below(100_000) as f64 / 7.0,
    }
}

fn directory_entries(rng: &mut Rng) -> Vec<NodeDirectoryEntry> {
    (0..rng.below(3))
        .map(|_| NodeDirectoryEntry {
            node_id: NodeId::from(rng.word()),
            rack: rng.word(),
            capacity: resources(rng),
            app_endpoint: rng.word(),
            slot: rng.below(64) as u32,
        })
        .collect()
}

fn view(rng: &mut Rng) -> ClusterView {
    ClusterView {
        directory_version: rng.interesting_u64(),
        directory: directory_entries(rng),
        delta: rng.chance(1, 2).then(|| DirectoryDelta {
            from_version: rng.interesting_u64(),
            joined: directory_entries(rng),
            left: (0..rng.below(3))
                .map(|_| NodeId::from(rng.word()))
                .collect(),
        }),
        // Names are not sent; the wire's list is by slot.
        top_k: Vec::new(),
        top_k_slots: (0..rng.below(3))
            .map(|_| SlotLoad {
                slot: rng.below(64) as u32,
                queue_delay_ms: float(rng),
            })
            .collect(),
        cluster: rng.chance(1, 2).then(|| ClusterSummary {
            nodes: rng.below(10_000) as u32,
            largest_capacities: (0..rng.below(3))
                .map(|_| Resources::new(rng.below(64_000), rng.below(256_000)))
                .collect(),
        }),
        entries: directory_entries(rng),
    }
}

fn node_secret(rng: &mut Rng) -> NodeSessionSecret {
    NodeSessionSecret {
        node_epoch: rng.below(100) as u32,
        secret_hex: hex(&rng.bytes(32)),
    }
}

fn issuer_keys(rng: &mut Rng) -> Vec<IssuerNodeKey> {
    (0..rng.below(4))
        .map(|_| IssuerNodeKey {
            node_id: NodeId::from(rng.word()),
            node_epoch: rng.below(100) as u32,
            secret: rng.bytes(32).try_into().expect("32 bytes"),
        })
        .collect()
}

fn public_ring(rng: &mut Rng) -> PublicKeyRing {
    PublicKeyRing {
        current: PublicTokenKey {
            key_id: rng.below(4) as u32,
            public_hex: hex(&rng.bytes(32)),
        },
        previous: rng.chance(1, 2).then(|| PublicTokenKey {
            key_id: rng.below(4) as u32,
            public_hex: hex(&rng.bytes(32)),
        }),
    }
}

fn outstanding(rng: &mut Rng) -> scheduler_core::quota::AppOutstanding {
    scheduler_core::quota::AppOutstanding {
        app_id: AppId::new(rng.word()),
        queueable: rng.below(1000) as u32,
        guaranteed: rng.below(1000) as u32,
    }
}

fn app_record(rng: &mut Rng) -> cluster::AppRecord {
    cluster::AppRecord {
        app_id: rng.word(),
        secret_sha256: hex(&rng.bytes(32)),
        quota: QueueableQuota {
            max_queueable: rng.chance(1, 2).then(|| rng.below(100) as u32),
            max_queueable_per_guaranteed: rng.chance(1, 2).then(|| float(rng)),
        },
    }
}

/// A valid worker-to-coordinator frame.
pub fn worker_to_coordinator(rng: &mut Rng) -> WorkerToCoordinator {
    let corr = rid(rng);
    match rng.below(8) {
        0 => WorkerToCoordinator::Join(cluster::Join {
            protocol_version: cluster::CLUSTER_PROTOCOL_VERSION,
            join_token: rng.word(),
            node_id: NodeId::from(rng.word()),
            rack: rng.word(),
            capacity: resources(rng),
            app_endpoint: rng.word(),
            containers: (0..rng.below(3)).map(|_| status(rng)).collect(),
            attributes: (0..rng.below(3))
                .map(|_| (rng.word(), rng.word()))
                .collect(),
        }),
        1 => WorkerToCoordinator::Heartbeat(cluster::Heartbeat {
            node_id: NodeId::from(rng.word()),
            directory_version: rng.interesting_u64(),
            queue_delay: QueueDelay {
                tq_ms: float(rng),
                tr_ms: float(rng),
                tl_ms: float(rng),
            },
            running: rng.below(10) as u32,
            queued: rng.below(10) as u32,
            allocated: resources(rng),
            usage: rng.chance(1, 2).then(|| resources(rng)),
            containers: (0..rng.below(3)).map(|_| status(rng)).collect(),
            started: (0..rng.below(3)).map(|_| cid(rng)).collect(),
            finished: (0..rng.below(3)).map(|_| cid(rng)).collect(),
            issued: (0..rng.below(3)).map(|_| outstanding(rng)).collect(),
        }),
        2 => WorkerToCoordinator::AllocateGuaranteed(cluster::AllocateGuaranteed {
            correlation_id: corr,
            app_id: rng.word(),
            allocate: allocate(rng),
        }),
        3 => WorkerToCoordinator::Promote(cluster::PromoteContainer {
            correlation_id: corr,
            app_id: rng.word(),
            container_id: cid(rng),
            local_status: rng.chance(1, 2).then(|| status(rng)),
        }),
        4 => WorkerToCoordinator::Release(cluster::ReleaseContainer {
            correlation_id: corr,
            app_id: rng.word(),
            container_id: cid(rng),
        }),
        5 => WorkerToCoordinator::PromotionApplied(cluster::PromotionApplied {
            correlation_id: corr,
            error: rng.chance(1, 2).then(|| rng.word()),
        }),
        6 => WorkerToCoordinator::Reservation(cluster::ReservationCall {
            correlation_id: corr,
            app_id: rng.word(),
            op: reservation_op(rng),
        }),
        _ if rng.chance(1, 2) => WorkerToCoordinator::ContainerResized(cluster::ContainerResized {
            container_id: cid(rng),
            resources: resources(rng),
            enforced_by: rng.word(),
            error: rng.chance(1, 2).then(|| rng.word()),
        }),
        _ => WorkerToCoordinator::CancelAllocate(cluster::CancelAllocate {
            correlation_id: corr,
        }),
    }
}

/// A valid coordinator-to-worker frame.
pub fn coordinator_to_worker(rng: &mut Rng) -> CoordinatorToWorker {
    let corr = rid(rng);
    match rng.below(12) {
        9 => CoordinatorToWorker::ReservationDone(cluster::ReservationDone {
            correlation_id: corr,
            reply: match rng.below(3) {
                0 => cluster::ReservationReply::Accepted {
                    reservation_id: rng.word(),
                    allocation: allocation(rng),
                },
                1 => cluster::ReservationReply::Deleted,
                _ => cluster::ReservationReply::Listed {
                    reservations: (0..rng.below(3))
                        .map(|_| reservation_summary(rng))
                        .collect(),
                    free: allocation(rng),
                },
            },
        }),
        10 => CoordinatorToWorker::ReservationNotice(cluster::ReservationNotice {
            app_id: rng.word(),
            event: if rng.chance(1, 2) {
                cluster::ReservationNoticeKind::Reprovisioned(app::ReservationReprovisioned {
                    reservation_id: rng.word(),
                    allocation: allocation(rng),
                    cause: reprovision_cause(rng),
                    at_ms: rng.interesting_u64(),
                })
            } else {
                cluster::ReservationNoticeKind::Cancelled(app::ReservationCancelled {
                    reservation_id: rng.word(),
                    reason: rng.word(),
                    at_ms: rng.interesting_u64(),
                })
            },
        }),
        0 => CoordinatorToWorker::JoinAccepted(cluster::JoinAccepted {
            protocol_version: cluster::CLUSTER_PROTOCOL_VERSION,
            issuer: rng.below(100) as u32,
            node_secret: node_secret(rng),
            issuer_keys: issuer_keys(rng),
            guaranteed_keys: public_ring(rng),
            apps: (0..rng.below(3)).map(|_| app_record(rng)).collect(),
            settings: cluster::ClusterSettings {
                top_k: rng.interesting_u64() as usize,
                token_ttl_ms: rng.interesting_u64(),
                heartbeat_interval_ms: rng.interesting_u64(),
            },
            view: view(rng),
            lost_containers: (0..rng.below(3)).map(|_| cid(rng)).collect(),
        }),
        1 => CoordinatorToWorker::JoinRejected(cluster::JoinRejected { reason: rng.word() }),
        2 => CoordinatorToWorker::HeartbeatAck(cluster::HeartbeatAck {
            view: view(rng),
            shedding_threshold_ms: rng.chance(1, 2).then(|| float(rng)),
            queueable_limit: resources(rng),
            notices: (0..rng.below(3))
                .map(|_| ContainerNotice {
                    container_id: cid(rng),
                    node_id: NodeId::from(rng.word()),
                    kind: rng
                        .pick(&[NoticeKind::Started, NoticeKind::Finished, NoticeKind::Lost])
                        .clone(),
                })
                .collect(),
            issuer_keys: rng.chance(1, 3).then(|| issuer_keys(rng)),
            guaranteed_keys: rng.chance(1, 3).then(|| public_ring(rng)),
            top_k: rng.chance(1, 4).then(|| rng.below(300) as usize),
            apps: rng
                .chance(1, 3)
                .then(|| (0..rng.below(3)).map(|_| app_record(rng)).collect()),
            outstanding_elsewhere: (0..rng.below(3)).map(|_| outstanding(rng)).collect(),
        }),
        3 => CoordinatorToWorker::GuaranteedAllocated(cluster::GuaranteedAllocated {
            correlation_id: corr,
            containers: (0..rng.below(3)).map(|_| granted(rng)).collect(),
            remaining: rng.below(3) as u32,
        }),
        4 => CoordinatorToWorker::PromoteResult(cluster::PromoteResult {
            correlation_id: corr,
            token: token(rng),
        }),
        5 => CoordinatorToWorker::Released(cluster::Released {
            correlation_id: corr,
        }),
        6 => CoordinatorToWorker::RequestFailed(cluster::RequestFailed {
            correlation_id: corr,
            code: error_code(rng),
            message: rng.word(),
        }),
        7 => CoordinatorToWorker::ApplyPromotion(cluster::ApplyPromotion {
            correlation_id: corr,
            token: token(rng),
        }),
        _ if rng.chance(1, 3) => CoordinatorToWorker::ResizeContainer(cluster::ResizeContainer {
            container_id: cid(rng),
            resources: resources(rng),
        }),
        _ => CoordinatorToWorker::StopContainer(cluster::StopContainerOnNode {
            shaped_preemption: rng
                .chance(1, 3)
                .then_some(scheduler_core::shaper::PreemptionReason::ElasticDoesNotFit),
            container_id: cid(rng),
            app_id: rng.word(),
            revoke_until_ms: rng.chance(1, 2).then(|| rng.interesting_u64()),
        }),
    }
}

/// Every `type` tag of both protocols but the app's requests
/// ([`scheduler_core::protocol::app::REQUEST_TYPES`]), to swap one message's tag for another's.
const OTHER_TAGS: &[&str] = &[
    "welcome",
    "allocated",
    "promoted",
    "container_accepted",
    "ack",
    "event",
    "error",
    "join",
    "heartbeat",
    "allocate_guaranteed",
    "promotion_applied",
    "cancel_allocate",
    "join_accepted",
    "join_rejected",
    "heartbeat_ack",
    "guaranteed_allocated",
    "promote_result",
    "released",
    "request_failed",
    "apply_promotion",
    "reservation",
    "reservations",
    "reservation_reprovisioned",
    "reservation_cancelled",
    "reservation_done",
    "reservation_notice",
    "resize_container",
    "container_resized",
];

/// A tag of either protocol, request tags first (as one list: the same draw picks the same tag).
fn any_tag(rng: &mut Rng) -> &'static str {
    let requests = scheduler_core::protocol::app::REQUEST_TYPES;
    let i = rng.index(requests.len() + OTHER_TAGS.len());
    match requests.get(i) {
        Some(t) => t,
        None => OTHER_TAGS[i - requests.len()],
    }
}

/// A valid message of `protocol` as a value tree (either direction).
pub fn valid_message(rng: &mut Rng, protocol: Protocol, creds: Option<(&str, &str)>) -> Value {
    let payload = match (protocol, rng.below(4)) {
        (Protocol::App, 0) => to_payload(&app_response(rng)),
        (Protocol::App, _) => to_payload(&app_request(rng, creds)),
        (Protocol::Cluster, 0 | 1) => to_payload(&worker_to_coordinator(rng)),
        (Protocol::Cluster, _) => to_payload(&coordinator_to_worker(rng)),
    }
    .expect("every message encodes");
    parse(&payload).expect("the generator parses what the codec writes")
}

/// A value of a random kind (the wrong type for most fields).
pub fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 3 { 10 } else { 13 }) {
        0 => Value::Nil,
        1 => Value::Bool(rng.chance(1, 2)),
        2 => Value::UInt(rng.interesting_u64()),
        3 => Value::Int(((rng.interesting_u64() >> rng.below(64)) as i64).wrapping_neg()),
        4 => Value::Int(i64::MIN),
        5 => Value::F64(float(rng)),
        6 => Value::F32(f32::NAN),
        7 => Value::Str(if rng.chance(1, 8) {
            rng.some_bytes(64)
        } else {
            rng.word().into_bytes()
        }),
        8 => Value::Bin(rng.some_bytes(16)),
        9 => {
            let n = *rng.pick(&[1, 2, 4, 8, 16, 3]);
            Value::Ext(rng.next_u64() as i8, rng.bytes(n))
        }
        10 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        11 => Value::Map(
            (0..rng.below(4))
                .map(|_| (random_value(rng, depth + 1), random_value(rng, depth + 1)))
                .collect(),
        ),
        _ => Value::Str(any_tag(rng).as_bytes().to_vec()),
    }
}

/// Arrays (or maps) nested `depth` deep around `inner`.
pub fn nested(rng: &mut Rng, depth: usize, inner: Value) -> Value {
    let map = rng.chance(1, 2);
    (0..depth).fold(inner, |v, _| {
        if map {
            Value::Map(vec![(Value::str("k"), v)])
        } else {
            Value::Array(vec![v])
        }
    })
}

/// A msgpack header announcing far more than follows (the decoder must not trust it).
pub fn lying_header(rng: &mut Rng) -> Vec<u8> {
    let n = *rng.pick(&[u32::MAX, u32::MAX - 1, 1 << 31, 1 << 24, 70_000, 300]);
    let marker = *rng.pick(&[0xdbu8, 0xc6, 0xdd, 0xdf, 0xc9]);
    let mut h = vec![marker];
    h.extend_from_slice(&n.to_be_bytes());
    if marker == 0xc9 {
        h.push(1); // ext32 type
    }
    h
}

/// The number of nodes in a tree (to pick one uniformly).
fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(items) => items.iter().map(count).sum(),
        Value::Map(items) => items.iter().map(|(k, v)| count(k) + count(v)).sum(),
        _ => 0,
    }
}

/// The `n`-th node in pre-order.
fn nth<'a>(v: &'a mut Value, n: &mut usize) -> Option<&'a mut Value> {
    if *n == 0 {
        return Some(v);
    }
    *n -= 1;
    match v {
        Value::Array(items) => {
            for i in items {
                if let Some(found) = nth(i, n) {
                    return Some(found);
                }
            }
            None
        }
        Value::Map(items) => {
            for (k, v) in items {
                if let Some(found) = nth(k, n) {
                    return Some(found);
                }
                if let Some(found) = nth(v, n) {
                    return Some(found);
                }
            }
            None
        }
        _ => None,
    }
}

/// Mutate one node of the tree.
pub fn mutate_value(rng: &mut Rng, root: &mut Value) {
    let total = count(root);
    let mut n = rng.index(total);
    let Some(node) = nth(root, &mut n) else {
        return;
    };
    match rng.below(12) {
        0..=2 => *node = random_value(rng, 0),
        3 => {
            *node = match node {
                Value::UInt(x) => Value::UInt(x.wrapping_add(rng.interesting_u64())),
                Value::Int(_) | Value::F64(_) | Value::F32(_) => {
                    Value::Int(-(rng.below(1 << 40) as i64) - 1)
                }
                _ => Value::UInt(rng.interesting_u64()),
            }
        }
        4 => *node = Value::Int(-((rng.interesting_u64() >> 1) as i64).max(1)),
        5 => {
            let depth = *rng.pick(&[8, 31, 32, 33, 40, 200, 1000]);
            let inner = node.clone();
            *node = nested(rng, depth, inner);
        }
        6 => {
            let len = if rng.chance(1, 8) {
                *rng.pick(&[70_000, 300_000])
            } else {
                256
            };
            *node = Value::Str(vec![b'x'; len]);
        }
        7 => match node {
            // Drop, duplicate or add a key.
            Value::Map(items) if !items.is_empty() => {
                let i = rng.index(items.len());
                match rng.below(3) {
                    0 => {
                        items.remove(i);
                    }
                    1 => {
                        let dup = (items[i].0.clone(), random_value(rng, 0));
                        items.push(dup);
                    }
                    _ => items.push((Value::Str(rng.word().into_bytes()), random_value(rng, 0))),
                }
            }
            Value::Array(items) if !items.is_empty() => {
                if rng.chance(1, 2) {
                    items.pop();
                } else {
                    items.push(random_value(rng, 0));
                }
            }
            _ => *node = Value::Nil,
        },
        8 => {
            if let Value::Str(s) = node {
                // Other tag, invalid UTF-8, or empty.
                *s = match rng.below(3) {
                    0 => any_tag(rng).as_bytes().to_vec(),
                    1 => vec![0xff, 0xfe, b'a'],
                    _ => Vec::new(),
                };
            } else {
                *node = Value::Str(any_tag(rng).as_bytes().to_vec());
            }
        }
        9 => *node = Value::Raw(lying_header(rng)),
        10 => {
            // A long array of small values (a count that is large but true).
            let len = if rng.chance(1, 8) {
                *rng.pick(&[5_000, 60_000])
            } else {
                100
            };
            *node = Value::Array(vec![Value::UInt(1); len]);
        }
        _ => *node = Value::Map(vec![(random_value(rng, 2), random_value(rng, 2))]),
    }
}

/// One payload (the bytes inside a frame): structure-aware most of the time, random bytes
/// sometimes.
pub fn payload(rng: &mut Rng, protocol: Protocol, creds: Option<(&str, &str)>) -> Vec<u8> {
    if rng.chance(1, 16) {
        let n = rng.below(64) as usize;
        return rng.bytes(n);
    }
    let mut v = valid_message(rng, protocol, creds);
    if rng.chance(1, 10) {
        // Unchanged: the decoder must accept it.
    } else {
        for _ in 0..1 + rng.below(3) {
            mutate_value(rng, &mut v);
        }
    }
    let mut out = Vec::new();
    let odd = rng.chance(1, 4);
    encode(&v, rng, odd, &mut out);
    mutate_bytes(rng, &mut out);
    out
}

/// Byte-level damage, sometimes none.
pub fn mutate_bytes(rng: &mut Rng, b: &mut Vec<u8>) {
    match rng.below(10) {
        0 if !b.is_empty() => {
            let at = rng.index(b.len());
            b.truncate(at);
        }
        1 => {
            let n = 1 + rng.below(8) as usize;
            let extra = rng.bytes(n);
            b.extend_from_slice(&extra);
        }
        2 if !b.is_empty() => {
            for _ in 0..1 + rng.below(4) {
                let i = rng.index(b.len());
                b[i] ^= 1 << rng.below(8);
            }
        }
        3 if !b.is_empty() => {
            let at = rng.index(b.len());
            let h = lying_header(rng);
            b.splice(at..at, h);
        }
        4 if !b.is_empty() => {
            let i = rng.index(b.len());
            b[i] = *rng.pick(&[0xc1, 0xc0, 0xff, 0x00, 0xdf, 0xdd, 0xdb]);
        }
        _ => {}
    }
}

/// A frame around `payload`: usually an honest length prefix, sometimes one that lies (more,
/// less, over the cap, `u32::MAX`).
pub fn frame(rng: &mut Rng, payload: &[u8], cap: usize) -> Vec<u8> {
    let honest = payload.len() as u32;
    let len = match rng.below(32) {
        0 => honest.saturating_add(1 + rng.below(100) as u32),
        1 => honest.saturating_sub(1 + rng.below(8) as u32),
        2 => (cap as u32).saturating_add(rng.below(2) as u32),
        3 => u32::MAX,
        _ => honest,
    };
    let mut out = Vec::with_capacity(4 + payload.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_is_a_function_of_the_seed() {
        let a: Vec<_> = (0..50)
            .map(|i| payload(&mut Rng::for_case(5, i), Protocol::App, None))
            .collect();
        let b: Vec<_> = (0..50)
            .map(|i| payload(&mut Rng::for_case(5, i), Protocol::App, None))
            .collect();
        assert_eq!(a, b);
    }

    #[test]
    fn parse_and_encode_round_trip_canonical_payloads() {
        let mut rng = Rng::new(1);
        for _ in 0..200 {
            let bytes = to_payload(&coordinator_to_worker(&mut rng)).unwrap();
            let v = parse(&bytes).unwrap();
            let mut out = Vec::new();
            encode(&v, &mut rng, false, &mut out);
            assert_eq!(out, bytes);
        }
    }
}
