//! The coordinator's side of promotion (Mercury §3.4: "a QUEUEABLE container can be promoted to
//! GUARANTEED ... validated by the central scheduler"), as a sans-IO state machine.
//!
//! A promotion goes: requested (the container is located and checked) → booked by the guarantor
//! (GUARANTEED capacity on the hosting node) → applied by the hosting node with a new GUARANTEED
//! token → answered to the requester. Any step can fail or time out; every way out gives the
//! booking back exactly when one was made, including a booking whose answer arrives after the
//! promotion was already refused (the race that used to leave capacity booked for good).
//!
//! The caller routes [`PromotionAction`]s: `Book`/`Undo` to the guarantor, `Apply` to the hosting
//! node (after signing the body with the coordinator's GUARANTEED key), `Succeed`/`Fail` to the
//! requester identified by the caller's own route `R`.

use crate::node::ContainerStatus;
use crate::protocol::app::ErrorCode;
use crate::token::{ContainerToken, TokenBody};
use crate::{AppId, ContainerId, ContainerType, JobId, NodeId, Resources, Time};
use std::collections::HashMap;
use std::time::Duration;

/// What the caller must do.
#[derive(Clone, Debug, PartialEq)]
pub enum PromotionAction<R> {
    /// Ask the guarantor to book GUARANTEED capacity for the container on its node.
    Book {
        promotion_id: u64,
        container_id: ContainerId,
        node_id: NodeId,
        app_id: AppId,
        resources: Resources,
    },
    /// Give a booking back to the guarantor.
    Undo { container_id: ContainerId },
    /// Sign `body` (GUARANTEED) and send it to the hosting node as `apply_promotion`
    /// (correlation id = `promotion_id`); then call [`Promotions::sent`] with the token.
    Apply {
        promotion_id: u64,
        host: NodeId,
        body: TokenBody,
    },
    /// The promotion succeeded: answer the requester with the new token.
    Succeed { requester: R, token: ContainerToken },
    /// The promotion failed: answer the requester.
    Fail {
        requester: R,
        code: ErrorCode,
        message: String,
    },
}

#[derive(Clone, Debug)]
struct Pending<R> {
    requester: R,
    container: ContainerStatus,
    host: NodeId,
    /// The guarantor booked it (so every way out must give the booking back).
    booked: bool,
    /// The signed token, once sent to the host.
    token: Option<ContainerToken>,
    started_at: Time,
}

/// Promotions in flight.
#[derive(Clone, Debug)]
pub struct Promotions<R> {
    pending: HashMap<u64, Pending<R>>,
    next_id: u64,
    /// A promotion not answered by the hosting node within this is refused.
    timeout: Duration,
    token_ttl_ms: u64,
}

impl<R: Clone> Promotions<R> {
    pub fn new(timeout: Duration, token_ttl_ms: u64) -> Promotions<R> {
        Promotions {
            pending: HashMap::new(),
            next_id: 1,
            timeout,
            token_ttl_ms,
        }
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// An app asks to promote `container_id`; `located` is the container as its host reports it
    /// (the requesting worker's own report when it hosts it, else the nodes' last heartbeats).
    pub fn request(
        &mut self,
        now: Time,
        requester: R,
        app_id: &str,
        container_id: ContainerId,
        located: Option<(NodeId, ContainerStatus)>,
    ) -> Vec<PromotionAction<R>> {
        let fail = |code, message| {
            vec![PromotionAction::Fail {
                requester: requester.clone(),
                code,
                message,
            }]
        };
        let Some((host, status)) = located.filter(|(_, s)| s.id == container_id) else {
            return fail(
                ErrorCode::UnknownContainer,
                format!(
                    "container {container_id} is not reported by any node (not started yet, or gone)"
                ),
            );
        };
        if status.app_id.as_str() != app_id {
            return fail(
                ErrorCode::UnknownContainer,
                format!("container {container_id} is not a container of app {app_id}"),
            );
        }
        if status.container_type == ContainerType::Guaranteed {
            return fail(
                ErrorCode::InvalidRequest,
                format!("container {container_id} is GUARANTEED already"),
            );
        }
        if self
            .pending
            .values()
            .any(|p| p.container.id == container_id)
        {
            return fail(
                ErrorCode::PromotionRefused,
                format!("container {container_id} is being promoted already"),
            );
        }
        let promotion_id = self.next_id;
        self.next_id += 1;
        let book = PromotionAction::Book {
            promotion_id,
            container_id,
            node_id: host.clone(),
            app_id: status.app_id.clone(),
            resources: status.resources,
        };
        self.pending.insert(
            promotion_id,
            Pending {
                requester,
                container: status,
                host,
                booked: false,
                token: None,
                started_at: now,
            },
        );
        vec![book]
    }

    /// The guarantor's answer to `Book`. `retryable` says whether a refusal may succeed later
    /// (no capacity now) or not (e.g. GUARANTEED already).
    pub fn booked(
        &mut self,
        now_ms: u64,
        promotion_id: u64,
        container_id: ContainerId,
        result: Result<(), (bool, String)>,
        host_epoch: impl Fn(&NodeId) -> u32,
    ) -> Vec<PromotionAction<R>> {
        let Some(p) = self.pending.get_mut(&promotion_id) else {
            // Refused (timed out, host lost) while the booking was in flight: give it back, or
            // the capacity stays booked for good.
            return match result {
                Ok(()) => vec![PromotionAction::Undo { container_id }],
                Err(_) => vec![],
            };
        };
        if let Err((retryable, message)) = result {
            let p = self.pending.remove(&promotion_id).expect("present");
            let code = if retryable {
                ErrorCode::PromotionRefused
            } else {
                ErrorCode::InvalidRequest
            };
            return vec![PromotionAction::Fail {
                requester: p.requester,
                code,
                message,
            }];
        }
        p.booked = true;
        let c = &p.container;
        let job = c.job.clone();
        let body = TokenBody {
            container_id: c.id,
            node_id: p.host.clone(),
            app_id: c.app_id.clone(),
            resources: c.resources,
            container_type: ContainerType::Guaranteed,
            version: c.version.saturating_add(1),
            job_id: job
                .as_ref()
                .map_or_else(|| JobId::new(""), |j| j.job_id.clone()),
            job_submit_time_ms: job.as_ref().map_or(0, |j| j.job_submit_time_ms),
            priority: job.as_ref().map_or(0, |j| j.priority),
            runtime_estimate_ms: job.as_ref().and_then(|j| j.runtime_estimate_ms),
            expires_at_ms: now_ms.saturating_add(self.token_ttl_ms),
            key_id: 0,
            node_epoch: host_epoch(&p.host),
            booking: None,
            times_returned: 0,
        };
        vec![PromotionAction::Apply {
            promotion_id,
            host: p.host.clone(),
            body,
        }]
    }

    /// The caller signed and sent `Apply`'s token (`Ok`), or could not (`Err`: not signed, or
    /// the host is not connected): then the promotion is refused and the booking given back.
    pub fn sent(
        &mut self,
        promotion_id: u64,
        token: Result<ContainerToken, String>,
    ) -> Vec<PromotionAction<R>> {
        match token {
            Ok(t) => {
                if let Some(p) = self.pending.get_mut(&promotion_id) {
                    p.token = Some(t);
                }
                vec![]
            }
            Err(why) => self.refuse(promotion_id, why),
        }
    }

    /// The hosting node's answer to `apply_promotion`.
    pub fn applied(
        &mut self,
        from: &NodeId,
        promotion_id: u64,
        error: Option<String>,
    ) -> Result<Vec<PromotionAction<R>>, String> {
        let Some(p) = self.pending.get(&promotion_id) else {
            return Ok(vec![]); // late answer to a promotion refused meanwhile
        };
        if &p.host != from || p.token.is_none() {
            return Err(format!(
                "promotion_applied {promotion_id} from node {from}, which was not asked"
            ));
        }
        if let Some(reason) = error {
            return Ok(self.refuse(
                promotion_id,
                format!("hosting node {from} refused the promotion: {reason}"),
            ));
        }
        let p = self.pending.remove(&promotion_id).expect("present");
        Ok(vec![PromotionAction::Succeed {
            requester: p.requester,
            token: p.token.expect("checked above"),
        }])
    }

    /// Refuse promotions whose hosting node has not answered within the timeout.
    pub fn expire(&mut self, now: Time) -> Vec<PromotionAction<R>> {
        let mut stale: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_since(p.started_at) > self.timeout)
            .map(|(id, _)| *id)
            .collect();
        stale.sort_unstable();
        stale
            .into_iter()
            .flat_map(|id| {
                self.refuse(
                    id,
                    "the hosting node did not answer the promotion in time".into(),
                )
            })
            .collect()
    }

    /// The hosting node was lost: its promotions are refused. Their bookings went with the
    /// node's (the guarantor dropped every booking on it), so none is given back here.
    pub fn host_lost(&mut self, node: &NodeId) -> Vec<PromotionAction<R>> {
        let mut hosted: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| &p.host == node)
            .map(|(id, _)| *id)
            .collect();
        hosted.sort_unstable();
        hosted
            .into_iter()
            .filter_map(|id| self.pending.remove(&id))
            .map(|p| PromotionAction::Fail {
                requester: p.requester,
                code: ErrorCode::PromotionRefused,
                message: format!("hosting node {node} was lost"),
            })
            .collect()
    }

    /// The hosting node joined again, a new session, reporting `reported` (the containers it
    /// runs). A promotion already sent to it belonged to the old session, whose frames are gone:
    /// its `promotion_applied` may have been lost after the node applied it, and an
    /// `apply_promotion` not yet read will never be. So it is settled from the report instead of
    /// waiting for the timeout (which would give back the booking of a container the node runs
    /// as GUARANTEED): reported GUARANTEED at the promotion's token version means applied
    /// (answered as such, the booking kept); anything else means not applied (refused, the
    /// booking given back). Promotions not sent yet go to the new session as usual.
    pub fn host_rejoined(
        &mut self,
        node: &NodeId,
        reported: &[ContainerStatus],
    ) -> Vec<PromotionAction<R>> {
        let mut sent: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| &p.host == node && p.token.is_some())
            .map(|(id, _)| *id)
            .collect();
        sent.sort_unstable();
        let mut out = Vec::new();
        for id in sent {
            let p = &self.pending[&id];
            let version = p.token.as_ref().map(|t| t.body.version);
            let applied = reported.iter().any(|c| {
                c.id == p.container.id
                    && c.container_type == ContainerType::Guaranteed
                    && Some(c.version) == version
            });
            if applied {
                let p = self.pending.remove(&id).expect("listed above");
                out.push(PromotionAction::Succeed {
                    requester: p.requester,
                    token: p.token.expect("sent"),
                });
            } else {
                out.extend(self.refuse(
                    id,
                    format!(
                        "hosting node {node} re-joined without having applied the promotion; ask again"
                    ),
                ));
            }
        }
        out
    }

    fn refuse(&mut self, promotion_id: u64, message: String) -> Vec<PromotionAction<R>> {
        let Some(p) = self.pending.remove(&promotion_id) else {
            return vec![];
        };
        let mut out = Vec::with_capacity(2);
        if p.booked {
            out.push(PromotionAction::Undo {
                container_id: p.container.id,
            });
        }
        out.push(PromotionAction::Fail {
            requester: p.requester,
            code: ErrorCode::PromotionRefused,
            message,
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{ContainerJob, Placement};
    use crate::token::{GuaranteedSigner, KeyRing, TokenKey};

    fn queueable(id: u64) -> ContainerStatus {
        ContainerStatus {
            usage: None,
            id: ContainerId::new(4, id),
            app_id: AppId::from("app"),
            container_type: ContainerType::Queueable,
            resources: Resources::new(500, 256),
            placement: Placement::Running,
            version: 0,
            job: Some(ContainerJob {
                job_id: JobId::from("job"),
                job_submit_time_ms: 7,
                priority: 1,
                runtime_estimate_ms: Some(1000),
            }),
            grant_token: None,
        }
    }

    fn sign(body: TokenBody) -> ContainerToken {
        GuaranteedSigner::new(&KeyRing::new(TokenKey::from_bytes(1, [3; 32])))
            .unwrap()
            .sign(body)
            .unwrap()
    }

    fn host() -> NodeId {
        NodeId::from("host")
    }

    /// Undo actions minus bookings made: never negative, zero when nothing is in flight.
    fn balance(bookings_made: i32, actions: &[PromotionAction<u32>]) -> i32 {
        bookings_made
            - actions
                .iter()
                .filter(|a| matches!(a, PromotionAction::Undo { .. }))
                .count() as i32
    }

    /// A host that re-joins (a new session) settles the promotions sent to it in the old one
    /// from its join report, not at the timeout: applied (GUARANTEED at the token's version)
    /// keeps the booking and answers success (a timeout would have given back the booking of a
    /// container the node runs as GUARANTEED); not applied gives the booking back and refuses;
    /// one not sent yet is left for the new session.
    #[test]
    fn a_rejoining_host_settles_the_promotions_sent_to_it_from_its_report() {
        let mut p = Promotions::new(Duration::from_secs(10), 600_000);
        let book_and_apply = |p: &mut Promotions<u32>, requester: u32, c: &ContainerStatus| {
            let book = p.request(
                Time::ZERO,
                requester,
                "app",
                c.id,
                Some((host(), c.clone())),
            );
            let PromotionAction::Book { promotion_id, .. } = book[0] else {
                panic!("{book:?}")
            };
            let PromotionAction::Apply { body, .. } =
                p.booked(0, promotion_id, c.id, Ok(()), |_| 1)[0].clone()
            else {
                unreachable!()
            };
            (promotion_id, body)
        };
        let (applied_id, applied_body) = book_and_apply(&mut p, 1, &queueable(1));
        p.sent(applied_id, Ok(sign(applied_body.clone())));
        let (lost_id, lost_body) = book_and_apply(&mut p, 2, &queueable(2));
        p.sent(lost_id, Ok(sign(lost_body)));
        let (unsent_id, _) = book_and_apply(&mut p, 3, &queueable(3));
        // The host applied the first (its answer lost with the session), not the second.
        let mut promoted = queueable(1);
        promoted.container_type = ContainerType::Guaranteed;
        promoted.version = applied_body.version;
        let report = vec![promoted, queueable(2), queueable(3)];
        // Another node's re-join settles nothing of this host's.
        assert!(p.host_rejoined(&NodeId::from("other"), &report).is_empty());
        let settled = p.host_rejoined(&host(), &report);
        assert_eq!(settled.len(), 3, "{settled:?}");
        assert!(
            matches!(&settled[0], PromotionAction::Succeed { requester: 1, token } if token.body.version == applied_body.version)
        );
        assert_eq!(
            settled[1],
            PromotionAction::Undo {
                container_id: queueable(2).id
            }
        );
        assert!(matches!(
            settled[2],
            PromotionAction::Fail {
                requester: 2,
                code: ErrorCode::PromotionRefused,
                ..
            }
        ));
        // Two bookings made, one given back: the applied promotion keeps its booking; a
        // timeout now touches only the unsent one, and late answers are ignored.
        assert_eq!(balance(2, &settled), 1);
        assert_eq!(p.len(), 1);
        assert_eq!(p.applied(&host(), applied_id, None), Ok(vec![]));
        let expired = p.expire(Time::from_secs(11));
        assert_eq!(balance(1, &expired), 0, "{expired:?}");
        assert!(matches!(
            expired.last(),
            Some(PromotionAction::Fail { requester: 3, .. })
        ));
        let _ = unsent_id;
    }

    #[test]
    fn a_promotion_is_booked_applied_and_answered() {
        let mut p = Promotions::new(Duration::from_secs(10), 600_000);
        let c = queueable(1);
        let book = p.request(Time::ZERO, 11u32, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            panic!("{book:?}")
        };
        let apply = p.booked(1_000, promotion_id, c.id, Ok(()), |_| 9);
        let PromotionAction::Apply { body, host: h, .. } = &apply[0] else {
            panic!("{apply:?}")
        };
        assert_eq!(h, &host());
        assert_eq!(body.version, 1);
        assert_eq!(body.container_type, ContainerType::Guaranteed);
        assert_eq!(body.node_epoch, 9);
        assert_eq!(body.job_submit_time_ms, 7);
        assert_eq!(body.expires_at_ms, 601_000);
        let token = sign(body.clone());
        assert!(p.sent(promotion_id, Ok(token.clone())).is_empty());
        // Only the asked host may answer.
        assert!(
            p.applied(&NodeId::from("other"), promotion_id, None)
                .is_err()
        );
        let done = p.applied(&host(), promotion_id, None).unwrap();
        assert_eq!(
            done,
            vec![PromotionAction::Succeed {
                requester: 11,
                token
            }]
        );
        assert!(p.is_empty());
    }

    #[test]
    fn every_way_out_gives_a_booking_back_exactly_once() {
        let c = queueable(1);
        // 1. Timed out while the booking was in flight; the booking arrives afterwards.
        let mut p = Promotions::new(Duration::from_secs(10), 600_000);
        let book = p.request(Time::ZERO, 1u32, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            unreachable!()
        };
        let refused = p.expire(Time::from_secs(11));
        assert_eq!(balance(0, &refused), 0, "nothing booked yet: {refused:?}");
        assert!(matches!(
            refused[0],
            PromotionAction::Fail {
                code: ErrorCode::PromotionRefused,
                ..
            }
        ));
        let late = p.booked(11_000, promotion_id, c.id, Ok(()), |_| 1);
        assert_eq!(late, vec![PromotionAction::Undo { container_id: c.id }]);
        // 2. Booked, then the host refuses.
        let book = p.request(Time::ZERO, 2, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            unreachable!()
        };
        let PromotionAction::Apply { body, .. } =
            p.booked(0, promotion_id, c.id, Ok(()), |_| 1)[0].clone()
        else {
            unreachable!()
        };
        p.sent(promotion_id, Ok(sign(body)));
        let refused = p
            .applied(&host(), promotion_id, Some("not here".into()))
            .unwrap();
        assert_eq!(balance(1, &refused), 0, "{refused:?}");
        // 3. Booked, then it cannot be sent.
        let book = p.request(Time::ZERO, 3, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            unreachable!()
        };
        p.booked(0, promotion_id, c.id, Ok(()), |_| 1);
        assert_eq!(
            balance(1, &p.sent(promotion_id, Err("host gone".into()))),
            0
        );
        // 4. Booked and sent, no answer in time.
        let book = p.request(Time::ZERO, 4, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            unreachable!()
        };
        let PromotionAction::Apply { body, .. } =
            p.booked(0, promotion_id, c.id, Ok(()), |_| 1)[0].clone()
        else {
            unreachable!()
        };
        p.sent(promotion_id, Ok(sign(body)));
        assert_eq!(balance(1, &p.expire(Time::from_secs(11))), 0);
        // A late answer from the host after that is ignored.
        assert_eq!(p.applied(&host(), promotion_id, None), Ok(vec![]));
        // 5. The guarantor refuses: nothing to give back; the code says whether to retry.
        let book = p.request(Time::ZERO, 5, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            unreachable!()
        };
        let refused = p.booked(0, promotion_id, c.id, Err((true, "no room".into())), |_| 1);
        assert_eq!(balance(0, &refused), 0);
        // 6. The host is lost: its bookings went with it, none is given back twice.
        let book = p.request(Time::ZERO, 6, "app", c.id, Some((host(), c.clone())));
        let PromotionAction::Book { promotion_id, .. } = book[0] else {
            unreachable!()
        };
        p.booked(0, promotion_id, c.id, Ok(()), |_| 1);
        let lost = p.host_lost(&host());
        assert_eq!(balance(0, &lost), 0);
        assert_eq!(lost.len(), 1);
        assert!(p.is_empty());
    }

    #[test]
    fn bad_requests_are_refused_with_the_reason() {
        let mut p: Promotions<u32> = Promotions::new(Duration::from_secs(10), 1);
        let c = queueable(1);
        let fail_code = |a: Vec<PromotionAction<u32>>| match &a[0] {
            PromotionAction::Fail { code, .. } => *code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            fail_code(p.request(Time::ZERO, 1, "app", c.id, None)),
            ErrorCode::UnknownContainer
        );
        assert_eq!(
            fail_code(p.request(Time::ZERO, 1, "other", c.id, Some((host(), c.clone())))),
            ErrorCode::UnknownContainer
        );
        let mut g = c.clone();
        g.container_type = ContainerType::Guaranteed;
        assert_eq!(
            fail_code(p.request(Time::ZERO, 1, "app", c.id, Some((host(), g)))),
            ErrorCode::InvalidRequest
        );
        p.request(Time::ZERO, 1, "app", c.id, Some((host(), c.clone())));
        assert_eq!(
            fail_code(p.request(Time::ZERO, 2, "app", c.id, Some((host(), c.clone())))),
            ErrorCode::PromotionRefused,
            "one promotion of a container at a time"
        );
        assert_eq!(p.len(), 1);
    }
}
