//! Reservations through the coordinator (Morpheus §4, §6, §7) over real QUIC, with a
//! hand-written worker client and a manual clock: a reservation request is accepted with its
//! allocation or refused naming the bad field; GUARANTEED asks naming it are granted up to its
//! allocation once its window opens (a periodic tick), plain GUARANTEED asks never take it; DRA
//! stretches a late job and the owner is told; delete answers the asks still waiting.

mod common;

use common::*;
use coordinator::coordinator_actor::Tick;
use coordinator::guarantor_actor::InspectGuarantor;
use scheduler_core::node::ContainerStatus;
use scheduler_core::protocol::app::{Allocate, ErrorCode};
use scheduler_core::protocol::cluster::{
    AllocateGuaranteed, CoordinatorToWorker, ReservationCall, ReservationNoticeKind, ReservationOp,
    ReservationReply, WorkerToCoordinator,
};
use scheduler_core::reservation::book::ReprovisionCause;
use scheduler_core::reservation::{Interpreter, ReservationDefinition, Stage};
use scheduler_core::{ContainerType, Resources};
use std::time::Duration;

const MIN: u64 = 60_000;
const DAY: u64 = 24 * 60 * MIN;
const CORE: Resources = Resources {
    cpu_millis: 1000,
    memory_mib: 1024,
};

/// `n` one-core containers in one gang for exactly `[from_min, to_min)` of every day.
fn daily(n: u32, from_min: u64, to_min: u64) -> ReservationDefinition {
    ReservationDefinition {
        arrival_ms: from_min * MIN,
        deadline_ms: to_min * MIN,
        interpreter: Interpreter::All,
        stages: vec![Stage {
            containers: n,
            gang: n,
            duration_ms: (to_min - from_min) * MIN,
            size: CORE,
        }],
        recurrence_ms: Some(DAY),
        alignment_penalty: 0.0,
    }
}

fn call(correlation_id: u64, op: ReservationOp) -> WorkerToCoordinator {
    WorkerToCoordinator::Reservation(ReservationCall {
        correlation_id,
        app_id: "demo".into(),
        op,
    })
}

fn ask(correlation_id: u64, count: u32, reservation_id: Option<&str>) -> WorkerToCoordinator {
    WorkerToCoordinator::AllocateGuaranteed(AllocateGuaranteed {
        correlation_id,
        app_id: "demo".into(),
        allocate: Allocate {
            request_id: correlation_id,
            resources: CORE,
            count,
            priority: 0,
            container_type: ContainerType::Guaranteed,
            locality: None,
            // An hour: plain work that would run into the window is kept out of it.
            runtime_estimate_ms: Some(60 * MIN),
            job_id: "job-1".into(),
            job_submit_time_ms: 1_600_000_000_000,
            reservation_id: reservation_id.map(str::to_string),
            role: Default::default(),
            allow_shaping: false,
            job: None,
            replaces_shed: Vec::new(),
        },
    })
}

fn answer_to(corr: u64) -> impl Fn(&CoordinatorToWorker) -> bool {
    move |m| match m {
        CoordinatorToWorker::ReservationDone(d) => d.correlation_id == corr,
        CoordinatorToWorker::RequestFailed(f) => f.correlation_id == corr,
        CoordinatorToWorker::GuaranteedAllocated(g) => g.correlation_id == corr,
        _ => false,
    }
}

#[actix_rt::test]
async fn reserved_asks_are_granted_inside_the_window_and_the_owner_is_told() {
    let h = Harness::start_with(|s| s.node_timeout = Duration::from_secs(48 * 3600)).await;
    let (mut w, _) = h.join("n1", 8000, 8192).await;
    let now_min = (h.clock.now().as_millis() % DAY) / MIN;
    assert!(
        now_min + 30 < 1440,
        "the test's clock starts late enough in the day"
    );
    let (from, to) = (now_min + 10, now_min + 20);

    // A bad definition is refused naming the field.
    let mut bad = daily(4, from, to);
    bad.stages[0].gang = 0;
    w.send(&call(
        1,
        ReservationOp::Reserve {
            reservation_id: "etl".into(),
            definition: bad,
        },
    ))
    .await;
    match w.expect("refusal", answer_to(1)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::InvalidRequest);
            assert!(
                f.message.contains("definition.stages[0].gang"),
                "{}",
                f.message
            );
        }
        other => panic!("{other:?}"),
    }

    // Accepted with its allocation.
    w.send(&call(
        2,
        ReservationOp::Reserve {
            reservation_id: "etl".into(),
            definition: daily(4, from, to),
        },
    ))
    .await;
    match w.expect("acceptance", answer_to(2)).await {
        CoordinatorToWorker::ReservationDone(d) => match d.reply {
            ReservationReply::Accepted {
                reservation_id,
                allocation,
            } => {
                assert_eq!(reservation_id, "etl");
                assert_eq!(allocation.len(), 1);
                assert_eq!(
                    (allocation[0].start_ms, allocation[0].end_ms),
                    (from * MIN, to * MIN)
                );
                assert_eq!(allocation[0].cpu_millis, 4000);
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }

    // The job asks before its window: it waits. Plain work gets only what the reservation
    // does not hold over its runtime.
    w.send(&ask(10, 6, Some("etl"))).await;
    w.send(&ask(11, 6, None)).await;
    match w.expect("plain grants", answer_to(11)).await {
        CoordinatorToWorker::GuaranteedAllocated(g) => {
            assert_eq!((g.containers.len(), g.remaining), (4, 2));
        }
        other => panic!("{other:?}"),
    }

    // The window opens: the job asks for 6 with 4 allocated, so DRA (§7) stretches it by 2 and
    // the owner is told; the node has room for 4 of them.
    h.clock.advance(Duration::from_millis(10 * MIN));
    h.server.coordinator.send(Tick).await.unwrap();
    match w.expect("reserved grants", answer_to(10)).await {
        CoordinatorToWorker::GuaranteedAllocated(g) => {
            assert_eq!((g.containers.len(), g.remaining), (4, 2));
        }
        other => panic!("{other:?}"),
    }
    match w
        .expect("reprovisioned", |m| {
            matches!(m, CoordinatorToWorker::ReservationNotice(_))
        })
        .await
    {
        CoordinatorToWorker::ReservationNotice(n) => {
            assert_eq!(n.app_id, "demo");
            match n.event {
                ReservationNoticeKind::Reprovisioned(e) => {
                    assert_eq!(e.reservation_id, "etl");
                    assert!(matches!(
                        e.cause,
                        ReprovisionCause::Stretched { extra, .. } if extra == CORE.scale(2)
                    ));
                }
                other => panic!("{other:?}"),
            }
        }
        _ => unreachable!(),
    }

    // The owner lists it.
    w.send(&call(3, ReservationOp::List)).await;
    match w.expect("list", answer_to(3)).await {
        CoordinatorToWorker::ReservationDone(d) => match d.reply {
            ReservationReply::Listed { reservations, .. } => {
                assert_eq!(reservations.len(), 1);
                assert_eq!(reservations[0].reservation_id, "etl");
                assert_eq!(reservations[0].allocated_now, CORE.scale(6));
                assert_eq!(reservations[0].used, CORE.scale(4));
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(stats.invariants, Ok(()));

    // Deleting answers the job's waiting ask; a second delete finds nothing.
    w.send(&call(
        4,
        ReservationOp::Delete {
            reservation_id: "etl".into(),
        },
    ))
    .await;
    match w.expect("deleted", answer_to(4)).await {
        CoordinatorToWorker::ReservationDone(d) => {
            assert_eq!(d.reply, ReservationReply::Deleted)
        }
        other => panic!("{other:?}"),
    }
    match w.expect("waiting ask answered", answer_to(10)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::ReservationRejected);
            assert!(f.message.contains("deleted"), "{}", f.message);
        }
        other => panic!("{other:?}"),
    }
    w.send(&call(
        5,
        ReservationOp::Delete {
            reservation_id: "etl".into(),
        },
    ))
    .await;
    match w.expect("unknown", answer_to(5)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::UnknownReservation)
        }
        other => panic!("{other:?}"),
    }
    // An ask naming an unknown reservation is refused at once.
    w.send(&ask(12, 1, Some("etl"))).await;
    match w.expect("unknown reservation", answer_to(12)).await {
        CoordinatorToWorker::RequestFailed(f) => {
            assert_eq!(f.code, ErrorCode::UnknownReservation)
        }
        other => panic!("{other:?}"),
    }
    let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
    assert_eq!(stats.invariants, Ok(()));
}

/// One coordinator run on `dir` from the manual clock's start moved forward `at_min` minutes: the
/// worker joins, then `act` runs. The store lock is released when the system ends.
async fn run_phase<F, Fut>(dir: tempfile::TempDir, at_min: u64, act: F) -> tempfile::TempDir
where
    F: FnOnce(Harness, TestWorker) -> Fut,
    Fut: std::future::Future<Output = Harness>,
{
    let h = Harness::start_in_with(dir, |s| s.node_timeout = Duration::from_secs(48 * 3600)).await;
    h.clock.advance(Duration::from_millis(at_min * MIN));
    let (w, _) = h.join("n1", 8000, 8192).await;
    let h = act(h, w).await;
    h.server.shutdown();
    h.dir
}

/// Reservations survive a coordinator restart in the middle of their window: the job's asks are
/// granted up to the allocation by the restarted coordinator, and `coordinator check` verifies
/// the stored record (a damaged one is reported, not loaded).
#[test]
fn reservations_survive_a_restart_mid_period() {
    let dir = initialised_data_dir();
    let start_min = (1_700_000_000_000u64 % DAY) / MIN;
    let (from, to) = (start_min + 10, start_min + 30);
    let dir = actix_rt::System::new().block_on(run_phase(dir, 0, |h, mut w| async move {
        w.send(&call(
            1,
            ReservationOp::Reserve {
                reservation_id: "etl".into(),
                definition: daily(4, from, to),
            },
        ))
        .await;
        assert!(matches!(
            w.expect("acceptance", answer_to(1)).await,
            CoordinatorToWorker::ReservationDone(_)
        ));
        h
    }));

    // `coordinator check`'s inspection reads the record and finds it sound.
    let store = coordinator::datadir::DataDir::new(dir.path()).store();
    let inspection = coordinator::store::Store::inspect(&store).unwrap();
    let record = inspection
        .records
        .iter()
        .find(|r| r.key == "reservations")
        .expect("the reservations record is stored");
    assert_eq!(record.problem, None);

    // Restarted 15 minutes later, in the middle of the window.
    let dir = actix_rt::System::new().block_on(run_phase(dir, 15, |h, mut w| async move {
        w.send(&call(2, ReservationOp::List)).await;
        match w.expect("list", answer_to(2)).await {
            CoordinatorToWorker::ReservationDone(d) => match d.reply {
                ReservationReply::Listed { reservations, .. } => {
                    assert_eq!(reservations.len(), 1);
                    assert_eq!(reservations[0].definition, daily(4, from, to));
                    assert_eq!(reservations[0].allocated_now, CORE.scale(4));
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        w.send(&ask(3, 4, Some("etl"))).await;
        match w.expect("reserved grants", answer_to(3)).await {
            CoordinatorToWorker::GuaranteedAllocated(g) => {
                assert_eq!((g.containers.len(), g.remaining), (4, 0))
            }
            other => panic!("{other:?}"),
        }
        let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
        assert_eq!(stats.invariants, Ok(()));
        h
    }));

    // A damaged record (an owner whose reservation the plan does not hold) is reported.
    {
        let s = coordinator::store::Store::open(&store).unwrap();
        let mut stored = s.reservations().unwrap().unwrap().stored();
        stored
            .owners
            .insert("ghost".into(), scheduler_core::AppId::from("demo"));
        s.set_reservations(&stored).unwrap();
    }
    let inspection = coordinator::store::Store::inspect(&store).unwrap();
    let record = inspection
        .records
        .iter()
        .find(|r| r.key == "reservations")
        .unwrap();
    assert!(
        record
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("ghost")),
        "{record:?}"
    );
    drop(dir);
}

/// The operator's agenda (`GET /reservations` on the metrics listener) lists every app's
/// reservations and the plan's free capacity, republished at the next tick after a change.
#[actix_rt::test]
async fn operator_agenda_lists_reservations_and_free_capacity() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let h = Harness::start_with(|s| {
        s.node_timeout = Duration::from_secs(48 * 3600);
        s.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let addr = h.server.metrics_addr.expect("metrics are listening");
    let (mut w, _) = h.join("n1", 8000, 8192).await;
    let now_min = (h.clock.now().as_millis() % DAY) / MIN;
    assert!(now_min + 30 < 1440, "the test's clock starts early enough");
    let (from, to) = (now_min + 10, now_min + 20);
    w.send(&call(
        1,
        ReservationOp::Reserve {
            reservation_id: "etl".into(),
            definition: daily(4, from, to),
        },
    ))
    .await;
    w.expect("acceptance", answer_to(1)).await;
    h.server.coordinator.send(Tick).await.unwrap();
    h.server.guarantor.send(InspectGuarantor).await.unwrap();

    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /reservations HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    let view: coordinator::metrics::AgendaView = serde_json::from_str(body).unwrap();
    assert_eq!(view.reservations.len(), 1);
    assert_eq!(view.reservations[0].id, "etl");
    assert_eq!(view.reservations[0].owner.as_str(), "demo");
    assert_eq!(view.plan_capacity.cpu_millis, 8000);
    // Free: 8 cores outside the window, 4 inside it.
    let at = |min: u64| {
        view.free
            .iter()
            .find(|f| f.start_ms <= min * MIN && min * MIN < f.end_ms)
            .map(|f| f.cpu_millis)
    };
    assert_eq!(at(from), Some(4000));
    assert_eq!(at(to), Some(8000));
    assert_eq!(view.agenda_now_ms / MIN, now_min);
}

/// Issue 12: GUARANTEED containers running inside a reservation when the coordinator restarts
/// count against that reservation again once their node re-joins reporting them with their
/// signed tokens: the reservation's use is what runs, and the owner's next asks get only what is
/// left of its allocation (as plain work, they would have eaten reserved capacity and the owner
/// would have been granted the whole allocation again).
#[test]
fn containers_running_in_a_reservation_count_against_it_after_a_restart() {
    let dir = initialised_data_dir();
    let start_min = (1_700_000_000_000u64 % DAY) / MIN;
    let (from, to) = (start_min + 10, start_min + 30);
    let granted = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let keep = granted.clone();
    let dir = actix_rt::System::new().block_on(run_phase(dir, 15, |h, mut w| async move {
        w.send(&call(
            1,
            ReservationOp::Reserve {
                reservation_id: "etl".into(),
                definition: daily(4, from, to),
            },
        ))
        .await;
        assert!(matches!(
            w.expect("acceptance", answer_to(1)).await,
            CoordinatorToWorker::ReservationDone(_)
        ));
        w.send(&ask(2, 2, Some("etl"))).await;
        match w.expect("reserved grants", answer_to(2)).await {
            CoordinatorToWorker::GuaranteedAllocated(g) => {
                assert_eq!(g.containers.len(), 2);
                keep.borrow_mut().extend(g.containers);
            }
            other => panic!("{other:?}"),
        }
        h
    }));
    let running: Vec<ContainerStatus> = granted
        .borrow()
        .iter()
        .map(|g| {
            let mut s = running(g.container_id, ContainerType::Guaranteed, 1000, 1024);
            s.grant_token = Some(g.token.clone());
            s
        })
        .collect();
    assert!(running.iter().all(|s| {
        s.grant_token
            .as_ref()
            .unwrap()
            .body
            .booking
            .as_ref()
            .unwrap()
            .reservation_id
            == Some("etl".to_string())
    }));

    let _dir = actix_rt::System::new().block_on(async move {
        let h =
            Harness::start_in_with(dir, |s| s.node_timeout = Duration::from_secs(48 * 3600)).await;
        h.clock.advance(Duration::from_millis(16 * MIN));
        let mut w = h.connect().await;
        let mut join = join_msg(&h.join_token(), "n1", 8000, 8192);
        if let WorkerToCoordinator::Join(j) = &mut join {
            j.containers = running;
        }
        w.send(&join).await;
        assert!(matches!(
            w.next().await,
            Ok(CoordinatorToWorker::JoinAccepted(_))
        ));
        w.send(&call(3, ReservationOp::List)).await;
        match w.expect("list", answer_to(3)).await {
            CoordinatorToWorker::ReservationDone(d) => match d.reply {
                ReservationReply::Listed { reservations, .. } => {
                    assert_eq!(reservations[0].allocated_now, CORE.scale(4));
                    assert_eq!(reservations[0].used, CORE.scale(2), "re-booked against etl");
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        // Three more asked: two fit the allocation, one waits.
        w.send(&ask(4, 3, Some("etl"))).await;
        match w.expect("reserved grants", answer_to(4)).await {
            CoordinatorToWorker::GuaranteedAllocated(g) => {
                assert_eq!((g.containers.len(), g.remaining), (2, 1))
            }
            other => panic!("{other:?}"),
        }
        let stats = h.server.guarantor.send(InspectGuarantor).await.unwrap();
        assert_eq!(stats.invariants, Ok(()));
        h.server.shutdown();
        h.dir
    });
}
