//! Reservations through a real worker joined to a real coordinator (Morpheus §4, §7): the
//! worker forwards `reserve` and an `allocate` naming the reservation, and delivers the
//! coordinator's `reservation_reprovisioned` (a DRA stretch for a job asking more than its
//! allocation) to the app's subscribed connection.

mod common;

use common::*;
use scheduler_core::protocol::app::{AppRequest, AppResponse, Reserve};
use scheduler_core::reservation::book::ReprovisionCause;
use scheduler_core::reservation::{Interpreter, ReservationDefinition, Stage};
use scheduler_core::{ContainerType, Resources};

const MIN: u64 = 60_000;

/// Send `reserve` of "etl": a daily window of ten minutes from the current minute (agenda time is
/// UTC time of day) holding `containers` of 500m / 256 MiB as one gang; the request id.
async fn reserve_etl_from_now(app: &mut AppClient, containers: u32) -> u64 {
    let minute = (wall_ms() % (24 * 60 * MIN)) / MIN;
    let end = (minute + 10).min(24 * 60);
    let id = app.new_request_id();
    app.send(&AppRequest::Reserve(Reserve {
        request_id: id,
        reservation_id: "etl".into(),
        definition: ReservationDefinition {
            arrival_ms: minute * MIN,
            deadline_ms: end * MIN,
            interpreter: Interpreter::All,
            stages: vec![Stage {
                containers,
                gang: containers,
                duration_ms: (end - minute) * MIN,
                size: Resources::new(500, 256),
            }],
            recurrence_ms: Some(24 * 60 * MIN),
            alignment_penalty: 0.0,
        },
    }))
    .await;
    id
}

#[actix_rt::test]
async fn a_late_job_is_stretched_and_its_app_is_told() {
    let c = Cluster::start(&["demo"], &[node("node-a", 4000, 4096)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let id = reserve_etl_from_now(&mut app, 2).await;
    match app.answer(id).await {
        AppResponse::Reservation(r) => assert_eq!(r.reservation_id, "etl"),
        other => panic!("reserve not accepted: {other:?}"),
    }
    // The job asks for 3: 2 at once (its allocation), the third after DRA stretches the
    // reservation on the coordinator's next tick.
    let mut ask = ask(ContainerType::Guaranteed, 500, 256);
    ask.count = 3;
    ask.reservation_id = Some("etl".into());
    let first = app.allocate(ask).await.expect("granted");
    assert_eq!((first.containers.len(), first.remaining), (2, 1));
    match app
        .wait_for("reservation_reprovisioned", |r| {
            matches!(r, AppResponse::ReservationReprovisioned(_))
        })
        .await
    {
        AppResponse::ReservationReprovisioned(e) => {
            assert_eq!(e.reservation_id, "etl");
            assert!(
                matches!(e.cause, ReprovisionCause::Stretched { extra, .. } if extra == Resources::new(500, 256)),
                "{e:?}"
            );
        }
        _ => unreachable!(),
    }
    let rest = app
        .wait_for(
            "the third grant",
            |r| matches!(r, AppResponse::Allocated(a) if a.request_id == first.request_id),
        )
        .await;
    match rest {
        AppResponse::Allocated(a) => assert_eq!((a.containers.len(), a.remaining), (1, 0)),
        _ => unreachable!(),
    }
    c.stop().await;
}

/// The worker keeps the signed token of a GUARANTEED container granted inside a reservation and
/// lists it with the container in its join statuses (issue 12), so a restarted coordinator books
/// the container against its reservation again; plain containers carry none.
#[actix_rt::test]
async fn a_reserved_container_s_token_is_listed_for_the_next_join() {
    let c = Cluster::start(&["demo"], &[node("node-a", 4000, 4096)]).await;
    let mut app = c.client("node-a").await;
    app.subscribe().await;
    let id = reserve_etl_from_now(&mut app, 1).await;
    assert!(matches!(app.answer(id).await, AppResponse::Reservation(_)));
    let mut reserved = ask(ContainerType::Guaranteed, 500, 256);
    reserved.reservation_id = Some("etl".into());
    let granted = app.allocate(reserved).await.expect("granted");
    let token = granted.containers[0].token.clone();
    let plain = app
        .allocate(ask(ContainerType::Guaranteed, 500, 256))
        .await
        .expect("granted")
        .containers[0]
        .token
        .clone();
    for t in [&token, &plain] {
        app.start(t, sh("exec sleep 30")).await.expect("started");
    }
    let statuses = c
        .worker("node-a")
        .node
        .send(worker::node_actor::Statuses)
        .await
        .unwrap();
    let of = |id| statuses.iter().find(|s| s.id == id).unwrap();
    let listed = of(token.body.container_id)
        .grant_token
        .as_ref()
        .expect("token listed");
    assert_eq!(listed, &token);
    assert_eq!(
        listed
            .body
            .booking
            .as_ref()
            .unwrap()
            .reservation_id
            .as_deref(),
        Some("etl")
    );
    assert_eq!(of(plain.body.container_id).grant_token, None);
    c.stop().await;
}
