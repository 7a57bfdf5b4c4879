//! A coordinator restart re-books what its nodes report running exactly as it was booked
//! (issues 12 and 14): a restart is a fresh guarantor with the stored reservations, whose nodes
//! re-join and report their GUARANTEED containers with the signed tokens they were started with
//! ([`verified_booking`] + [`Guarantor::adopt_running`]). Containers of a reservation count
//! against it again (not as plain work eating reserved capacity); shaped containers go back to
//! the shaper with their request, role and shaped size. After every step no node is
//! over-committed and the books equal the grants ([`Guarantor::check_invariants`]). Tokens a
//! worker altered are refused.

mod common;

use scheduler_core::guarantor::{
    BestFit, BookingProofError, GuaranteedPlacement, Guarantor, GuarantorConfig, verified_booking,
};
use scheduler_core::node::{ContainerStatus, Placement};
use scheduler_core::reservation::book::ReservationBook;
use scheduler_core::reservation::dra::Dra;
use scheduler_core::reservation::{
    Algorithm, Interpreter, PlanConfig, ReservationDefinition, Stage,
};
use scheduler_core::shaper::{ComponentRole, ShaperConfig, UsageForecast};
use scheduler_core::shaping::{ForecasterFactory, SeriesForecaster, ShapingConfig, ShapingState};
use scheduler_core::token::{
    ContainerToken, GuaranteedSigner, KeyRing, PublicKeyRing, TokenError, TokenKey,
};
use scheduler_core::{AppId, ContainerId, ContainerType, NodeId, Resources};

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;
const DAY0: u64 = 20_000 * 24 * HOUR;
const CORE: Resources = Resources {
    cpu_millis: 1000,
    memory_mib: 1024,
};

/// Forecasts the last observation, no variance: enough to drive the shaper deterministically.
struct Persistence;
impl SeriesForecaster for Persistence {
    fn forecast_next(&mut self, history: &[f64]) -> Option<UsageForecast> {
        history.last().map(|&v| UsageForecast {
            peak_fraction: v,
            variance: 0.0,
        })
    }
    fn min_history(&self) -> usize {
        2
    }
}
struct PersistenceFactory;
impl ForecasterFactory for PersistenceFactory {
    fn series(&self) -> Box<dyn SeriesForecaster> {
        Box::new(Persistence)
    }
    fn name(&self) -> &'static str {
        "persistence"
    }
}

fn book() -> ReservationBook {
    ReservationBook::new(
        PlanConfig {
            step_ms: MIN,
            horizon_ms: 24 * HOUR,
            algorithm: Algorithm::LowCost,
            allocate_left: false,
            smoothness: 10,
        },
        Dra::default(),
    )
    .unwrap()
}

/// Four cores for the first two hours of every day.
fn nightly() -> ReservationDefinition {
    ReservationDefinition {
        arrival_ms: 0,
        deadline_ms: 120 * MIN,
        interpreter: Interpreter::All,
        stages: vec![Stage {
            containers: 4,
            gang: 4,
            duration_ms: 120 * MIN,
            size: CORE,
        }],
        recurrence_ms: Some(24 * HOUR),
        alignment_penalty: 0.0,
    }
}

fn shaping() -> ShapingState {
    ShapingState::new(
        ShapingConfig {
            buffer: ShaperConfig { k1: 0.1, k2: 0.0 },
            ..ShapingConfig::default()
        },
        Box::new(PersistenceFactory),
    )
}

/// Container ids resume after `last_seq` (the coordinator stores how far it minted).
fn guarantor(book: ReservationBook, last_seq: u64) -> Guarantor {
    Guarantor::new(GuarantorConfig::default(), Box::new(BestFit), last_seq)
        .with_reservations(book)
        .with_shaping(shaping())
}

const NODES: [&str; 2] = ["n1", "n2"];

fn join_all(g: &mut Guarantor, epoch: u32) {
    for n in NODES {
        g.join_node(NodeId::from(n), "r".into(), CORE.scale(4), epoch, None);
    }
}

fn signer() -> GuaranteedSigner {
    GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [7; 32]))).unwrap()
}

/// What a node reports at its join: the container as it runs now (its shaped size) with the
/// token it was started with.
fn status(g: &Guarantor, token: &ContainerToken) -> ContainerStatus {
    let id = token.body.container_id;
    ContainerStatus {
        id,
        app_id: token.body.app_id.clone(),
        container_type: ContainerType::Guaranteed,
        resources: g.grant_resources(id).unwrap(),
        placement: Placement::Running,
        version: 0,
        job: None,
        usage: None,
        grant_token: Some(token.clone()),
    }
}

struct Before {
    g: Guarantor,
    now: u64,
    tokens: Vec<ContainerToken>,
    reserved: Vec<ContainerId>,
    shaped: ContainerId,
    plain: ContainerId,
}

/// Two containers of reservation "nightly", one shapeable elastic container shaped down to its
/// use, one plain container; all started.
fn before_restart() -> Before {
    let mut g = guarantor(book(), 0);
    join_all(&mut g, 1);
    let now = DAY0 + 10 * MIN;
    g.reserve(now, "nightly", AppId::from("owner"), nightly())
        .unwrap();
    let mut reserved_ask = common::guaranteed_ask(1, CORE, 2);
    reserved_ask.app_id = AppId::from("owner");
    g.submit_reserved(reserved_ask, "nightly").unwrap();
    let mut shapeable = common::guaranteed_ask(2, CORE.scale(2), 1);
    shapeable.role = ComponentRole::Elastic;
    shapeable.allow_shaping = true;
    g.submit(shapeable).unwrap();
    g.submit(common::guaranteed_ask(3, CORE, 1)).unwrap();
    let placements: Vec<GuaranteedPlacement> = g.schedule(now);
    assert_eq!(placements.len(), 4, "{placements:?}");
    let signer = signer();
    let tokens: Vec<ContainerToken> = placements
        .iter()
        .map(|p| signer.sign(p.token_body.clone()).unwrap())
        .collect();
    let by_key = |k: u64| -> Vec<ContainerId> {
        placements
            .iter()
            .filter(|p| p.ask_key == k)
            .map(|p| p.token_body.container_id)
            .collect()
    };
    let (reserved, shaped, plain) = (by_key(1), by_key(2)[0], by_key(3)[0]);
    for t in &tokens {
        g.on_started(t.body.container_id);
    }
    // The shapeable container uses a quarter of its request: the shaper shrinks it.
    let mut t = now;
    for _ in 0..3 {
        t += MIN;
        g.observe_usage(shaped, Resources::new(500, 512));
        g.shape(t);
    }
    let shaped_size = g.grant_resources(shaped).unwrap();
    assert!(
        shaped_size.fits_in(&CORE.scale(2)) && shaped_size != CORE.scale(2),
        "shaped to {shaped_size}"
    );
    g.check_invariants().unwrap();
    assert_eq!(g.reservations().used("nightly"), CORE.scale(2));
    Before {
        g,
        now: t,
        tokens,
        reserved,
        shaped,
        plain,
    }
}

/// A fresh guarantor over the stored reservations, its nodes re-joined reporting `statuses`,
/// each adopted with what its token proves.
fn restart(before: &Before, statuses: &[(NodeId, ContainerStatus)]) -> Guarantor {
    let stored = before.g.reservations().stored();
    let mut g = guarantor(
        ReservationBook::restore(stored, Dra::default()).unwrap(),
        before.g.last_seq(),
    );
    join_all(&mut g, 2);
    let keys: PublicKeyRing = signer().public_ring();
    g.shaping_due(before.now);
    for (node, s) in statuses {
        let booking = verified_booking(&keys, node, s).unwrap();
        g.adopt_running(node, s, booking.as_ref()).unwrap();
        g.check_invariants().unwrap();
    }
    g
}

fn reports(before: &Before) -> Vec<(NodeId, ContainerStatus)> {
    before
        .tokens
        .iter()
        .map(|t| (t.body.node_id.clone(), status(&before.g, t)))
        .collect()
}

#[test]
fn a_restart_books_reserved_shaped_and_plain_containers_as_they_were() {
    let before = before_restart();
    let after = restart(&before, &reports(&before));

    // The reservation holds exactly its containers again, plain work exactly the rest.
    assert_eq!(
        after.reservations().used("nightly"),
        before.g.reservations().used("nightly")
    );
    assert_eq!(
        after.reservations().plain_used(),
        before.g.reservations().plain_used()
    );
    for id in &before.reserved {
        assert_eq!(after.grant_reservation(*id), Some("nightly"));
    }
    assert_eq!(after.grant_reservation(before.plain), None);
    // Every node books what it did.
    for n in NODES {
        let id = NodeId::from(n);
        assert_eq!(
            after.node(&id).unwrap().guaranteed,
            before.g.node(&id).unwrap().guaranteed,
            "{n}"
        );
    }
    // The shaped container is shaped again at its shaped size, nothing else is.
    let shaping = after.shaping().unwrap();
    assert_eq!(
        shaping.allocations(),
        vec![(
            before.shaped,
            before.g.grant_resources(before.shaped).unwrap()
        )]
    );
    after.check_invariants().unwrap();
}

#[test]
fn a_readopted_reservation_container_counts_against_its_allocation() {
    let before = before_restart();
    let mut after = restart(&before, &reports(&before));
    // The reservation allocates four cores now and two of them run: two more are granted, the
    // third waits. Had the two running ones come back as plain work, four would be granted
    // (and plain work would have eaten two reserved cores).
    let mut more = common::guaranteed_ask(10, CORE, 3);
    more.app_id = AppId::from("owner");
    after.submit_reserved(more, "nightly").unwrap();
    let granted = after.schedule(before.now + MIN);
    assert_eq!(granted.len(), 2, "{granted:?}");
    assert_eq!(after.pending_containers(), 1);
    assert_eq!(after.reservations().used("nightly"), CORE.scale(4));
    after.check_invariants().unwrap();
}

#[test]
fn a_readopted_shaped_container_grows_back_up_to_its_request_not_beyond() {
    let before = before_restart();
    let mut after = restart(&before, &reports(&before));
    let shaped_size = after.grant_resources(before.shaped).unwrap();
    // Its use rises to three quarters of its request: the shaper grows it back to that + β
    // (it knows the request from the token), not above the request.
    let mut t = before.now;
    for _ in 0..3 {
        t += MIN;
        after.observe_usage(before.shaped, Resources::new(1500, 1536));
        after.shape(t);
        after.check_invariants().unwrap();
    }
    let grown = after.grant_resources(before.shaped).unwrap();
    assert!(
        !grown.fits_in(&shaped_size) && grown.fits_in(&CORE.scale(2)),
        "shaped {shaped_size}, then {grown}"
    );
}

#[test]
fn a_report_without_tokens_is_booked_as_plain_work_and_still_never_over_commits() {
    let before = before_restart();
    let bare: Vec<(NodeId, ContainerStatus)> = reports(&before)
        .into_iter()
        .map(|(n, mut s)| {
            s.grant_token = None;
            (n, s)
        })
        .collect();
    let after = restart(&before, &bare);
    assert_eq!(after.reservations().used("nightly"), Resources::ZERO);
    assert!(after.shaping().unwrap().is_empty());
    after.check_invariants().unwrap();
}

#[test]
fn a_token_a_worker_altered_or_moved_proves_nothing() {
    let before = before_restart();
    let keys = signer().public_ring();
    let plain_token = before
        .tokens
        .iter()
        .find(|t| t.body.container_id == before.plain)
        .unwrap();
    let node = plain_token.body.node_id.clone();
    // Claiming the plain container ran inside the reservation: the signature no longer holds.
    let mut forged = status(&before.g, plain_token);
    let reserved_token = before
        .tokens
        .iter()
        .find(|t| t.body.container_id == before.reserved[0])
        .unwrap();
    forged.grant_token.as_mut().unwrap().body.booking = reserved_token.body.booking.clone();
    forged.app_id = reserved_token.body.app_id.clone();
    forged.grant_token.as_mut().unwrap().body.app_id = reserved_token.body.app_id.clone();
    assert_eq!(
        verified_booking(&keys, &node, &forged),
        Err(BookingProofError::Signature(TokenError::Forged))
    );
    // Raising the request of the shaped container: refused too.
    let shaped_token = before
        .tokens
        .iter()
        .find(|t| t.body.container_id == before.shaped)
        .unwrap();
    let mut grown = status(&before.g, shaped_token);
    grown
        .grant_token
        .as_mut()
        .unwrap()
        .body
        .booking
        .as_mut()
        .unwrap()
        .requested = CORE.scale(4);
    assert_eq!(
        verified_booking(&keys, &shaped_token.body.node_id, &grown),
        Err(BookingProofError::Signature(TokenError::Forged))
    );
    // A genuine token of another container, or reported by another node, proves nothing.
    let mut other = status(&before.g, plain_token);
    other.grant_token = Some(reserved_token.clone());
    assert!(matches!(
        verified_booking(&keys, &node, &other),
        Err(BookingProofError::OtherContainer { .. })
    ));
    let elsewhere = NodeId::from(if node.as_str() == "n1" { "n2" } else { "n1" });
    assert!(matches!(
        verified_booking(&keys, &elsewhere, &status(&before.g, plain_token)),
        Err(BookingProofError::OtherNode { .. })
    ));
    // A key the coordinator does not know.
    let stranger = GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(9, [3; 32])))
        .unwrap()
        .sign(shaped_token.body.clone())
        .unwrap();
    let mut unknown = status(&before.g, shaped_token);
    unknown.grant_token = Some(stranger);
    assert_eq!(
        verified_booking(&keys, &shaped_token.body.node_id, &unknown),
        Err(BookingProofError::Signature(TokenError::UnknownKey(9)))
    );
}

#[test]
fn a_deleted_reservation_s_container_comes_back_as_plain_work() {
    let before = before_restart();
    let mut stored_from = before_restart();
    stored_from.g.delete_reservation("nightly", None).unwrap();
    let after_book = stored_from.g.reservations().stored();
    let mut g = guarantor(
        ReservationBook::restore(after_book, Dra::default()).unwrap(),
        before.g.last_seq(),
    );
    join_all(&mut g, 2);
    let keys = signer().public_ring();
    for (node, s) in reports(&before) {
        let booking = verified_booking(&keys, &node, &s).unwrap();
        g.adopt_running(&node, &s, booking.as_ref()).unwrap();
    }
    for id in &before.reserved {
        assert_eq!(g.grant_reservation(*id), None);
    }
    g.check_invariants().unwrap();
}
