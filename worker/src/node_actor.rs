//! The node-runtime actor: owns the Mercury node runtime policy
//! ([`scheduler_core::node::NodeRuntime`]), the token verifier and the container processes. It
//! only decodes requests, calls the core, and acts on the core's events (launch or kill a
//! process tree, tell subscribed applications).

use crate::exec::{self, ContainerLimits, ContainerProcess, Executor, ExitOutcome};
use crate::link_queues::{InboxPermit, NodeInbox, OutboxTx};
use crate::shared::{ConnTx, InFlight, Settle, Shared};
use actix::prelude::*;
use scheduler_core::node::{ContainerSpec, NodeError, NodeEvent, NodeRuntime, Placement};
use scheduler_core::protocol::app::{
    AcceptedState, AppResponse, ContainerAccepted, ContainerEvent, ContainerEventKind, ErrorCode,
    ErrorFrame, StartContainer,
};
use scheduler_core::protocol::cluster::{
    ApplyPromotion, ContainerResized, GuaranteedFinished, Heartbeat, PromotionApplied,
    ResizeContainer, WorkerToCoordinator,
};
use scheduler_core::protocol::limits::{
    MAX_GRANT_TOKENS_PER_JOIN, MAX_REPORTED_IDS_PER_HEARTBEAT, ReportLog, check_node_room,
};
use scheduler_core::token::{NodeSessionSecret, PublicKeyRing, TokenVerifier};
use scheduler_core::{AppId, ContainerId, ContainerType, KillReason, NodeId, Resources, Time};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Commands to a container's process task.
enum ProcCmd {
    Kill,
    /// New limits (the resource shaper resized the container).
    Resize(ContainerLimits),
    /// Hand the process over to the next worker image (in-place upgrade) and stop serving it.
    HandOver(tokio::sync::oneshot::Sender<Result<exec::adopt::ProcessHandover, String>>),
}

pub struct NodeActor {
    node_id: NodeId,
    node: NodeRuntime,
    verifier: TokenVerifier,
    executor: Rc<Executor>,
    shared: Arc<Shared>,
    /// Frames to the coordinator (count-bounded; at most one heartbeat pending).
    link: OutboxTx,
    /// Where the link leaves the coordinator's newest hints ([`HintsReady`]).
    inbox: Arc<NodeInbox>,
    /// Launch specs of accepted containers that have not started yet.
    launch_specs: HashMap<ContainerId, exec::LaunchSpec>,
    /// App of every container on the node (for events after the core forgot it).
    owners: HashMap<ContainerId, AppId>,
    processes: HashMap<ContainerId, mpsc::UnboundedSender<ProcCmd>>,
    usage: HashMap<ContainerId, exec::UsageSample>,
    /// Starts and ends not yet reported; each heartbeat reports a bounded prefix.
    reports: ReportLog,
    /// The signed token of each GUARANTEED container whose grant carries booking terms
    /// (reservation, shaping): reported at the next join so a restarted coordinator books it
    /// again exactly as it was. At most one per container on the node; pruned every heartbeat.
    grant_tokens: HashMap<ContainerId, scheduler_core::token::ContainerToken>,
    heartbeat: Option<(SpawnHandle, Duration)>,
    /// How each process task's container ended, left by the task before it tells the actor
    /// ([`ProcessEnded`]), so an upgrade's hand-over finds ends whose message is still queued.
    ended: Rc<std::cell::RefCell<HashMap<ContainerId, ProcessEnd>>>,
    /// Set once the containers were handed over for an in-place upgrade: the node changes
    /// nothing any more (the next image takes over from the hand-over).
    upgrading: bool,
    /// Containers taken back after an upgrade: their events are held for apps that have not
    /// re-subscribed yet (their connections dropped with the old image).
    adopted: std::collections::HashSet<ContainerId>,
    /// Who waits for every process task to end ([`KillAll`]; one per stop request).
    all_ended: Vec<tokio::sync::oneshot::Sender<()>>,
    /// Set by [`KillAll`]: the worker is stopping, so no container starts any more.
    stopping: bool,
}

impl NodeActor {
    pub fn new(
        node_id: NodeId,
        node: NodeRuntime,
        executor: Rc<Executor>,
        shared: Arc<Shared>,
        link: OutboxTx,
        inbox: Arc<NodeInbox>,
    ) -> NodeActor {
        NodeActor {
            verifier: TokenVerifier::new(node_id.clone()),
            node_id,
            node,
            executor,
            shared,
            link,
            inbox,
            launch_specs: HashMap::new(),
            owners: HashMap::new(),
            processes: HashMap::new(),
            usage: HashMap::new(),
            reports: ReportLog::default(),
            grant_tokens: HashMap::new(),
            heartbeat: None,
            ended: Rc::default(),
            upgrading: false,
            adopted: Default::default(),
            all_ended: Vec::new(),
            stopping: false,
        }
    }

    fn event(&self, id: ContainerId, kind: ContainerEventKind) {
        if let Some(app) = self.owners.get(&id) {
            let at_ms = self.shared.clock.now().as_millis();
            let event = ContainerEvent {
                container_id: id,
                node_id: self.node_id.clone(),
                event: kind,
                at_ms,
            };
            if self.adopted.contains(&id) {
                self.shared.notify_or_hold(app, event);
            } else {
                self.shared.notify(app, event);
            }
        }
    }

    /// Act on what the core decided.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        // GUARANTEED containers of the guarantor that ended in this flush: told to the
        // coordinator at once, so their capacity is granted again without waiting for the next
        // heartbeat.
        let mut guaranteed_finished = Vec::new();
        for ev in self.node.drain_events() {
            match ev {
                NodeEvent::Queued { id } | NodeEvent::WaitingGuaranteed { id } => {
                    self.event(id, ContainerEventKind::Queued);
                }
                NodeEvent::Start { id } => {
                    let spec = self.launch_specs.remove(&id).unwrap_or_default();
                    let resources = self.node.spec(id).map(|s| s.resources).unwrap_or_default();
                    self.launch(ctx, id, spec, resources);
                    self.event(id, ContainerEventKind::Running);
                }
                NodeEvent::Killed {
                    id,
                    reason,
                    was_running,
                    message,
                } => {
                    if let Some(tx) = self.processes.get(&id).filter(|_| was_running) {
                        let _ = tx.send(ProcCmd::Kill);
                    }
                    self.launch_specs.remove(&id);
                    self.reports.finished(id);
                    if id.issuer() == 0 {
                        guaranteed_finished.push(id);
                    }
                    self.shared.metrics.killed(reason);
                    info!(container = %id, %reason, "container killed: {message}");
                    self.event(id, ContainerEventKind::Killed { reason, message });
                    self.owners.remove(&id);
                }
                NodeEvent::Finished { id, exit_code } => {
                    self.reports.finished(id);
                    if id.issuer() == 0 {
                        guaranteed_finished.push(id);
                    }
                    self.event(id, ContainerEventKind::Completed { exit_code });
                    self.owners.remove(&id);
                }
                NodeEvent::Promoted { id, version } => {
                    self.event(id, ContainerEventKind::Promoted { version })
                }
            }
        }
        if !guaranteed_finished.is_empty() && self.shared.connected.get() {
            let _ = self.link.push(WorkerToCoordinator::GuaranteedFinished(
                GuaranteedFinished {
                    finished: guaranteed_finished,
                },
            ));
        }
    }

    fn launch(
        &mut self,
        ctx: &mut Context<Self>,
        id: ContainerId,
        spec: exec::LaunchSpec,
        resources: Resources,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.processes.insert(id, tx);
        let limits = ContainerLimits {
            cpu_millis: resources.cpu_millis.max(1),
            memory_mib: resources.memory_mib.max(1),
        };
        let executor = self.executor.clone();
        let me = ctx.address();
        // The container's process task logs in a span naming it, its app and job.
        let (app, job) = self
            .node
            .spec(id)
            .map(|s| (s.app_id.to_string(), s.job_id.to_string()))
            .unwrap_or_default();
        let span = tracing::info_span!("container", node = %self.node_id, container = %id, app = %app, job = %job);
        actix_rt::spawn(tracing::Instrument::instrument(
            run_container(executor, id, spec, limits, rx, me, self.ended.clone()),
            span,
        ));
    }

    fn send_heartbeat(&mut self) {
        if !self.shared.connected.get() {
            return;
        }
        // A heartbeat the link has not written yet is replaced by this one (at most one is
        // ever queued): its reports go back first, so this one carries them.
        if let Some(unsent) = self.link.withdraw_heartbeat() {
            self.reports.give_back(unsent.started, unsent.finished);
        }
        let now = self.shared.clock.now();
        let usage = if self.usage.is_empty() {
            None
        } else {
            Some(self.usage.values().fold(Resources::ZERO, |acc, s| {
                acc.saturating_add(&Resources::new(s.cpu_millis, s.memory_mib))
            }))
        };
        let (started, finished) = self.reports.take_batch(MAX_REPORTED_IDS_PER_HEARTBEAT);
        let node = &self.node;
        self.grant_tokens
            .retain(|id, _| node.placement(*id).is_some());
        let hb = Heartbeat {
            node_id: self.node_id.clone(),
            directory_version: self.shared.directory_version.get(),
            queue_delay: self.node.queue_delay(now),
            running: self.node.running_count() as u32,
            queued: (self.node.queued_count() + self.node.waiting_guaranteed_count()) as u32,
            allocated: self.node.allocated(),
            usage,
            containers: self.with_usage(self.node.statuses()),
            started,
            finished,
            issued: self.shared.issued_counts(),
        };
        self.shared.metrics.node_state(
            &hb.containers,
            self.node.queued_count(),
            hb.queue_delay.total_ms(),
        );
        self.link.push_heartbeat(hb);
    }

    /// Each running container's last sampled use (the resource shaper's input).
    fn with_usage(
        &self,
        mut statuses: Vec<scheduler_core::node::ContainerStatus>,
    ) -> Vec<scheduler_core::node::ContainerStatus> {
        for s in &mut statuses {
            s.usage = self
                .usage
                .get(&s.id)
                .map(|u| Resources::new(u.cpu_millis, u.memory_mib));
        }
        statuses
    }

    /// Report a resize's result to the coordinator.
    fn resized(&self, container_id: ContainerId, enforced_by: &str, error: Option<String>) {
        let resources = self
            .node
            .spec(container_id)
            .map(|s| s.resources)
            .unwrap_or_default();
        let _ = self
            .link
            .push(WorkerToCoordinator::ContainerResized(ContainerResized {
                container_id,
                resources,
                enforced_by: enforced_by.to_string(),
                error,
            }));
    }

    fn start_container(&mut self, app: AppId, req: StartContainer) -> AppResponse {
        if self.upgrading {
            return error(
                req.request_id,
                ErrorCode::CoordinatorUnavailable,
                "start_container refused: the worker is upgrading in place; retry in a moment",
            );
        }
        if self.stopping {
            // A container started now would outlive the worker, which waits only for the
            // containers it killed when the stop began.
            return error(
                req.request_id,
                ErrorCode::CoordinatorUnavailable,
                "start_container refused: the worker is stopping and leaves the cluster; ask for \
                 a grant on another node",
            );
        }
        let now = self.shared.clock.now();
        let token = &req.token;
        if let Err(e) = self.verifier.check(token, &app, now.as_millis()) {
            self.shared.metrics.token_refused(&e);
            return error(
                req.request_id,
                ErrorCode::InvalidToken,
                format!("start_container refused: {e}"),
            );
        }
        let body = &token.body;
        let spec = ContainerSpec::granted_by(body);
        let launch = exec::LaunchSpec {
            command: req.launch.command.clone(),
            args: req.launch.args.clone(),
            env: req.launch.env.clone(),
            working_dir: req.launch.working_dir.as_ref().map(Into::into),
        };
        if launch.command.is_empty() {
            return error(
                req.request_id,
                ErrorCode::InvalidRequest,
                "launch.command must not be empty",
            );
        }
        let id = spec.id;
        if self.node.placement(id).is_some() {
            // Already here (e.g. a promoted container's new token): keep its owner and launch spec.
            return error(
                req.request_id,
                ErrorCode::InvalidRequest,
                format!("start_container refused: container {id} is already on this node"),
            );
        }
        // Bounded so a heartbeat listing every container fits the cluster frame.
        let held = self.node.running_count()
            + self.node.queued_count()
            + self.node.waiting_guaranteed_count();
        if let Err(message) = check_node_room(held) {
            return error(
                req.request_id,
                ErrorCode::QuotaExceeded,
                format!("start_container refused: {message}"),
            );
        }
        self.launch_specs.insert(id, launch);
        self.owners.insert(id, app.clone());
        match self.node.submit(now, spec) {
            Ok(()) => {
                // Consume the token only once the node took the container, so a refused start
                // can be retried; it was checked above in this same turn.
                self.verifier.consume(token);
                self.reports.started(id);
                if token.body.booking.is_some() {
                    self.grant_tokens.insert(id, token.clone());
                }
                let state = match self.node.placement(id) {
                    Some(Placement::Running) => AcceptedState::Running,
                    _ => AcceptedState::Queued,
                };
                AppResponse::ContainerAccepted(ContainerAccepted {
                    request_id: req.request_id,
                    container_id: id,
                    state,
                })
            }
            Err(e) => {
                self.launch_specs.remove(&id);
                self.owners.remove(&id);
                let code = match e {
                    NodeError::LargerThanNode { .. } => ErrorCode::AskTooLarge,
                    NodeError::QueueFull(_) => ErrorCode::QuotaExceeded,
                    NodeError::GuaranteedCapacityExceeded { .. } => {
                        ErrorCode::GuaranteedCapacityExceeded
                    }
                    _ => ErrorCode::InvalidRequest,
                };
                error(
                    req.request_id,
                    code,
                    format!("start_container refused: {e}"),
                )
            }
        }
    }
}

pub fn error(request_id: u64, code: ErrorCode, message: impl Into<String>) -> AppResponse {
    AppResponse::Error(ErrorFrame::new(Some(request_id), code, message))
}

impl Actor for NodeActor {
    type Context = Context<Self>;
}

/// A process task: launch, then wait for exit while serving kill commands and sampling usage.
async fn run_container(
    executor: Rc<Executor>,
    id: ContainerId,
    spec: exec::LaunchSpec,
    limits: ContainerLimits,
    cmd_rx: mpsc::UnboundedReceiver<ProcCmd>,
    node: Addr<NodeActor>,
    ended: Rc<std::cell::RefCell<HashMap<ContainerId, ProcessEnd>>>,
) {
    let proc: ContainerProcess = match executor.launch(id.0, &spec, limits).await {
        Ok(p) => p,
        Err(e) => {
            ended
                .borrow_mut()
                .insert(id, ProcessEnd::LaunchFailed(e.to_string()));
            node.do_send(ProcessEnded { id });
            return;
        }
    };
    debug!(container = %id, pid = proc.pid(), "container process started");
    supervise(proc, id, cmd_rx, node, ended).await;
}

/// Wait for a running container's exit while serving kill, resize and hand-over commands and
/// sampling its usage.
async fn supervise(
    mut proc: ContainerProcess,
    id: ContainerId,
    mut cmd_rx: mpsc::UnboundedReceiver<ProcCmd>,
    node: Addr<NodeActor>,
    ended: Rc<std::cell::RefCell<HashMap<ContainerId, ProcessEnd>>>,
) {
    // First sample one period after the start (an immediate one would scan /proc on the
    // actor's thread for every container, most of which end long before a second).
    let mut sample = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut commands_open = true;
    loop {
        enum Step {
            Exit(ExitOutcome),
            Cmd(Option<ProcCmd>),
            Sample,
        }
        let step = tokio::select! {
            outcome = proc.wait() => Step::Exit(outcome),
            cmd = cmd_rx.recv(), if commands_open => Step::Cmd(cmd),
            _ = sample.tick() => Step::Sample,
        };
        match step {
            Step::Exit(outcome) => {
                ended.borrow_mut().insert(id, ProcessEnd::Exited(outcome));
                node.do_send(ProcessEnded { id });
                return;
            }
            Step::Cmd(Some(ProcCmd::HandOver(reply))) => match proc.hand_over() {
                Ok(handover) => {
                    let _ = reply.send(Ok(handover));
                    // Kept (never dropped, never waited for): the next image owns the process.
                    std::future::pending::<()>().await;
                }
                Err(e) => {
                    // Its leader was reaped already: finish the wait so the end is handed over.
                    let outcome = proc.wait().await;
                    ended.borrow_mut().insert(id, ProcessEnd::Exited(outcome));
                    let _ = reply.send(Err(e.to_string()));
                    node.do_send(ProcessEnded { id });
                    return;
                }
            },
            Step::Cmd(Some(ProcCmd::Resize(limits))) => {
                let result = proc.resize(limits).map_err(|e| e.to_string());
                node.do_send(ResizeApplied { id, result });
            }
            Step::Cmd(Some(ProcCmd::Kill)) => {
                // Commands stay open: a hand-over may still come before the exit is reaped.
                if let Err(e) = proc.kill_tree() {
                    warn!(container = %id, "kill failed: {e}");
                }
            }
            Step::Cmd(None) => {
                commands_open = false;
                if let Err(e) = proc.kill_tree() {
                    warn!(container = %id, "kill failed: {e}");
                }
            }
            Step::Sample => {
                if let Ok(s) = proc.sample_usage() {
                    node.do_send(UsageReport { id, sample: s });
                }
            }
        }
    }
}

/// How a container's process ended.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessEnd {
    LaunchFailed(String),
    Exited(ExitOutcome),
}

#[derive(Message)]
#[rtype(result = "()")]
struct ProcessEnded {
    id: ContainerId,
}

impl Handler<ProcessEnded> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: ProcessEnded, ctx: &mut Context<Self>) {
        if self.upgrading {
            return; // the end stays in `ended` for the hand-over
        }
        let id = msg.id;
        let Some(end) = self.ended.borrow_mut().remove(&id) else {
            return;
        };
        self.process_ended(ctx, id, end);
    }
}

impl NodeActor {
    /// A container's process ended: tell the runtime (and so the app and coordinator).
    fn process_ended(&mut self, ctx: &mut Context<Self>, id: ContainerId, end: ProcessEnd) {
        self.processes.remove(&id);
        self.usage.remove(&id);
        if self.processes.is_empty() {
            for waiter in self.all_ended.drain(..) {
                let _ = waiter.send(());
            }
        }
        if self.node.placement(id) != Some(Placement::Running) {
            return; // already killed by the runtime (preempted, released, shed, lost)
        }
        let now = self.shared.clock.now();
        let result = match end {
            ProcessEnd::LaunchFailed(e) => {
                self.node.on_failure(now, id, format!("launch failed: {e}"))
            }
            ProcessEnd::Exited(ExitOutcome::Exited { code }) => self.node.on_exit(now, id, code),
            ProcessEnd::Exited(ExitOutcome::Signaled { signal }) => {
                self.node.on_exit(now, id, 128 + signal)
            }
            ProcessEnd::Exited(ExitOutcome::KilledForMemory {
                used_mib,
                limit_mib,
            }) => self.node.on_failure(
                now,
                id,
                format!("memory limit exceeded: used {used_mib} MiB of {limit_mib} MiB"),
            ),
            ProcessEnd::Exited(ExitOutcome::WaitFailed { errno }) => self.node.on_failure(
                now,
                id,
                format!("waiting for the process failed (errno {errno})"),
            ),
        };
        if let Err(e) = result {
            warn!(container = %id, "exit of unknown container: {e}");
        }
        self.flush(ctx);
    }
}

/// A container process applied (or failed to apply) new limits.
#[derive(Message)]
#[rtype(result = "()")]
struct ResizeApplied {
    id: ContainerId,
    result: Result<&'static str, String>,
}

impl Handler<ResizeApplied> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: ResizeApplied, _: &mut Context<Self>) {
        match msg.result {
            Ok(enforced_by) => {
                info!(container = %msg.id, enforced_by, "container resized");
                self.resized(msg.id, enforced_by, None);
            }
            Err(e) => {
                // The node accounts the new size; the process keeps its old limits.
                warn!(container = %msg.id, "resizing the container's limits failed: {e}");
                self.resized(msg.id, "none", Some(format!("limits not changed: {e}")));
            }
        }
    }
}

/// The coordinator's resource shaper resized a running GUARANTEED container here (Pace §3.2):
/// the node's accounting follows at once, the process's limits change without a restart.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResizeMsg(pub ResizeContainer);

impl Handler<ResizeMsg> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: ResizeMsg, ctx: &mut Context<Self>) {
        if self.upgrading {
            return;
        }
        let ResizeContainer {
            container_id,
            resources,
        } = msg.0;
        let now = self.shared.clock.now();
        match self.node.resize(now, container_id, resources) {
            Ok(()) => match self.processes.get(&container_id) {
                Some(tx) => {
                    let _ = tx.send(ProcCmd::Resize(ContainerLimits {
                        cpu_millis: resources.cpu_millis.max(1),
                        memory_mib: resources.memory_mib.max(1),
                    }));
                }
                None => self.resized(container_id, "none", None),
            },
            Err(e) => {
                warn!(container = %container_id, %resources, "resize refused: {e}");
                self.resized(container_id, "none", Some(e.to_string()));
            }
        }
        self.flush(ctx);
    }
}

#[derive(Message)]
#[rtype(result = "()")]
struct UsageReport {
    id: ContainerId,
    sample: exec::UsageSample,
}

impl Handler<UsageReport> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: UsageReport, _: &mut Context<Self>) {
        if self.processes.contains_key(&msg.id) {
            self.usage.insert(msg.id, msg.sample);
        }
    }
}

/// `start_container` from an application connection.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StartMsg {
    pub app: AppId,
    pub req: StartContainer,
    pub reply: ConnTx,
    /// Counts in the connection's requests in flight until handled.
    pub in_flight: InFlight,
}

impl Handler<StartMsg> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: StartMsg, ctx: &mut Context<Self>) {
        let answer = self.start_container(msg.app, msg.req);
        // Answer first, then the events the start produced (queued / running).
        let _ = msg.reply.send(answer);
        self.flush(ctx);
    }
}

impl Handler<Settle> for NodeActor {
    type Result = ();
    fn handle(&mut self, _: Settle, _: &mut Context<Self>) {}
}

/// Stop (release) a container on this node on behalf of `app`.
#[derive(Message)]
#[rtype(result = "Result<(), NodeError>")]
pub struct StopLocal {
    pub app: AppId,
    pub container_id: ContainerId,
}

impl Handler<StopLocal> for NodeActor {
    type Result = Result<(), NodeError>;
    fn handle(&mut self, msg: StopLocal, ctx: &mut Context<Self>) -> Self::Result {
        if self.upgrading {
            return Err(NodeError::Upgrading);
        }
        self.node
            .stop(self.shared.clock.now(), msg.container_id, &msg.app)?;
        self.flush(ctx);
        Ok(())
    }
}

/// Every container on the node (for the join's reconciliation list).
#[derive(Message)]
#[rtype(result = "Vec<scheduler_core::node::ContainerStatus>")]
pub struct Statuses;

impl Handler<Statuses> for NodeActor {
    type Result = Vec<scheduler_core::node::ContainerStatus>;
    fn handle(&mut self, _: Statuses, _: &mut Context<Self>) -> Self::Result {
        let mut statuses = self.node.statuses();
        // Bounded so the join fits its frame; the rest are re-booked as plain work.
        let mut tokens_left = MAX_GRANT_TOKENS_PER_JOIN;
        for s in &mut statuses {
            if tokens_left > 0 && s.container_type == ContainerType::Guaranteed {
                s.grant_token = self.grant_tokens.get(&s.id).cloned();
                tokens_left -= usize::from(s.grant_token.is_some());
            }
        }
        statuses
    }
}

/// One container's status, if it is on this node.
#[derive(Message)]
#[rtype(result = "Option<scheduler_core::node::ContainerStatus>")]
pub struct StatusOf(pub scheduler_core::ContainerId);

impl Handler<StatusOf> for NodeActor {
    type Result = Option<scheduler_core::node::ContainerStatus>;
    fn handle(&mut self, msg: StatusOf, _: &mut Context<Self>) -> Self::Result {
        // Linear in the node's containers; promotions are rare.
        self.node.statuses().into_iter().find(|c| c.id == msg.0)
    }
}

/// The worker joined (or re-joined): adopt keys and the heartbeat period.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeJoined {
    /// This session (grants of other sessions are void) and its secret for QUEUEABLE tokens.
    pub node_secret: NodeSessionSecret,
    pub guaranteed_keys: PublicKeyRing,
    pub heartbeat_interval: Duration,
    /// Containers the coordinator reported lost while this node was cut off: killed at once.
    pub lost_containers: Vec<ContainerId>,
}

impl Handler<NodeJoined> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: NodeJoined, ctx: &mut Context<Self>) {
        if self.upgrading {
            return;
        }
        if let Err(e) = self.verifier.set_node_session(&msg.node_secret) {
            // Tokens of the new session are refused until a join brings usable material.
            tracing::error!("the coordinator's session secret is unusable: {e}");
        }
        self.verifier.set_guaranteed_keys(msg.guaranteed_keys);
        let now = self.shared.clock.now();
        for id in msg.lost_containers {
            // Killed before the first heartbeat of the session goes out, so the coordinator never
            // hears of them as running again.
            if self
                .node
                .kill(
                    now,
                    id,
                    KillReason::Lost,
                    "the coordinator declared this node lost while it was cut off and reported \
                     the container lost"
                        .into(),
                )
                .is_ok()
            {
                warn!(container = %id, "killed a container the coordinator reported lost");
            }
        }
        self.flush(ctx);
        let interval = msg.heartbeat_interval.max(Duration::from_millis(10));
        match self.heartbeat {
            Some((_, current)) if current == interval => {}
            previous => {
                if let Some((handle, _)) = previous {
                    ctx.cancel_future(handle);
                }
                let handle = ctx.run_interval(interval, |act, _| act.send_heartbeat());
                self.heartbeat = Some((handle, interval));
            }
        }
        // Report at once so the coordinator learns this node's load without waiting a period.
        self.send_heartbeat();
    }
}

/// The coordinator's hints from a heartbeat ack (Mercury §4.3 shedding and policing). The link
/// leaves the newest in the [`NodeInbox`] and wakes the actor with [`HintsReady`].
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct NodeHints {
    pub shedding_threshold_ms: Option<f64>,
    /// How long a queued QUEUEABLE container may be held back by GUARANTEED work before it is
    /// returned for placement elsewhere (`NodeRuntime::shed_held_by_guaranteed`); None without a
    /// view.
    pub replacement_bound_ms: Option<f64>,
    pub queueable_limit: Resources,
    pub guaranteed_keys: Option<PublicKeyRing>,
}

impl Handler<NodeHints> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: NodeHints, ctx: &mut Context<Self>) {
        if self.upgrading {
            return;
        }
        let now = self.shared.clock.now();
        if let Some(keys) = msg.guaranteed_keys {
            self.verifier.set_guaranteed_keys(keys);
        }
        self.node.set_queueable_limit(now, msg.queueable_limit);
        if let Some(t) = msg.shedding_threshold_ms {
            let shed = self.node.shed_to_threshold(now, t);
            if !shed.is_empty() {
                info!(
                    count = shed.len(),
                    threshold_ms = t,
                    "shed queued QUEUEABLE containers"
                );
            }
        }
        if let Some(bound) = msg.replacement_bound_ms {
            let returned = self.node.shed_held_by_guaranteed(now, bound);
            if !returned.is_empty() {
                info!(
                    count = returned.len(),
                    bound_ms = bound,
                    "returned queued QUEUEABLE containers held back by GUARANTEED work"
                );
            }
        }
        self.flush(ctx);
    }
}

/// The link left hints in the [`NodeInbox`] (coalesced there: only the newest matter).
#[derive(Message)]
#[rtype(result = "()")]
pub struct HintsReady;

impl Handler<HintsReady> for NodeActor {
    type Result = ();
    fn handle(&mut self, _: HintsReady, ctx: &mut Context<Self>) {
        if let Some(hints) = self.inbox.take_hints() {
            <Self as Handler<NodeHints>>::handle(self, hints, ctx);
        }
    }
}

/// A command of the coordinator to this node, counted in the link → node queue
/// ([`NodeInbox`]) until it has been handled.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FromCoordinator {
    pub command: CoordinatorCommand,
    /// Dropped once the command is handled (or with the mailbox).
    pub queued: InboxPermit,
}

pub enum CoordinatorCommand {
    Stop(StopOnBehalf),
    Resize(ResizeMsg),
    Promote(ApplyPromotionMsg),
}

impl Handler<FromCoordinator> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: FromCoordinator, ctx: &mut Context<Self>) {
        match msg.command {
            CoordinatorCommand::Stop(m) => <Self as Handler<StopOnBehalf>>::handle(self, m, ctx),
            CoordinatorCommand::Resize(m) => <Self as Handler<ResizeMsg>>::handle(self, m, ctx),
            CoordinatorCommand::Promote(m) => {
                <Self as Handler<ApplyPromotionMsg>>::handle(self, m, ctx)
            }
        }
        drop(msg.queued);
    }
}

/// The coordinator validated a promotion of a container on this node.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ApplyPromotionMsg(pub ApplyPromotion);

impl Handler<ApplyPromotionMsg> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: ApplyPromotionMsg, ctx: &mut Context<Self>) {
        if self.upgrading {
            // Unanswered: the coordinator's promotion fails with the node's session.
            return;
        }
        let ApplyPromotion {
            correlation_id,
            token,
        } = msg.0;
        let result = self
            .verifier
            .verify_signature(&token)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                if token.body.node_id != self.node_id {
                    return Err(format!(
                        "promotion token is for node {}",
                        token.body.node_id
                    ));
                }
                self.node
                    .promote(
                        self.shared.clock.now(),
                        token.body.container_id,
                        token.body.version,
                    )
                    .map_err(|e| e.to_string())
            });
        self.flush(ctx);
        let _ = self
            .link
            .push(WorkerToCoordinator::PromotionApplied(PromotionApplied {
                correlation_id,
                error: result.err(),
            }));
    }
}

/// The coordinator asks to stop a container on the application's behalf.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopOnBehalf {
    pub app: AppId,
    pub container_id: ContainerId,
    /// A released GUARANTEED grant: refuse its token until then if it is not here.
    pub revoke_until_ms: Option<u64>,
    /// The resource shaper's policy preempted it (Pace §3.2): killed as `shaped_preemption`.
    pub shaped_preemption: Option<scheduler_core::shaper::PreemptionReason>,
}

impl Handler<StopOnBehalf> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: StopOnBehalf, ctx: &mut Context<Self>) {
        if self.upgrading {
            return;
        }
        let now = self.shared.clock.now();
        if let Some(until_ms) = msg.revoke_until_ms {
            // Revoke first: whether or not the container started meanwhile, its token must not
            // start it (again) after this.
            self.verifier
                .revoke(msg.container_id, until_ms, now.as_millis());
        }
        if let Some(reason) = msg.shaped_preemption {
            if let Err(e) = self.node.kill(
                now,
                msg.container_id,
                KillReason::ShapedPreemption,
                format!("preempted by the resource shaper: {reason}"),
            ) {
                debug!("shaped preemption of {}: {e}", msg.container_id);
            }
        } else if let Err(e) = self.node.stop(now, msg.container_id, &msg.app) {
            debug!("stop on behalf of {}: {e}", msg.app);
        }
        self.flush(ctx);
    }
}

/// Kill every container (the worker is stopping). The answer resolves once every container's
/// process task has ended, i.e. its processes are killed and reaped and its cgroup emptied:
/// the apps are told `lost`, so nothing may outlive the worker's exit.
#[derive(Message)]
#[rtype(result = "tokio::sync::oneshot::Receiver<()>")]
pub struct KillAll;

impl Handler<KillAll> for NodeActor {
    type Result = MessageResult<KillAll>;
    fn handle(&mut self, _: KillAll, ctx: &mut Context<Self>) -> Self::Result {
        let (all_ended, answer) = tokio::sync::oneshot::channel();
        if self.upgrading {
            // The containers were handed over to the next image: not ours to kill or wait for.
            let _ = all_ended.send(());
            return MessageResult(answer);
        }
        self.stopping = true;
        self.node.kill_all(
            self.shared.clock.now(),
            KillReason::Lost,
            "the worker is shutting down",
        );
        self.flush(ctx);
        if self.processes.is_empty() {
            let _ = all_ended.send(());
        } else {
            self.all_ended.push(all_ended);
        }
        MessageResult(answer)
    }
}

/// Remove the executor's idle cgroups and its roots (the worker is stopping, every container
/// has ended). Answers the roots that could not be removed.
#[derive(Message)]
#[rtype(result = "Vec<std::path::PathBuf>")]
pub struct RemoveCgroups;

impl Handler<RemoveCgroups> for NodeActor {
    type Result = MessageResult<RemoveCgroups>;
    fn handle(&mut self, _: RemoveCgroups, _: &mut Context<Self>) -> Self::Result {
        if self.upgrading {
            return MessageResult(Vec::new());
        }
        MessageResult(self.executor.remove_cgroups())
    }
}

/// Inspect the node runtime (tests, diagnostics).
#[derive(Message)]
#[rtype(result = "NodeSnapshot")]
pub struct Inspect;

#[derive(Debug, Clone)]
pub struct NodeSnapshot {
    pub running: usize,
    pub queued: usize,
    pub allocated: Resources,
    pub processes: usize,
    /// GUARANTEED work running or waiting here (never above the capacity).
    pub guaranteed_committed: Resources,
    /// The session whose GUARANTEED grants this node accepts (`None` before the first join).
    pub session_epoch: Option<u32>,
    /// Grants revoked and not yet expired.
    pub revoked_grants: usize,
    pub invariants: Result<(), String>,
}

impl Handler<Inspect> for NodeActor {
    type Result = MessageResult<Inspect>;
    fn handle(&mut self, _: Inspect, _: &mut Context<Self>) -> Self::Result {
        MessageResult(NodeSnapshot {
            running: self.node.running_count(),
            queued: self.node.queued_count(),
            allocated: self.node.allocated(),
            processes: self.processes.len(),
            guaranteed_committed: self.node.guaranteed_committed(),
            session_epoch: self.verifier.node_epoch(),
            revoked_grants: self.verifier.revoked_count(),
            invariants: self.node.check_invariants(),
        })
    }
}

/// One running container in a hand-over.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunningHandover {
    pub spec: ContainerSpec,
    /// When it started (the worker's wall clock, ms since the Unix epoch).
    pub started_at_ms: u64,
    pub process: HandedProcess,
}

/// The state of a running container's process at the hand-over.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandedProcess {
    /// Still running (or exited and not reaped yet): the next image adopts it.
    Alive(exec::adopt::ProcessHandover),
    /// It ended before the hand-over; the next image reports the end.
    Ended(ProcessEnd),
    /// Its process could not be handed over (named): the next image reports it failed.
    Lost(String),
}

/// A container accepted but not started yet (queued QUEUEABLE, or GUARANTEED waiting).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PendingHandover {
    pub spec: ContainerSpec,
    pub launch: exec::LaunchSpec,
}

/// Everything the node runtime hands to the next worker image.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeHandover {
    pub running: Vec<RunningHandover>,
    /// In submission order (container ids ascend with it per issuer).
    pub pending: Vec<PendingHandover>,
    /// Processes already killed by the runtime and not reaped yet: the next image reaps them.
    pub draining: Vec<exec::adopt::ProcessHandover>,
}

impl NodeHandover {
    /// Every process handed over (adopted or reaped by the next image).
    pub fn processes(&self) -> impl Iterator<Item = &exec::adopt::ProcessHandover> {
        self.running
            .iter()
            .filter_map(|r| match &r.process {
                HandedProcess::Alive(h) => Some(h),
                _ => None,
            })
            .chain(self.draining.iter())
    }
}

/// Stop serving containers and hand them over for an in-place upgrade (the actor then refuses
/// every change; only an `execve` follows).
#[derive(Message)]
#[rtype(result = "NodeHandover")]
pub struct HandOverAll;

impl Handler<HandOverAll> for NodeActor {
    type Result = AtomicResponse<Self, NodeHandover>;
    fn handle(&mut self, _: HandOverAll, _: &mut Context<Self>) -> Self::Result {
        self.upgrading = true;
        self.executor.close_cgroup_pool();
        let mut replies = Vec::new();
        for (id, tx) in &self.processes {
            let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
            if tx.send(ProcCmd::HandOver(reply_tx)).is_ok() {
                replies.push((*id, reply_rx));
            }
        }
        let collect = async move {
            let mut out = HashMap::new();
            for (id, rx) in replies {
                if let Ok(Ok(handover)) = rx.await {
                    out.insert(id, handover);
                }
            }
            out
        };
        AtomicResponse::new(Box::pin(
            collect
                .into_actor(self)
                .map(|mut handed, act, _| act.build_handover(&mut handed)),
        ))
    }
}

impl NodeActor {
    fn build_handover(
        &mut self,
        handed: &mut HashMap<ContainerId, exec::adopt::ProcessHandover>,
    ) -> NodeHandover {
        let now = self.shared.clock.now();
        let mut out = NodeHandover::default();
        let mut ended = self.ended.borrow_mut();
        for status in self.node.statuses() {
            let Some(spec) = self.node.spec(status.id).cloned() else {
                continue;
            };
            if status.placement == Placement::Running {
                let elapsed = self.node.elapsed(now, status.id).unwrap_or_default();
                let started_at_ms = now
                    .as_millis()
                    .saturating_sub(u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX));
                let process = match (handed.remove(&status.id), ended.remove(&status.id)) {
                    (Some(h), _) => HandedProcess::Alive(h),
                    (None, Some(end)) => HandedProcess::Ended(end),
                    (None, None) => HandedProcess::Lost(
                        "its process was neither running nor reported ended at the hand-over"
                            .into(),
                    ),
                };
                out.running.push(RunningHandover {
                    spec,
                    started_at_ms,
                    process,
                });
            } else {
                out.pending.push(PendingHandover {
                    launch: self
                        .launch_specs
                        .get(&status.id)
                        .cloned()
                        .unwrap_or_default(),
                    spec,
                });
            }
        }
        // Killed by the runtime, exit not reaped yet.
        let mut draining: Vec<_> = handed.drain().map(|(_, h)| h).collect();
        draining.sort_by_key(|h| h.container_id);
        out.draining = draining;
        info!(
            running = out.running.len(),
            pending = out.pending.len(),
            draining = out.draining.len(),
            "containers handed over for the upgrade"
        );
        out
    }
}

/// Take back what an earlier image of this worker handed over (before the first join, so the
/// join reports the adopted containers running). Returns how many running containers were
/// adopted.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Restore(pub NodeHandover);

impl Handler<Restore> for NodeActor {
    type Result = usize;
    fn handle(&mut self, msg: Restore, ctx: &mut Context<Self>) -> usize {
        let NodeHandover {
            running,
            pending,
            draining,
        } = msg.0;
        let now = self.shared.clock.now();
        let mut adopted = 0;
        let mut ends = Vec::new();
        for r in running {
            let id = r.spec.id;
            self.owners.insert(id, r.spec.app_id.clone());
            self.adopted.insert(id);
            let started_at = Time::from_millis(r.started_at_ms.min(now.as_millis()));
            if let Err(e) = self.node.adopt_running(started_at, r.spec) {
                // Not booked here, so killed, and its end told to its app and the coordinator.
                if let HandedProcess::Alive(h) = &r.process {
                    exec::adopt::kill_unadoptable(h);
                }
                let message = format!("could not be taken back after the worker upgrade: {e}");
                warn!(container = %id, "{message}");
                self.reports.finished(id);
                if id.issuer() == 0 && self.shared.connected.get() {
                    let _ = self.link.push(WorkerToCoordinator::GuaranteedFinished(
                        GuaranteedFinished { finished: vec![id] },
                    ));
                }
                self.event(
                    id,
                    ContainerEventKind::Killed {
                        reason: KillReason::Lost,
                        message,
                    },
                );
                self.owners.remove(&id);
                continue;
            }
            match r.process {
                HandedProcess::Alive(h) => match self.executor.adopt(&h) {
                    Ok(proc) => {
                        adopted += 1;
                        self.supervise_adopted(ctx, id, proc);
                    }
                    Err(e) => {
                        exec::adopt::kill_unadoptable(&h);
                        let message = format!(
                            "killed: its process could not be taken back after the worker upgrade: {e}"
                        );
                        warn!(container = %id, "{message}");
                        let _ = self.node.on_failure(now, id, message);
                    }
                },
                HandedProcess::Ended(end) => ends.push((id, end)),
                HandedProcess::Lost(why) => {
                    let _ =
                        self.node
                            .on_failure(now, id, format!("lost in the worker upgrade: {why}"));
                }
            }
        }
        for (id, end) in ends {
            self.process_ended(ctx, id, end);
        }
        for p in pending {
            let id = p.spec.id;
            self.owners.insert(id, p.spec.app_id.clone());
            self.adopted.insert(id);
            self.launch_specs.insert(id, p.launch);
            if let Err(e) = self.node.submit(now, p.spec) {
                self.launch_specs.remove(&id);
                warn!(container = %id, "a waiting container could not be taken back after the upgrade: {e}");
                self.reports.finished(id);
                self.event(
                    id,
                    ContainerEventKind::Killed {
                        reason: KillReason::Lost,
                        message: format!("could not be taken back after the worker upgrade: {e}"),
                    },
                );
                self.owners.remove(&id);
            }
        }
        for h in draining {
            // Killed before the upgrade: only reaped (and its cgroup and record removed).
            match self.executor.adopt(&h) {
                Ok(mut proc) => {
                    let _ = proc.kill_tree();
                    actix_rt::spawn(async move {
                        proc.wait().await;
                    });
                }
                Err(_) => exec::adopt::kill_unadoptable(&h),
            }
        }
        self.flush(ctx);
        adopted
    }
}

impl NodeActor {
    fn supervise_adopted(
        &mut self,
        ctx: &mut Context<Self>,
        id: ContainerId,
        proc: ContainerProcess,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.processes.insert(id, tx);
        let (app, job) = self
            .node
            .spec(id)
            .map(|s| (s.app_id.to_string(), s.job_id.to_string()))
            .unwrap_or_default();
        let span = tracing::info_span!("container", node = %self.node_id, container = %id, app = %app, job = %job);
        actix_rt::spawn(tracing::Instrument::instrument(
            supervise(proc, id, rx, ctx.address(), self.ended.clone()),
            span,
        ));
    }
}
