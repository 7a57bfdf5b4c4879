//! One typed configuration for `coordinator run`: defaults, overridden by the TOML file given
//! with `--config`, overridden by command-line flags (and their environment variables).

use inference::forecast::shaping::ForecasterKind;
use scheduler_core::coordinator::SheddingPolicy;
use scheduler_core::loss_guard::LossGuardConfig;
use scheduler_core::reservation::dra::Dra;
use scheduler_core::reservation::{Algorithm, PlanConfig};
use scheduler_core::shaper::PreemptionPolicy;
use scheduler_core::shaping::ShapingConfig;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything the running coordinator needs.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorSettings {
    /// Directory holding the CA, server certificate, join token and the store.
    pub data_dir: PathBuf,
    /// QUIC listen address.
    pub listen: SocketAddr,
    /// k of the top-k list (Mercury §7.2.2: 50 was best on 256 nodes).
    pub top_k: usize,
    /// Shedding threshold policy (Mercury §4.3; §7.2.3 compares avg+σ and avg+2σ).
    pub shedding: SheddingPolicy,
    /// Floor of the shedding threshold, so an idle cluster does not shed tiny queues.
    pub min_shedding_threshold_ms: f64,
    /// A worker silent this long is lost.
    pub node_timeout: Duration,
    /// Heartbeat period workers are told to use.
    pub heartbeat_interval: Duration,
    /// Validity of GUARANTEED grant tokens (and the one workers use for QUEUEABLE ones).
    pub token_ttl: Duration,
    /// Period of token-key rotation; the ring keeps the previous key.
    pub key_rotation: Duration,
    /// How often the periodic work runs (node-timeout sweep, grant expiry, key rotation).
    pub tick_interval: Duration,
    /// Seed of the RNG used for top-k tie breaks; drawn from the OS (and logged) if absent.
    pub seed: Option<u64>,
    /// A connection that has not been answered a `join` by then (handshake, stream and join
    /// frame included) is closed.
    pub join_timeout: Duration,
    /// Connections not joined yet, in all; more are refused before the QUIC handshake.
    pub max_unjoined_connections: usize,
    /// Connections not joined yet from one IP address; more are refused before the handshake.
    pub max_unjoined_per_source: usize,
    /// Bytes of join answers (each carries the whole directory) let be in delivery at once:
    /// the join pacing's budget ([`scheduler_core::join_pacing`]); joins past it wait for their
    /// turn.
    pub join_answer_bytes_in_flight: u64,
    /// The share of the nodes silent at once from which silent nodes are no longer all
    /// declared lost: the coordinator presumes the fault is its own or the network's
    /// ([`scheduler_core::loss_guard`]; Kubernetes' unhealthy-zone threshold, 0.55). Above 1 the
    /// rule is off.
    pub mass_silence_share: f64,
    /// Nodes declared lost per second while that share is silent and some nodes are still heard
    /// (Kubernetes' secondary eviction rate, 0.01); with every node silent, none is.
    pub declarations_per_s_in_mass_silence: f64,
    /// HTTP address of `GET /metrics` (Prometheus); off when absent.
    pub metrics_listen: Option<SocketAddr>,
    /// Pace's resource shaper for GUARANTEED containers that allow it; off when absent.
    pub shaping: Option<ShapingSettings>,
    /// 3σSched for GUARANTEED asks with a job description; off when absent (such asks are
    /// then refused).
    pub threesigma: Option<scheduler_core::threesigma::LiveThreeSigmaConfig>,
    /// The reservation plan (Morpheus §6): step, agenda length, placement algorithm. A plan
    /// restored from the store keeps its own step and agenda (its reservations were placed on
    /// them); the rest applies.
    pub plan: PlanConfig,
    /// Dynamic reprovisioning (Morpheus §7): T, ρ and how far back "recent" goes.
    pub dra: Dra,
}

/// The resource shaper's settings (Pace §3, §5; defaults from the paper).
#[derive(Clone, Debug, PartialEq)]
pub struct ShapingSettings {
    pub config: ShapingConfig,
    pub forecaster: ForecasterKind,
    /// Redo each series' fit every this many passes (1: every pass, as Pace; docs/benchmarks.md
    /// §7b measures the cost).
    pub refit_every: usize,
}

impl CoordinatorSettings {
    /// Defaults for a data dir.
    pub fn new(data_dir: impl Into<PathBuf>) -> CoordinatorSettings {
        CoordinatorSettings {
            data_dir: data_dir.into(),
            listen: SocketAddr::from(([0, 0, 0, 0], 7400)),
            top_k: 50,
            shedding: SheddingPolicy::MeanPlusSigma { n: 1.0 },
            min_shedding_threshold_ms: 100.0,
            node_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            token_ttl: Duration::from_secs(600),
            key_rotation: Duration::from_secs(3600),
            tick_interval: Duration::from_millis(500),
            seed: None,
            join_timeout: Duration::from_secs(10),
            max_unjoined_connections: 256,
            max_unjoined_per_source: 32,
            join_answer_bytes_in_flight: scheduler_core::join_pacing::JOIN_ANSWER_BYTES_IN_FLIGHT,
            mass_silence_share: LossGuardConfig::default().mass_silence_share,
            declarations_per_s_in_mass_silence: LossGuardConfig::default()
                .declarations_per_s_in_mass_silence,
            metrics_listen: None,
            shaping: None,
            threesigma: Some(Default::default()),
            plan: PlanConfig::default(),
            dra: Dra::default(),
        }
    }

    /// The loss guard's settings ([`scheduler_core::loss_guard`]): silence is checked at every
    /// tick.
    pub fn loss_guard(&self) -> LossGuardConfig {
        LossGuardConfig {
            check_interval: self.tick_interval,
            mass_silence_share: self.mass_silence_share,
            declarations_per_s_in_mass_silence: self.declarations_per_s_in_mass_silence,
        }
    }

    /// Refuse settings that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, why: &str| {
            Err(ConfigError::Invalid {
                field,
                reason: why.to_string(),
            })
        };
        if self.top_k == 0 {
            return bad("top_k", "must be at least 1");
        }
        if self.node_timeout <= self.heartbeat_interval {
            return bad(
                "node_timeout_ms",
                "must be longer than heartbeat_interval_ms, or every node is lost between heartbeats",
            );
        }
        if self.heartbeat_interval.is_zero() {
            return bad("heartbeat_interval_ms", "must be positive");
        }
        if self.token_ttl.is_zero() {
            return bad("token_ttl_ms", "must be positive");
        }
        if self.key_rotation < self.token_ttl {
            return bad(
                "key_rotation_ms",
                "must be at least token_ttl_ms, or tokens would outlive the previous key",
            );
        }
        if self.tick_interval.is_zero() {
            return bad("tick_interval_ms", "must be positive");
        }
        if self.join_timeout.is_zero() {
            return bad("join_timeout_ms", "must be positive");
        }
        if self.max_unjoined_connections == 0 || self.max_unjoined_per_source == 0 {
            return bad(
                "max_unjoined_connections",
                "max_unjoined_connections and max_unjoined_per_source must be at least 1",
            );
        }
        if self.join_answer_bytes_in_flight == 0 {
            return bad("join_answer_bytes_in_flight", "must be at least 1");
        }
        if let Err((field, reason)) = self.loss_guard().validate() {
            return bad(field, &reason);
        }
        if !self.min_shedding_threshold_ms.is_finite() || self.min_shedding_threshold_ms < 0.0 {
            return bad("min_shedding_threshold_ms", "must be a non-negative number");
        }
        if let Some(shaping) = &self.shaping
            && let Err(reason) = shaping.config.validate()
        {
            return bad("shaping", &reason);
        }
        if let Some(threesigma) = &self.threesigma
            && let Err(reason) = threesigma.validate()
        {
            return bad("threesigma", &reason);
        }
        let plan = &self.plan;
        if plan.step_ms == 0 {
            return bad("plan_step_ms", "must be positive");
        }
        if plan.horizon_ms < MIN_PLAN_HORIZON_MS {
            return bad(
                "plan_horizon_ms",
                &format!(
                    "{} ms is shorter than the longest period a reservation may recur with (one day, {MIN_PLAN_HORIZON_MS} ms)",
                    plan.horizon_ms
                ),
            );
        }
        if !plan.horizon_ms.is_multiple_of(plan.step_ms) {
            return bad(
                "plan_horizon_ms",
                &format!(
                    "{} ms is not a whole number of plan steps ({} ms)",
                    plan.horizon_ms, plan.step_ms
                ),
            );
        }
        if plan.smoothness == 0 {
            return bad("plan_smoothness", "must be at least 1");
        }
        if self.dra.extension_ms == 0 {
            return bad("dra_extension_ms", "must be positive");
        }
        if !self.dra.rho.is_finite() || self.dra.rho < 1.0 {
            return bad(
                "dra_rho",
                "must be a number of at least 1 (ρ caps a stretch at ρ times the recent allocation)",
            );
        }
        if self.dra.recent_ms == 0 {
            return bad("dra_recent_ms", "must be positive");
        }
        Ok(())
    }
}

/// The plan's agenda must hold the longest period a reservation may recur with (one day).
pub const MIN_PLAN_HORIZON_MS: u64 = 24 * 60 * 60 * 1000;

/// The TOML file: the same keys as the `run` flags, all optional.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub top_k: Option<usize>,
    pub shedding: Option<String>,
    pub min_shedding_threshold_ms: Option<f64>,
    pub node_timeout_ms: Option<u64>,
    pub heartbeat_interval_ms: Option<u64>,
    pub token_ttl_ms: Option<u64>,
    pub key_rotation_ms: Option<u64>,
    pub tick_interval_ms: Option<u64>,
    pub seed: Option<u64>,
    pub join_timeout_ms: Option<u64>,
    pub max_unjoined_connections: Option<usize>,
    pub max_unjoined_per_source: Option<usize>,
    pub join_answer_bytes_in_flight: Option<u64>,
    pub mass_silence_share: Option<f64>,
    pub declarations_per_s_in_mass_silence: Option<f64>,
    pub metrics_listen: Option<SocketAddr>,
    /// Turn the resource shaper on.
    pub shaping: Option<bool>,
    pub shaping_interval_ms: Option<u64>,
    pub shaping_k1: Option<f64>,
    pub shaping_k2: Option<f64>,
    /// `gp` or `arima`.
    pub shaping_forecaster: Option<String>,
    /// `pessimistic` or `optimistic`.
    pub shaping_policy: Option<String>,
    pub shaping_refit_every: Option<usize>,
    /// Plan asks with a job description with 3Sigma (default on).
    pub threesigma: Option<bool>,
    pub threesigma_cycle_ms: Option<u64>,
    pub threesigma_step_s: Option<f64>,
    /// Length of a plan step (Morpheus §6.1), ms.
    pub plan_step_ms: Option<u64>,
    /// Length of the agenda, ms: at least one day, a multiple of every period.
    pub plan_horizon_ms: Option<u64>,
    /// `lowcost` (LowCost, greedy fallback) or `greedy`.
    pub plan_algorithm: Option<String>,
    /// Place reservations early in their window instead of late.
    pub plan_allocate_left: Option<bool>,
    /// LowCost's smoothness factor.
    pub plan_smoothness: Option<u32>,
    /// DRA's T: how long one stretch lasts, ms.
    pub dra_extension_ms: Option<u64>,
    /// DRA's ρ.
    pub dra_rho: Option<f64>,
    /// How far back DRA's "recent allocation" goes, ms.
    pub dra_recent_ms: Option<u64>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.to_path_buf(),
            source: e,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// `self` over `lower`: a key set here wins.
    pub fn or(self, lower: FileConfig) -> FileConfig {
        FileConfig {
            data_dir: self.data_dir.or(lower.data_dir),
            listen: self.listen.or(lower.listen),
            top_k: self.top_k.or(lower.top_k),
            shedding: self.shedding.or(lower.shedding),
            min_shedding_threshold_ms: self
                .min_shedding_threshold_ms
                .or(lower.min_shedding_threshold_ms),
            node_timeout_ms: self.node_timeout_ms.or(lower.node_timeout_ms),
            heartbeat_interval_ms: self.heartbeat_interval_ms.or(lower.heartbeat_interval_ms),
            token_ttl_ms: self.token_ttl_ms.or(lower.token_ttl_ms),
            key_rotation_ms: self.key_rotation_ms.or(lower.key_rotation_ms),
            tick_interval_ms: self.tick_interval_ms.or(lower.tick_interval_ms),
            seed: self.seed.or(lower.seed),
            join_timeout_ms: self.join_timeout_ms.or(lower.join_timeout_ms),
            max_unjoined_connections: self
                .max_unjoined_connections
                .or(lower.max_unjoined_connections),
            max_unjoined_per_source: self
                .max_unjoined_per_source
                .or(lower.max_unjoined_per_source),
            join_answer_bytes_in_flight: self
                .join_answer_bytes_in_flight
                .or(lower.join_answer_bytes_in_flight),
            mass_silence_share: self.mass_silence_share.or(lower.mass_silence_share),
            declarations_per_s_in_mass_silence: self
                .declarations_per_s_in_mass_silence
                .or(lower.declarations_per_s_in_mass_silence),
            metrics_listen: self.metrics_listen.or(lower.metrics_listen),
            shaping: self.shaping.or(lower.shaping),
            shaping_interval_ms: self.shaping_interval_ms.or(lower.shaping_interval_ms),
            shaping_k1: self.shaping_k1.or(lower.shaping_k1),
            shaping_k2: self.shaping_k2.or(lower.shaping_k2),
            shaping_forecaster: self.shaping_forecaster.or(lower.shaping_forecaster),
            shaping_policy: self.shaping_policy.or(lower.shaping_policy),
            shaping_refit_every: self.shaping_refit_every.or(lower.shaping_refit_every),
            threesigma: self.threesigma.or(lower.threesigma),
            threesigma_cycle_ms: self.threesigma_cycle_ms.or(lower.threesigma_cycle_ms),
            threesigma_step_s: self.threesigma_step_s.or(lower.threesigma_step_s),
            plan_step_ms: self.plan_step_ms.or(lower.plan_step_ms),
            plan_horizon_ms: self.plan_horizon_ms.or(lower.plan_horizon_ms),
            plan_algorithm: self.plan_algorithm.or(lower.plan_algorithm),
            plan_allocate_left: self.plan_allocate_left.or(lower.plan_allocate_left),
            plan_smoothness: self.plan_smoothness.or(lower.plan_smoothness),
            dra_extension_ms: self.dra_extension_ms.or(lower.dra_extension_ms),
            dra_rho: self.dra_rho.or(lower.dra_rho),
            dra_recent_ms: self.dra_recent_ms.or(lower.dra_recent_ms),
        }
    }

    /// Fill the defaults and check the result.
    pub fn into_settings(self) -> Result<CoordinatorSettings, ConfigError> {
        let data_dir = self.data_dir.ok_or(ConfigError::Missing("data_dir"))?;
        let mut s = CoordinatorSettings::new(data_dir);
        if let Some(v) = self.listen {
            s.listen = v;
        }
        if let Some(v) = self.top_k {
            s.top_k = v;
        }
        if let Some(v) = self.shedding {
            s.shedding = v.parse().map_err(|reason| ConfigError::Invalid {
                field: "shedding",
                reason,
            })?;
        }
        if let Some(v) = self.min_shedding_threshold_ms {
            s.min_shedding_threshold_ms = v;
        }
        if let Some(v) = self.node_timeout_ms {
            s.node_timeout = Duration::from_millis(v);
        }
        if let Some(v) = self.heartbeat_interval_ms {
            s.heartbeat_interval = Duration::from_millis(v);
        }
        if let Some(v) = self.token_ttl_ms {
            s.token_ttl = Duration::from_millis(v);
        }
        if let Some(v) = self.key_rotation_ms {
            s.key_rotation = Duration::from_millis(v);
        }
        if let Some(v) = self.tick_interval_ms {
            s.tick_interval = Duration::from_millis(v);
        }
        s.seed = self.seed;
        if let Some(v) = self.join_timeout_ms {
            s.join_timeout = Duration::from_millis(v);
        }
        if let Some(v) = self.max_unjoined_connections {
            s.max_unjoined_connections = v;
        }
        if let Some(v) = self.max_unjoined_per_source {
            s.max_unjoined_per_source = v;
        }
        if let Some(v) = self.join_answer_bytes_in_flight {
            s.join_answer_bytes_in_flight = v;
        }
        if let Some(v) = self.mass_silence_share {
            s.mass_silence_share = v;
        }
        if let Some(v) = self.declarations_per_s_in_mass_silence {
            s.declarations_per_s_in_mass_silence = v;
        }
        s.metrics_listen = self.metrics_listen;
        if self.shaping == Some(true) {
            let mut config = ShapingConfig::default();
            if let Some(v) = self.shaping_interval_ms {
                config.interval_ms = v;
            }
            if let Some(v) = self.shaping_k1 {
                config.buffer.k1 = v;
            }
            if let Some(v) = self.shaping_k2 {
                config.buffer.k2 = v;
            }
            if let Some(v) = self.shaping_policy {
                config.policy = match v.as_str() {
                    "pessimistic" => PreemptionPolicy::Pessimistic,
                    "optimistic" => PreemptionPolicy::Optimistic,
                    other => {
                        return Err(ConfigError::Invalid {
                            field: "shaping_policy",
                            reason: format!(
                                "{other:?}: expected \"pessimistic\" or \"optimistic\""
                            ),
                        });
                    }
                };
            }
            let forecaster = match self.shaping_forecaster {
                Some(v) => v.parse().map_err(|reason| ConfigError::Invalid {
                    field: "shaping_forecaster",
                    reason,
                })?,
                None => ForecasterKind::Gp,
            };
            let refit_every = self.shaping_refit_every.unwrap_or(1);
            if refit_every == 0 {
                return Err(ConfigError::Invalid {
                    field: "shaping_refit_every",
                    reason: "must be at least 1".into(),
                });
            }
            s.shaping = Some(ShapingSettings {
                config,
                forecaster,
                refit_every,
            });
        }
        if self.threesigma == Some(false) {
            s.threesigma = None;
        } else if let Some(t) = &mut s.threesigma {
            if let Some(v) = self.threesigma_cycle_ms {
                t.cycle_ms = v;
            }
            if let Some(v) = self.threesigma_step_s {
                t.step_s = v;
            }
        }
        if let Some(v) = self.plan_step_ms {
            s.plan.step_ms = v;
        }
        if let Some(v) = self.plan_horizon_ms {
            s.plan.horizon_ms = v;
        }
        if let Some(v) = self.plan_algorithm {
            s.plan.algorithm = match v.as_str() {
                "lowcost" => Algorithm::LowCost,
                "greedy" => Algorithm::Greedy,
                other => {
                    return Err(ConfigError::Invalid {
                        field: "plan_algorithm",
                        reason: format!("{other:?}: expected \"lowcost\" or \"greedy\""),
                    });
                }
            };
        }
        if let Some(v) = self.plan_allocate_left {
            s.plan.allocate_left = v;
        }
        if let Some(v) = self.plan_smoothness {
            s.plan.smoothness = v;
        }
        if let Some(v) = self.dra_extension_ms {
            s.dra.extension_ms = v;
        }
        if let Some(v) = self.dra_rho {
            s.dra.rho = v;
        }
        if let Some(v) = self.dra_recent_ms {
            s.dra.recent_ms = v;
        }
        s.validate()?;
        Ok(s)
    }
}

/// Configuration errors, naming the file or field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{0} is required (flag, environment variable or config file)")]
    Missing(&'static str),
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example shipped for bare-metal installs (deploy/config) stays valid.
    #[test]
    fn the_example_config_in_deploy_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/config/coordinator.toml");
        let s = FileConfig::load(&path).unwrap().into_settings().unwrap();
        assert_eq!(s.data_dir, Path::new("/var/lib/hybrid"));
        assert_eq!(s.top_k, 50);
        assert_eq!(s.metrics_listen, Some("127.0.0.1:9400".parse().unwrap()));
        assert_eq!(s.plan, PlanConfig::default());
        assert_eq!(s.dra, Dra::default());
    }

    #[test]
    fn flags_win_over_file_and_file_over_defaults() {
        let file: FileConfig = toml::from_str(
            "data_dir = \"/d\"\ntop_k = 7\nnode_timeout_ms = 3000\nshedding = \"avg+2sigma\"",
        )
        .unwrap();
        let flags = FileConfig {
            top_k: Some(9),
            ..Default::default()
        };
        let s = flags.or(file).into_settings().unwrap();
        assert_eq!(s.top_k, 9);
        assert_eq!(s.node_timeout, Duration::from_secs(3));
        assert_eq!(s.shedding, SheddingPolicy::MeanPlusSigma { n: 2.0 });
        assert_eq!(s.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(s.data_dir, PathBuf::from("/d"));
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_read_from_the_file() {
        let s = FileConfig {
            data_dir: Some("/d".into()),
            ..Default::default()
        }
        .into_settings()
        .unwrap();
        assert_eq!(s.metrics_listen, None);
        let file: FileConfig =
            toml::from_str("data_dir = \"/d\"\nmetrics_listen = \"127.0.0.1:9400\"").unwrap();
        let s = file.into_settings().unwrap();
        assert_eq!(s.metrics_listen, Some("127.0.0.1:9400".parse().unwrap()));
        let err = toml::from_str::<FileConfig>("metrics_listen = \"localhost\"").unwrap_err();
        assert!(err.to_string().contains("metrics_listen"), "{err}");
    }

    #[test]
    fn shaping_is_off_by_default_and_its_bad_values_are_named() {
        let base = || FileConfig {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        assert_eq!(base().into_settings().unwrap().shaping, None);
        let file: FileConfig = toml::from_str(
            "data_dir = \"/d\"\nshaping = true\nshaping_k2 = 1.0\nshaping_forecaster = \"arima\"",
        )
        .unwrap();
        let s = file.into_settings().unwrap().shaping.expect("on");
        assert_eq!(s.forecaster, ForecasterKind::Arima);
        assert_eq!((s.config.buffer.k1, s.config.buffer.k2), (0.05, 1.0));
        assert_eq!(s.config.interval_ms, 60_000);
        assert_eq!(s.config.policy, PreemptionPolicy::Pessimistic);
        assert_eq!(s.refit_every, 1);
        for (bad, field) in [
            (
                FileConfig {
                    shaping_refit_every: Some(0),
                    ..base()
                },
                "shaping_refit_every",
            ),
            (
                FileConfig {
                    shaping_forecaster: Some("lstm".into()),
                    ..base()
                },
                "shaping_forecaster",
            ),
            (
                FileConfig {
                    shaping_policy: Some("random".into()),
                    ..base()
                },
                "shaping_policy",
            ),
            (
                FileConfig {
                    shaping_k1: Some(-1.0),
                    ..base()
                },
                "k1",
            ),
            (
                FileConfig {
                    shaping_interval_ms: Some(0),
                    ..base()
                },
                "interval_ms",
            ),
        ] {
            let bad = FileConfig {
                shaping: Some(true),
                ..bad
            };
            let err = bad.into_settings().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn plan_settings_default_to_the_paper_s_and_their_bad_values_are_named() {
        let base = || FileConfig {
            data_dir: Some("/d".into()),
            ..Default::default()
        };
        let s = base().into_settings().unwrap();
        assert_eq!(s.plan, PlanConfig::default());
        assert_eq!(
            (s.plan.step_ms, s.plan.horizon_ms),
            (60_000, MIN_PLAN_HORIZON_MS)
        );
        assert_eq!(s.plan.algorithm, Algorithm::LowCost);
        assert_eq!(
            (s.dra.extension_ms, s.dra.rho, s.dra.recent_ms),
            (60_000, 2.0, 120_000)
        );
        let file: FileConfig = toml::from_str(
            "data_dir = \"/d\"\nplan_step_ms = 300000\nplan_horizon_ms = 604800000\nplan_algorithm = \"greedy\"\nplan_allocate_left = true\ndra_rho = 1.5",
        )
        .unwrap();
        let s = file.into_settings().unwrap();
        assert_eq!(
            (s.plan.step_ms, s.plan.horizon_ms, s.plan.algorithm),
            (300_000, 7 * MIN_PLAN_HORIZON_MS, Algorithm::Greedy)
        );
        assert!(s.plan.allocate_left);
        assert_eq!(s.dra.rho, 1.5);
        for (bad, field) in [
            (
                FileConfig {
                    plan_step_ms: Some(0),
                    ..base()
                },
                "plan_step_ms",
            ),
            (
                FileConfig {
                    plan_horizon_ms: Some(3_600_000),
                    ..base()
                },
                "plan_horizon_ms",
            ),
            (
                FileConfig {
                    plan_step_ms: Some(7_000),
                    ..base()
                },
                "plan_horizon_ms",
            ),
            (
                FileConfig {
                    plan_algorithm: Some("milp".into()),
                    ..base()
                },
                "plan_algorithm",
            ),
            (
                FileConfig {
                    plan_smoothness: Some(0),
                    ..base()
                },
                "plan_smoothness",
            ),
            (
                FileConfig {
                    dra_rho: Some(0.5),
                    ..base()
                },
                "dra_rho",
            ),
            (
                FileConfig {
                    dra_extension_ms: Some(0),
                    ..base()
                },
                "dra_extension_ms",
            ),
            (
                FileConfig {
                    dra_recent_ms: Some(0),
                    ..base()
                },
                "dra_recent_ms",
            ),
        ] {
            let err = bad.into_settings().unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_named() {
        let err = toml::from_str::<FileConfig>("topk = 3").unwrap_err();
        assert!(err.to_string().contains("topk"), "{err}");
        let err = FileConfig {
            data_dir: Some("/d".into()),
            node_timeout_ms: Some(500),
            ..Default::default()
        }
        .into_settings()
        .unwrap_err();
        assert!(err.to_string().contains("node_timeout_ms"), "{err}");
        for (share, rate, field) in [
            (0.0, 0.01, "mass_silence_share"),
            (f64::NAN, 0.01, "mass_silence_share"),
            (0.55, -1.0, "declarations_per_s_in_mass_silence"),
        ] {
            let err = FileConfig {
                data_dir: Some("/d".into()),
                mass_silence_share: Some(share),
                declarations_per_s_in_mass_silence: Some(rate),
                ..Default::default()
            }
            .into_settings()
            .unwrap_err();
            assert!(err.to_string().contains(field), "{err}");
        }
        assert!(matches!(
            FileConfig::default().into_settings(),
            Err(ConfigError::Missing("data_dir"))
        ));
    }
}
