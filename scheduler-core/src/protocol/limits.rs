//! Size bounds on everything an application sends, checked in one place (sans-IO).
//!
//! Every field of an application request that the cluster stores, signs, forwards or reports
//! has a bound here, so no application can make a worker's heartbeat (every container's status,
//! job id included) outgrow the cluster frame, or make any per-request work or memory
//! unbounded. [`validate_request`] checks a decoded [`AppRequest`] and names the first field
//! over its bound in an `invalid_request` [`ErrorFrame`] (docs/protocol.md §10 lists them;
//! `tests/protocol_doc.rs` checks that list against these constants).
//!
//! The frame cap ([`crate::codec::APP_MAX_FRAME`]) bounds the bytes of one request already;
//! these bounds keep what a request leaves behind (a container's status, a token) small, and
//! [`MAX_CONTAINERS_PER_NODE`] bounds how many such statuses one node reports.

use crate::protocol::app::{AppRequest, ErrorCode, ErrorFrame, LaunchSpec, Locality};
use crate::token::ContainerToken;

/// Largest payload of a frame before the hello is accepted (a hello is a few dozen bytes).
pub const HELLO_MAX_FRAME: usize = 4096;
/// `hello.app_id` (registered app ids are at most 128 bytes, `coordinator app add`).
pub const MAX_APP_ID_BYTES: usize = 128;
/// `hello.app_secret`.
pub const MAX_APP_SECRET_BYTES: usize = 256;
/// `hello.client_name`.
pub const MAX_CLIENT_NAME_BYTES: usize = 256;
/// `allocate.job_id` (it is signed into every token and reported in every heartbeat).
pub const MAX_JOB_ID_BYTES: usize = 256;
/// Each name in `allocate.locality.nodes` / `.racks` (node ids are at most 253 bytes).
pub const MAX_LOCALITY_NAME_BYTES: usize = 253;
/// Entries of `allocate.locality.nodes`, and of `.racks`.
pub const MAX_LOCALITY_NAMES: usize = 1024;
/// `allocate.runtime_estimate_ms`: 30 days. A larger claim would only inflate the node's
/// queue-delay estimate for every other application.
pub const MAX_RUNTIME_ESTIMATE_MS: u64 = 30 * 24 * 60 * 60 * 1000;
/// `launch.command` and `launch.working_dir` (Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 4096;
/// Entries of `launch.args`.
pub const MAX_ARGS: usize = 4096;
/// Entries of `launch.env`.
pub const MAX_ENV_VARS: usize = 1024;
/// Each name in `launch.env`.
pub const MAX_ENV_NAME_BYTES: usize = 256;
/// `launch` as a whole: command, args, env names and values, working dir, summed.
pub const MAX_LAUNCH_BYTES: usize = 256 * 1024;
/// `token.signature` (hex: 64 bytes for an HMAC-SHA256, 128 for an Ed25519 signature).
pub const MAX_SIGNATURE_BYTES: usize = 128;
/// Containers one node holds at once (running, queued and waiting GUARANTEED, together): with
/// the bounds above, a heartbeat listing all of them fits the cluster frame
/// ([`crate::codec::CLUSTER_MAX_FRAME`]; checked by `worst_case_heartbeat_fits_the_cluster_frame`).
pub const MAX_CONTAINERS_PER_NODE: usize = 16_384;
/// Statuses of a `join` that carry their container's signed token (GUARANTEED containers booked
/// in a reservation or for shaping, so a restarted coordinator books them exactly again): with
/// the rest of a full node's statuses the join still fits the cluster frame (checked by
/// `worst_case_heartbeat_fits_the_cluster_frame`). Containers beyond it are re-booked as plain
/// GUARANTEED work.
pub const MAX_GRANT_TOKENS_PER_JOIN: usize = 4096;
/// Attributes a node may carry (`worker run --attribute k=v`, 3Sigma's equivalence sets), and
/// the length of each key and value.
pub const MAX_NODE_ATTRIBUTES: usize = 64;
pub const MAX_NODE_ATTRIBUTE_BYTES: usize = 128;

/// A join's node attributes within their limits; the error names the offending attribute.
pub fn check_node_attributes(
    attributes: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    if attributes.len() > MAX_NODE_ATTRIBUTES {
        return Err(format!(
            "attributes: {} given, at most {MAX_NODE_ATTRIBUTES}",
            attributes.len()
        ));
    }
    for (key, value) in attributes {
        if key.is_empty() || key.len() > MAX_NODE_ATTRIBUTE_BYTES {
            return Err(format!(
                "attributes: key {:?} must be 1 to {MAX_NODE_ATTRIBUTE_BYTES} bytes",
                key.chars().take(32).collect::<String>()
            ));
        }
        if value.len() > MAX_NODE_ATTRIBUTE_BYTES {
            return Err(format!(
                "attributes: value of {key:?} is {} bytes, at most {MAX_NODE_ATTRIBUTE_BYTES}",
                value.len()
            ));
        }
    }
    Ok(())
}

/// `reservation_id` (in `reserve`, `update_reservation`, `delete_reservation`, `allocate`).
pub const MAX_RESERVATION_ID_BYTES: usize = crate::reservation::book::MAX_RESERVATION_ID_LEN;
/// `definition.stages` of a reservation request.
pub const MAX_RESERVATION_STAGES: usize = 32;
/// Reservations one app holds at once (a `reservations` answer lists them all in one frame).
pub const MAX_RESERVATIONS_PER_APP: usize = 64;

/// GUARANTEED asks of one app waiting for capacity at the coordinator through one worker;
/// more are `quota_exceeded` (each waiting ask is state at the worker and the guarantor).
pub const MAX_WAITING_GUARANTEED_ASKS_PER_APP: usize = 1024;

fn refuse(request_id: Option<u64>, message: String) -> Result<(), ErrorFrame> {
    Err(ErrorFrame::new(
        request_id,
        ErrorCode::InvalidRequest,
        message,
    ))
}

/// `field` is at most `limit` bytes.
fn check_len(
    request_id: Option<u64>,
    field: &str,
    value: &str,
    limit: usize,
) -> Result<(), ErrorFrame> {
    if value.len() > limit {
        return refuse(
            request_id,
            format!(
                "`{field}` is {} bytes; the limit is {limit} bytes",
                value.len()
            ),
        );
    }
    Ok(())
}

/// `field` has at most `limit` entries.
fn check_count(
    request_id: Option<u64>,
    field: &str,
    len: usize,
    limit: usize,
) -> Result<(), ErrorFrame> {
    if len > limit {
        return refuse(
            request_id,
            format!("`{field}` has {len} entries; the limit is {limit}"),
        );
    }
    Ok(())
}

/// Strings handed to `execve` cannot hold a NUL byte.
fn check_no_nul(request_id: Option<u64>, field: &str, value: &str) -> Result<(), ErrorFrame> {
    if value.contains('\0') {
        return refuse(request_id, format!("`{field}` contains a NUL byte"));
    }
    Ok(())
}

/// Check a decoded request against every bound of this module. `Err` is the `invalid_request`
/// frame to answer with (same `request_id`), naming the first field over its bound.
pub fn validate_request(request: &AppRequest) -> Result<(), ErrorFrame> {
    let id = request.request_id();
    match request {
        AppRequest::Hello(h) => {
            check_len(id, "app_id", &h.app_id, MAX_APP_ID_BYTES)?;
            check_len(id, "app_secret", &h.app_secret, MAX_APP_SECRET_BYTES)?;
            if let Some(name) = &h.client_name {
                check_len(id, "client_name", name, MAX_CLIENT_NAME_BYTES)?;
            }
            Ok(())
        }
        AppRequest::Allocate(a) => {
            use crate::protocol::app::MAX_CONTAINERS_PER_ALLOCATE;
            if a.count > MAX_CONTAINERS_PER_ALLOCATE {
                return refuse(
                    id,
                    format!(
                        "`count` {} is above the limit of {MAX_CONTAINERS_PER_ALLOCATE} containers per allocate (its answer must fit one frame); split the ask",
                        a.count
                    ),
                );
            }
            check_len(id, "job_id", &a.job_id, MAX_JOB_ID_BYTES)?;
            if let Some(ms) = a.runtime_estimate_ms
                && ms > MAX_RUNTIME_ESTIMATE_MS
            {
                return refuse(
                    id,
                    format!(
                        "`runtime_estimate_ms` is {ms}; the limit is {MAX_RUNTIME_ESTIMATE_MS} (30 days)"
                    ),
                );
            }
            if let Some(locality) = &a.locality {
                check_locality(id, locality)?;
            }
            if let Some(r) = &a.reservation_id {
                if a.container_type != crate::ContainerType::Guaranteed {
                    return refuse(
                        id,
                        "`reservation_id`: only GUARANTEED asks run inside a reservation".into(),
                    );
                }
                check_reservation_id(id, r)?;
            }
            if let Some(job) = &a.job {
                if a.container_type != crate::ContainerType::Guaranteed {
                    return refuse(
                        id,
                        "`job`: only GUARANTEED asks carry a job description".into(),
                    );
                }
                if a.reservation_id.is_some() {
                    return refuse(
                        id,
                        "`job`: an ask inside a reservation is not planned by 3Sigma; send one or the other".into(),
                    );
                }
                if let Err(m) = job.description("", a.resources, a.count.max(1), 0) {
                    return refuse(id, format!("`{m}`"));
                }
            }
            if !a.replaces_shed.is_empty() {
                if a.container_type != crate::ContainerType::Queueable {
                    return refuse(
                        id,
                        "`replaces_shed`: only QUEUEABLE asks are placed by the worker's scheduler, which avoids the shedding nodes".into(),
                    );
                }
                // An ask replaces at most the containers it asks for (so at most
                // MAX_CONTAINERS_PER_ALLOCATE entries).
                check_count(id, "replaces_shed", a.replaces_shed.len(), a.count as usize)?;
                for shed in &a.replaces_shed {
                    check_len(
                        id,
                        "replaces_shed.node_id",
                        shed.node_id.as_str(),
                        MAX_LOCALITY_NAME_BYTES,
                    )?;
                }
            }
            Ok(())
        }
        AppRequest::Reserve(crate::protocol::app::Reserve {
            reservation_id,
            definition,
            ..
        })
        | AppRequest::UpdateReservation(crate::protocol::app::UpdateReservation {
            reservation_id,
            definition,
            ..
        }) => {
            check_reservation_id(id, reservation_id)?;
            check_count(
                id,
                "definition.stages",
                definition.stages.len(),
                MAX_RESERVATION_STAGES,
            )
        }
        AppRequest::DeleteReservation(d) => check_reservation_id(id, &d.reservation_id),
        AppRequest::ListReservations(_) => Ok(()),
        AppRequest::Explain(e) => check_len(id, "job_id", &e.job_id, MAX_JOB_ID_BYTES),
        AppRequest::StartContainer(s) => {
            check_token(id, &s.token)?;
            check_launch(id, &s.launch)
        }
        AppRequest::Release(_)
        | AppRequest::Promote(_)
        | AppRequest::StopContainer(_)
        | AppRequest::Subscribe(_) => Ok(()),
    }
}

/// A reservation id: bounded, and of the characters the guarantor accepts.
fn check_reservation_id(id: Option<u64>, reservation_id: &str) -> Result<(), ErrorFrame> {
    check_len(
        id,
        "reservation_id",
        reservation_id,
        MAX_RESERVATION_ID_BYTES,
    )?;
    crate::reservation::book::validate_reservation_id(reservation_id)
        .map_err(|e| ErrorFrame::new(id, ErrorCode::InvalidRequest, e.to_string()))
}

fn check_locality(id: Option<u64>, locality: &Locality) -> Result<(), ErrorFrame> {
    for (field, names) in [
        ("locality.nodes", &locality.nodes),
        ("locality.racks", &locality.racks),
    ] {
        check_count(id, field, names.len(), MAX_LOCALITY_NAMES)?;
        for name in names {
            check_len(id, &format!("{field}[]"), name, MAX_LOCALITY_NAME_BYTES)?;
        }
    }
    Ok(())
}

/// A token the cluster signed is within these bounds; anything larger is forged and refused
/// before the signature is even computed.
fn check_token(id: Option<u64>, token: &ContainerToken) -> Result<(), ErrorFrame> {
    check_len(
        id,
        "token.body.app_id",
        token.body.app_id.as_str(),
        MAX_APP_ID_BYTES,
    )?;
    check_len(
        id,
        "token.body.job_id",
        token.body.job_id.as_str(),
        MAX_JOB_ID_BYTES,
    )?;
    check_len(
        id,
        "token.body.node_id",
        token.body.node_id.as_str(),
        MAX_LOCALITY_NAME_BYTES,
    )?;
    if let Some(reservation_id) = token
        .body
        .booking
        .as_ref()
        .and_then(|b| b.reservation_id.as_deref())
    {
        check_len(
            id,
            "token.body.booking.reservation_id",
            reservation_id,
            MAX_RESERVATION_ID_BYTES,
        )?;
    }
    check_len(id, "token.signature", &token.signature, MAX_SIGNATURE_BYTES)
}

fn check_launch(id: Option<u64>, launch: &LaunchSpec) -> Result<(), ErrorFrame> {
    check_len(id, "launch.command", &launch.command, MAX_PATH_BYTES)?;
    check_no_nul(id, "launch.command", &launch.command)?;
    let mut total = launch.command.len();
    if let Some(dir) = &launch.working_dir {
        check_len(id, "launch.working_dir", dir, MAX_PATH_BYTES)?;
        check_no_nul(id, "launch.working_dir", dir)?;
        total += dir.len();
    }
    check_count(id, "launch.args", launch.args.len(), MAX_ARGS)?;
    for arg in &launch.args {
        check_no_nul(id, "launch.args[]", arg)?;
        total += arg.len();
    }
    check_count(id, "launch.env", launch.env.len(), MAX_ENV_VARS)?;
    for (name, value) in &launch.env {
        check_len(id, "launch.env name", name, MAX_ENV_NAME_BYTES)?;
        if name.is_empty() || name.contains('=') {
            return refuse(
                id,
                format!("`launch.env` name {name:?} must be non-empty and contain no '='"),
            );
        }
        check_no_nul(id, "launch.env name", name)?;
        check_no_nul(id, "launch.env value", value)?;
        total += name.len() + value.len();
    }
    if total > MAX_LAUNCH_BYTES {
        return refuse(
            id,
            format!(
                "`launch` (command, args, env and working_dir together) is {total} bytes; the limit is {MAX_LAUNCH_BYTES} bytes"
            ),
        );
    }
    Ok(())
}

/// Whether a node holding `containers` containers (running, queued and waiting) may take one
/// more; `Err` is the message of the `quota_exceeded` answer.
pub fn check_node_room(containers: usize) -> Result<(), String> {
    if containers >= MAX_CONTAINERS_PER_NODE {
        return Err(format!(
            "this node holds {containers} containers, the most a node may hold at once \
             ({MAX_CONTAINERS_PER_NODE}); retry when some have ended"
        ));
    }
    Ok(())
}

/// Container ids a heartbeat reports as started or finished, together. Ids beyond it wait for
/// the next heartbeats (in order), so a heartbeat after a long outage with heavy churn still fits
/// the cluster frame.
pub const MAX_REPORTED_IDS_PER_HEARTBEAT: usize = 2 * MAX_CONTAINERS_PER_NODE;

/// Apps whose outstanding counts one heartbeat reports for cluster-wide quotas (in app order);
/// the coordinator also keeps at most one entry per registered app.
pub const MAX_ISSUED_APPS_PER_HEARTBEAT: usize = 1024;

/// Unreported events a [`ReportLog`] holds before it compacts (a coordinator away for long):
/// 65,536 events, 1 MiB.
pub const REPORT_LOG_COMPACT_AT: usize = 1 << 16;

/// Starts and ends of containers not yet reported to the coordinator, in the order they
/// happened; each heartbeat takes a bounded prefix ([`ReportLog::take_batch`]). A prefix never
/// reports a container's end before its start.
///
/// Bounded while the coordinator is away: at [`REPORT_LOG_COMPACT_AT`] events, a container that
/// started and ended since the last report loses both its events. Nobody learns it ran, and
/// nothing needs to: its issuer and the guarantor treat its grant as never started, and free it
/// when the token expires (conservative: capacity and quota are held a little longer, never
/// given twice). What remains are starts of running containers and ends of containers already
/// reported started, each bounded by the node's containers ([`MAX_CONTAINERS_PER_NODE`]), so
/// the log never holds more than about twice the threshold.
#[derive(Clone, Debug)]
pub struct ReportLog {
    events: std::collections::VecDeque<(bool, crate::ContainerId)>,
    /// The next compaction happens at this length (raised when one frees little, so pushes stay
    /// amortised O(1)).
    compact_at: usize,
    /// Events dropped by compactions (both events of a container that came and went).
    compacted: u64,
}

impl Default for ReportLog {
    fn default() -> Self {
        ReportLog::with_threshold(REPORT_LOG_COMPACT_AT)
    }
}

impl ReportLog {
    /// A log that compacts at `threshold` events (tests use small ones).
    pub fn with_threshold(threshold: usize) -> ReportLog {
        ReportLog {
            events: std::collections::VecDeque::new(),
            compact_at: threshold.max(2),
            compacted: 0,
        }
    }

    pub fn started(&mut self, id: crate::ContainerId) {
        self.push((true, id));
    }

    pub fn finished(&mut self, id: crate::ContainerId) {
        self.push((false, id));
    }

    fn push(&mut self, event: (bool, crate::ContainerId)) {
        self.events.push_back(event);
        if self.events.len() >= self.compact_at {
            self.compact();
        }
    }

    /// Drop both events of every container that started and ended within the log.
    fn compact(&mut self) {
        let ended: std::collections::HashSet<crate::ContainerId> = self
            .events
            .iter()
            .filter(|(is_start, _)| !is_start)
            .map(|(_, id)| *id)
            .collect();
        let came_and_went: std::collections::HashSet<crate::ContainerId> = self
            .events
            .iter()
            .filter(|(is_start, id)| *is_start && ended.contains(id))
            .map(|(_, id)| *id)
            .collect();
        let before = self.events.len();
        self.events.retain(|(_, id)| !came_and_went.contains(id));
        self.compacted += (before - self.events.len()) as u64;
        self.compact_at = self.compact_at.max(2 * self.events.len());
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Events dropped by compaction so far.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// The oldest `max` events as (started, finished) lists; the rest stay for later.
    pub fn take_batch(&mut self, max: usize) -> (Vec<crate::ContainerId>, Vec<crate::ContainerId>) {
        let n = max.min(self.events.len());
        let (mut started, mut finished) = (Vec::new(), Vec::new());
        for (is_start, id) in self.events.drain(..n) {
            if is_start {
                started.push(id);
            } else {
                finished.push(id);
            }
        }
        (started, finished)
    }

    /// Put back a batch taken by [`ReportLog::take_batch`] that was never sent (the worker's
    /// link had not written its heartbeat when a newer one replaced it): its events go first
    /// again, starts before ends, so the next batch reports them and a prefix still never
    /// reports a container's end before its start.
    pub fn give_back(
        &mut self,
        started: Vec<crate::ContainerId>,
        finished: Vec<crate::ContainerId>,
    ) {
        for id in finished.into_iter().rev() {
            self.events.push_front((false, id));
        }
        for id in started.into_iter().rev() {
            self.events.push_front((true, id));
        }
    }
}

/// Bytes of a cluster frame the coordinator buffers from a connection that has not proved it
/// holds the join token: a join is small unless it lists the containers of a re-joining
/// worker, and its `join_token` comes right after `type` and `protocol_version`.
pub const JOIN_PREFIX_BYTES: usize = 4096;

/// The `join_token` of a `join` frame whose payload starts with `prefix` (possibly cut in the
/// middle of a later field), if the token is complete within it. Lets a server check the
/// cluster secret before it accepts a large join (sans-IO; any field order is understood, but
/// the token must come within the prefix).
pub fn join_token_in_prefix(prefix: &[u8]) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};

    struct Seek<'a>(&'a mut Option<String>);
    impl<'de> DeserializeSeed<'de> for Seek<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Seek<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a join frame (a map)")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                if key == "join_token" {
                    *self.0 = Some(map.next_value::<String>()?);
                    // Stop here: the rest may not have arrived (the decoder then reports a
                    // length mismatch, which the caller ignores).
                    return Ok(());
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }

    let mut token = None;
    let mut de = rmp_serde::Deserializer::new(std::io::Cursor::new(prefix));
    de.set_max_depth(crate::codec::MAX_NESTING_DEPTH);
    let _ = Seek(&mut token).deserialize(&mut de);
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{CLUSTER_MAX_FRAME, to_payload};
    use crate::node::{ContainerJob, ContainerStatus, Placement};
    use crate::protocol::app::{Allocate, Hello, StartContainer};
    use crate::protocol::cluster::{Heartbeat, Join};
    use crate::queue_delay::QueueDelay;
    use crate::token::TokenBody;
    use crate::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources};

    fn allocate() -> Allocate {
        Allocate {
            request_id: 7,
            resources: Resources::new(100, 64),
            count: 1,
            priority: 0,
            container_type: ContainerType::Queueable,
            locality: None,
            runtime_estimate_ms: None,
            job_id: "j".into(),
            job_submit_time_ms: 0,
            reservation_id: None,
            role: Default::default(),
            allow_shaping: false,
            job: None,
            replaces_shed: Vec::new(),
        }
    }

    fn refused(req: AppRequest) -> ErrorFrame {
        let e = validate_request(&req).expect_err("refused");
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        assert_eq!(e.request_id, req.request_id());
        e
    }

    #[test]
    fn each_bound_admits_its_limit_and_refuses_one_more_naming_the_field() {
        // job_id: the 900 kB job id of issue 11 is refused, 256 bytes pass.
        let mut a = allocate();
        a.job_id = "j".repeat(MAX_JOB_ID_BYTES);
        assert!(validate_request(&AppRequest::Allocate(a.clone())).is_ok());
        a.job_id.push('j');
        let e = refused(AppRequest::Allocate(a));
        assert_eq!(e.message, "`job_id` is 257 bytes; the limit is 256 bytes");

        let mut a = allocate();
        a.count = crate::protocol::app::MAX_CONTAINERS_PER_ALLOCATE + 1;
        assert!(
            refused(AppRequest::Allocate(a))
                .message
                .contains("`count` 1001")
        );

        let mut a = allocate();
        a.runtime_estimate_ms = Some(MAX_RUNTIME_ESTIMATE_MS + 1);
        assert!(
            refused(AppRequest::Allocate(a))
                .message
                .contains("`runtime_estimate_ms`")
        );

        let mut a = allocate();
        a.locality = Some(Locality {
            nodes: vec!["n".into(); MAX_LOCALITY_NAMES + 1],
            racks: vec![],
            relax: true,
        });
        assert_eq!(
            refused(AppRequest::Allocate(a.clone())).message,
            "`locality.nodes` has 1025 entries; the limit is 1024"
        );
        a.locality = Some(Locality {
            nodes: vec![],
            racks: vec!["r".repeat(MAX_LOCALITY_NAME_BYTES + 1)],
            relax: true,
        });
        assert!(
            refused(AppRequest::Allocate(a))
                .message
                .starts_with("`locality.racks[]` is 254 bytes")
        );

        // replaces_shed: at most `count` entries, node names bounded, QUEUEABLE asks only.
        let shed = |node: String| crate::protocol::app::ShedContainer {
            container_id: ContainerId::new(3, 1),
            node_id: NodeId::new(node),
        };
        let mut a = allocate();
        a.count = 2;
        a.replaces_shed = vec![shed("n".repeat(MAX_LOCALITY_NAME_BYTES)); 2];
        assert!(validate_request(&AppRequest::Allocate(a.clone())).is_ok());
        a.replaces_shed.push(shed("n".into()));
        assert_eq!(
            refused(AppRequest::Allocate(a.clone())).message,
            "`replaces_shed` has 3 entries; the limit is 2"
        );
        a.replaces_shed = vec![shed("n".repeat(MAX_LOCALITY_NAME_BYTES + 1))];
        assert!(
            refused(AppRequest::Allocate(a.clone()))
                .message
                .starts_with("`replaces_shed.node_id` is 254 bytes")
        );
        a.replaces_shed = vec![shed("n".into())];
        a.container_type = ContainerType::Guaranteed;
        assert!(
            refused(AppRequest::Allocate(a))
                .message
                .starts_with("`replaces_shed`: only QUEUEABLE asks")
        );

        let hello = |app_id: String, secret: String, name: Option<String>| {
            AppRequest::Hello(Hello {
                protocol_version: 1,
                app_id,
                app_secret: secret,
                client_name: name,
            })
        };
        assert!(
            validate_request(&hello(
                "a".repeat(MAX_APP_ID_BYTES),
                "s".repeat(MAX_APP_SECRET_BYTES),
                Some("c".repeat(MAX_CLIENT_NAME_BYTES))
            ))
            .is_ok()
        );
        for (req, field) in [
            (hello("a".repeat(129), "s".into(), None), "`app_id`"),
            (hello("a".into(), "s".repeat(257), None), "`app_secret`"),
            (
                hello("a".into(), "s".into(), Some("c".repeat(257))),
                "`client_name`",
            ),
        ] {
            assert!(refused(req).message.starts_with(field));
        }
    }

    fn start(launch: LaunchSpec, job_id: &str) -> AppRequest {
        AppRequest::StartContainer(StartContainer {
            request_id: 3,
            token: ContainerToken {
                body: body(job_id),
                signature: "00".repeat(64),
            },
            launch,
        })
    }

    fn body(job_id: &str) -> TokenBody {
        TokenBody {
            container_id: ContainerId(u64::MAX),
            node_id: NodeId::from("n".repeat(MAX_LOCALITY_NAME_BYTES).as_str()),
            app_id: AppId::from("a".repeat(MAX_APP_ID_BYTES).as_str()),
            resources: Resources::new(u64::MAX, u64::MAX),
            container_type: ContainerType::Queueable,
            version: u32::MAX,
            job_id: JobId::new(job_id),
            job_submit_time_ms: u64::MAX,
            priority: u32::MAX,
            runtime_estimate_ms: Some(u64::MAX),
            expires_at_ms: u64::MAX,
            key_id: u32::MAX,
            node_epoch: u32::MAX,
            booking: None,
            times_returned: 0,
        }
    }

    #[test]
    fn launch_specs_and_tokens_are_bounded() {
        let ok = LaunchSpec {
            command: "/bin/true".into(),
            ..LaunchSpec::default()
        };
        assert!(validate_request(&start(ok.clone(), "j")).is_ok());
        assert!(
            refused(start(ok.clone(), &"j".repeat(MAX_JOB_ID_BYTES + 1)))
                .message
                .starts_with("`token.body.job_id` is 257 bytes")
        );
        let mut l = ok.clone();
        l.command = "x".repeat(MAX_PATH_BYTES + 1);
        assert!(
            refused(start(l, "j"))
                .message
                .starts_with("`launch.command`")
        );
        let mut l = ok.clone();
        l.args = vec![String::new(); MAX_ARGS + 1];
        assert!(
            refused(start(l, "j"))
                .message
                .starts_with("`launch.args` has")
        );
        let mut l = ok.clone();
        l.args = vec!["a".repeat(64 * 1024); 5];
        assert!(
            refused(start(l, "j"))
                .message
                .contains("the limit is 262144 bytes")
        );
        let mut l = ok.clone();
        l.args = vec!["a\0b".into()];
        assert_eq!(
            refused(start(l, "j")).message,
            "`launch.args[]` contains a NUL byte"
        );
        let mut l = ok.clone();
        l.env.insert("A=B".into(), "v".into());
        assert!(refused(start(l, "j")).message.contains("contain no '='"));
        let mut l = ok;
        l.env = (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(
            refused(start(l, "j"))
                .message
                .starts_with("`launch.env` has 1025")
        );
    }

    /// The largest status a container can have: every string at its bound, every number at
    /// its widest msgpack encoding.
    fn largest_status() -> ContainerStatus {
        ContainerStatus {
            usage: Some(Resources::new(u64::MAX, u64::MAX)),
            id: ContainerId(u64::MAX),
            app_id: AppId::from("a".repeat(MAX_APP_ID_BYTES).as_str()),
            container_type: ContainerType::Guaranteed,
            resources: Resources::new(u64::MAX, u64::MAX),
            placement: Placement::WaitingGuaranteed,
            version: u32::MAX,
            job: Some(ContainerJob {
                job_id: JobId::new("j".repeat(MAX_JOB_ID_BYTES)),
                job_submit_time_ms: u64::MAX,
                priority: u32::MAX,
                runtime_estimate_ms: Some(u64::MAX),
            }),
            grant_token: None,
        }
    }

    #[test]
    fn worst_case_heartbeat_fits_the_cluster_frame() {
        let status = largest_status();
        let status_bytes = to_payload(&status).unwrap().len();
        // A heartbeat of a full node: every container at its largest, and the most started and
        // finished ids one heartbeat reports, with the widest numbers.
        let hb = Heartbeat {
            node_id: NodeId::from("n".repeat(MAX_LOCALITY_NAME_BYTES).as_str()),
            directory_version: u64::MAX,
            queue_delay: QueueDelay {
                tq_ms: f64::MAX,
                tr_ms: f64::MAX,
                tl_ms: f64::MAX,
            },
            running: u32::MAX,
            queued: u32::MAX,
            allocated: Resources::new(u64::MAX, u64::MAX),
            usage: Some(Resources::new(u64::MAX, u64::MAX)),
            containers: vec![status.clone(); MAX_CONTAINERS_PER_NODE],
            started: vec![ContainerId(u64::MAX); MAX_REPORTED_IDS_PER_HEARTBEAT / 2],
            finished: vec![ContainerId(u64::MAX); MAX_REPORTED_IDS_PER_HEARTBEAT / 2],
            issued: vec![
                crate::quota::AppOutstanding {
                    app_id: AppId::from("a".repeat(MAX_APP_ID_BYTES).as_str()),
                    queueable: u32::MAX,
                    guaranteed: u32::MAX,
                };
                MAX_ISSUED_APPS_PER_HEARTBEAT
            ],
        };
        let hb_bytes = to_payload(&hb).unwrap().len();
        assert!(
            hb_bytes <= CLUSTER_MAX_FRAME,
            "worst-case heartbeat is {hb_bytes} bytes ({MAX_CONTAINERS_PER_NODE} × {status_bytes}-byte statuses), over the {CLUSTER_MAX_FRAME}-byte cluster frame"
        );
        // A re-join carries the same containers, with the token of every GUARANTEED one that
        // was booked other than as plain work (at most all of them).
        let mut with_token = status.clone();
        let mut token_body = body(&"j".repeat(MAX_JOB_ID_BYTES));
        token_body.container_type = ContainerType::Guaranteed;
        token_body.booking = Some(crate::token::GrantBooking {
            reservation_id: Some("r".repeat(MAX_RESERVATION_ID_BYTES)),
            role: crate::shaper::ComponentRole::Elastic,
            allow_shaping: true,
            requested: Resources::new(u64::MAX, u64::MAX),
        });
        with_token.grant_token = Some(ContainerToken {
            body: token_body,
            signature: "f".repeat(MAX_SIGNATURE_BYTES),
        });
        let status_with_token_bytes = to_payload(&with_token).unwrap().len();
        let mut statuses = vec![with_token; MAX_GRANT_TOKENS_PER_JOIN];
        statuses.resize(MAX_CONTAINERS_PER_NODE, status);
        let join = Join {
            protocol_version: u32::MAX,
            join_token: "t".repeat(256),
            node_id: NodeId::from("n".repeat(MAX_LOCALITY_NAME_BYTES).as_str()),
            rack: "r".repeat(MAX_LOCALITY_NAME_BYTES),
            capacity: Resources::new(u64::MAX, u64::MAX),
            app_endpoint: "e".repeat(MAX_LOCALITY_NAME_BYTES + 6),
            containers: statuses,
            attributes: (0..MAX_NODE_ATTRIBUTES)
                .map(|i| {
                    (
                        format!("{i:0width$}", width = MAX_NODE_ATTRIBUTE_BYTES),
                        "v".repeat(MAX_NODE_ATTRIBUTE_BYTES),
                    )
                })
                .collect(),
        };
        let join_bytes = to_payload(&join).unwrap().len();
        assert!(
            join_bytes <= CLUSTER_MAX_FRAME,
            "worst-case join is {join_bytes} bytes ({MAX_GRANT_TOKENS_PER_JOIN} of {MAX_CONTAINERS_PER_NODE} statuses with a token, {status_with_token_bytes} bytes each)"
        );
        // Headroom: the frame would hold this many more containers.
        println!(
            "largest status {status_bytes} B; worst heartbeat {hb_bytes} B = {:.1}% of the {CLUSTER_MAX_FRAME} B cluster frame",
            100.0 * hb_bytes as f64 / CLUSTER_MAX_FRAME as f64
        );
    }

    #[test]
    fn node_attributes_beyond_their_limits_are_named() {
        use std::collections::BTreeMap;
        let ok: BTreeMap<String, String> = [("rack".to_string(), "r1".to_string())].into();
        assert!(check_node_attributes(&ok).is_ok());
        let many: BTreeMap<String, String> = (0..=MAX_NODE_ATTRIBUTES)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(
            check_node_attributes(&many)
                .unwrap_err()
                .contains("at most")
        );
        let long_key: BTreeMap<String, String> =
            [("k".repeat(MAX_NODE_ATTRIBUTE_BYTES + 1), String::new())].into();
        assert!(
            check_node_attributes(&long_key)
                .unwrap_err()
                .contains("key")
        );
        let empty_key: BTreeMap<String, String> = [(String::new(), "v".into())].into();
        assert!(
            check_node_attributes(&empty_key)
                .unwrap_err()
                .contains("key")
        );
        let long_value: BTreeMap<String, String> =
            [("gpu".to_string(), "v".repeat(MAX_NODE_ATTRIBUTE_BYTES + 1))].into();
        assert!(
            check_node_attributes(&long_value)
                .unwrap_err()
                .contains("\"gpu\"")
        );
    }

    #[test]
    fn the_join_token_is_read_from_the_start_of_a_large_join() {
        let status = largest_status();
        let join = crate::protocol::cluster::WorkerToCoordinator::Join(Join {
            protocol_version: 1,
            join_token: "secret-token".into(),
            node_id: NodeId::from("n"),
            rack: "r".into(),
            capacity: Resources::new(1, 1),
            app_endpoint: "e:1".into(),
            containers: vec![status; 1000],
            attributes: Default::default(),
        });
        let payload = to_payload(&join).unwrap();
        assert!(payload.len() > 100 * JOIN_PREFIX_BYTES);
        assert_eq!(
            join_token_in_prefix(&payload[..JOIN_PREFIX_BYTES]).as_deref(),
            Some("secret-token")
        );
        assert_eq!(
            join_token_in_prefix(&payload).as_deref(),
            Some("secret-token")
        );
        // Cut inside the token, or no token at all: nothing.
        let at = payload.windows(6).position(|w| w == b"secret").unwrap();
        assert_eq!(join_token_in_prefix(&payload[..at + 3]), None);
        assert_eq!(join_token_in_prefix(&[0xc1, 0xc1]), None);
        #[derive(serde::Serialize)]
        struct TokenLast {
            containers: Vec<u8>,
            join_token: &'static str,
        }
        let late = to_payload(&TokenLast {
            containers: vec![0; 2 * JOIN_PREFIX_BYTES],
            join_token: "t",
        })
        .unwrap();
        assert_eq!(join_token_in_prefix(&late[..JOIN_PREFIX_BYTES]), None);
        assert_eq!(join_token_in_prefix(&late).as_deref(), Some("t"));
    }

    proptest::proptest! {
        // A fixed seed: the same cases on every run.
        #![proptest_config(proptest::test_runner::Config {
            cases: 512,
            rng_seed: proptest::test_runner::RngSeed::Fixed(11),
            ..proptest::test_runner::Config::default()
        })]

        /// Whatever bytes arrive, decoding and validation answer (a value or an error); they
        /// never panic. Mutations of a valid start_container reach deep into the structs.
        #[test]
        fn arbitrary_or_mutated_frames_never_panic(
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
            flips in proptest::collection::vec((0usize..4096, proptest::num::u8::ANY), 0..8),
        ) {
            let check = |bytes: &[u8]| {
                if let Ok(req) = crate::codec::from_payload::<AppRequest>(bytes) {
                    let _ = validate_request(&req);
                }
                let _ = join_token_in_prefix(bytes);
            };
            check(&junk);
            let mut launch = LaunchSpec {
                command: "/bin/true".into(),
                ..LaunchSpec::default()
            };
            launch.args = vec!["a".into(), "b".into()];
            launch.env.insert("K".into(), "V".into());
            let mut bytes = to_payload(&start(launch, "job")).unwrap();
            for (at, byte) in flips {
                let i = at % bytes.len();
                bytes[i] = byte;
            }
            check(&bytes);
        }
    }

    #[test]
    fn a_long_outage_compacts_containers_that_came_and_went_and_keeps_the_rest() {
        let mut log = ReportLog::with_threshold(100);
        // Reported started before the outage: their ends must be kept.
        let reported: Vec<ContainerId> = (0..10).map(|i| ContainerId::new(1, i)).collect();
        // Still running at the end of the outage: their starts must be kept.
        let running: Vec<ContainerId> = (100..120).map(|i| ContainerId::new(1, i)).collect();
        for id in &running {
            log.started(*id);
        }
        for i in 0..100_000u64 {
            let id = ContainerId::new(2, i);
            log.started(id);
            log.finished(id);
            if i < reported.len() as u64 {
                log.finished(reported[i as usize]);
            }
            assert!(log.len() <= 200, "bounded: {} events", log.len());
        }
        assert!(log.compacted() > 190_000, "{}", log.compacted());
        let mut started = std::collections::HashSet::new();
        let mut finished = std::collections::HashSet::new();
        while !log.is_empty() {
            let (s, f) = log.take_batch(7);
            started.extend(s);
            for id in f {
                // An end is never reported before its start (unless the start was reported
                // before the log: the `reported` ones).
                assert!(
                    started.contains(&id) || reported.contains(&id),
                    "{id:?} ended before it was reported started"
                );
                finished.insert(id);
            }
        }
        for id in &running {
            assert!(started.contains(id) && !finished.contains(id), "{id:?}");
        }
        for id in &reported {
            assert!(finished.contains(id), "{id:?}");
        }
    }

    #[test]
    fn started_and_finished_ids_are_reported_in_bounded_ordered_batches() {
        let mut log = ReportLog::default();
        for i in 0..5 {
            log.started(ContainerId(i));
            log.finished(ContainerId(i));
        }
        // 10 events, batches of 4: nothing lost, an end never before its start.
        let mut seen_started = std::collections::HashSet::new();
        let mut batches = 0;
        while !log.is_empty() {
            let (started, finished) = log.take_batch(4);
            assert!(started.len() + finished.len() <= 4);
            seen_started.extend(started.iter().copied());
            for id in finished {
                assert!(
                    seen_started.contains(&id),
                    "{id:?} ended before it was reported started"
                );
            }
            batches += 1;
        }
        assert_eq!(batches, 3);
        assert_eq!(seen_started.len(), 5);
    }

    /// A batch whose heartbeat was replaced before it was sent goes back first: the next batch
    /// reports it with what happened since, nothing lost, no end before its start.
    #[test]
    fn a_batch_given_back_is_reported_first_by_the_next_batch() {
        let mut log = ReportLog::default();
        log.started(ContainerId(1));
        log.started(ContainerId(2));
        log.finished(ContainerId(1));
        let (started, finished) = log.take_batch(10);
        assert_eq!(started, vec![ContainerId(1), ContainerId(2)]);
        assert_eq!(finished, vec![ContainerId(1)]);
        log.finished(ContainerId(2));
        log.started(ContainerId(3));
        log.give_back(started, finished);
        assert_eq!(log.len(), 5);
        // In batches of 2: the given-back events first, in order, then the newer ones.
        let mut seen = Vec::new();
        while !log.is_empty() {
            let (s, f) = log.take_batch(2);
            seen.push((s, f));
        }
        assert_eq!(
            seen,
            vec![
                (vec![ContainerId(1), ContainerId(2)], vec![]),
                (vec![], vec![ContainerId(1), ContainerId(2)]),
                (vec![ContainerId(3)], vec![]),
            ]
        );
    }

    #[test]
    fn a_node_takes_containers_up_to_its_maximum() {
        assert!(check_node_room(MAX_CONTAINERS_PER_NODE - 1).is_ok());
        let e = check_node_room(MAX_CONTAINERS_PER_NODE).unwrap_err();
        assert!(e.contains("16384"), "{e}");
    }

    #[test]
    fn reservation_requests_are_bounded_and_name_the_field() {
        use crate::protocol::app::{DeleteReservation, Reserve};
        use crate::reservation::{Interpreter, ReservationDefinition, Stage};
        let def = |stages: usize| ReservationDefinition {
            arrival_ms: 0,
            deadline_ms: 60_000,
            interpreter: Interpreter::All,
            stages: vec![
                Stage {
                    containers: 1,
                    gang: 1,
                    duration_ms: 60_000,
                    size: Resources::new(1, 1),
                };
                stages
            ],
            recurrence_ms: None,
            alignment_penalty: 0.0,
        };
        let reserve = |id: &str, stages: usize| {
            AppRequest::Reserve(Reserve {
                request_id: 3,
                reservation_id: id.into(),
                definition: def(stages),
            })
        };
        assert!(validate_request(&reserve("r-1", MAX_RESERVATION_STAGES)).is_ok());
        let e = refused(reserve("r-1", MAX_RESERVATION_STAGES + 1));
        assert!(e.message.contains("`definition.stages`"), "{}", e.message);
        assert_eq!(e.request_id, Some(3));
        let long = "r".repeat(MAX_RESERVATION_ID_BYTES + 1);
        assert!(
            refused(reserve(&long, 1))
                .message
                .contains("`reservation_id`")
        );
        let e = refused(AppRequest::DeleteReservation(DeleteReservation {
            request_id: 4,
            reservation_id: "a/b".into(),
        }));
        assert!(e.message.contains("reservation_id"), "{}", e.message);
        let mut a = allocate();
        a.reservation_id = Some("r-1".into());
        let e = refused(AppRequest::Allocate(a.clone()));
        assert!(e.message.contains("only GUARANTEED"), "{}", e.message);
        a.container_type = ContainerType::Guaranteed;
        assert!(validate_request(&AppRequest::Allocate(a)).is_ok());
    }
}
