//! The coordinator process of the hybrid scheduler: QUIC server for the cluster protocol,
//! coordinator actor (membership, heartbeats, top-k views, shedding threshold, notice routing,
//! node timeouts, key rotation, promotion) and guarantor actor (central GUARANTEED placement),
//! over a redb store. Policies live in `scheduler_core`; this crate decodes, calls and sends.

pub mod admin;
pub mod app_cert;
pub mod check;
pub mod clock;
pub mod config;
pub mod contracts;
pub mod coordinator_actor;
pub mod dashboard;
pub mod datadir;
pub mod guarantor_actor;
pub mod metrics;
pub mod operator_cli;
pub mod server;
pub mod session;
pub mod store;

pub use clock::Clock;
pub use config::CoordinatorSettings;
pub use server::{CoordinatorServer, StartError, start};
