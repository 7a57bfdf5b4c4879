//! An async client of the application protocol (`docs/protocol.md`).
//!
//! - [`AppClient`]: one authenticated connection to one worker over TLS (`tls://host:port`,
//!   verified with the cluster CA given in [`ConnectOptions`]), a Unix socket (`unix:///path`)
//!   or plaintext TCP (`tcp://host:port` or a bare `host:port`). Many requests may be in flight at once: a reader task matches every answer
//!   to its request by `request_id` (single answers through a oneshot channel; the several
//!   `allocated` frames of a GUARANTEED ask through a per-request channel until
//!   `remaining == 0`) and forwards `event` frames to a channel the caller owns.
//! - [`ClientPool`]: one subscribed connection per worker endpoint, for starting containers
//!   on the node named in their grant; every connection's events go to one channel.
//! - [`ClientError`]: transport failures, and the worker's [`ErrorFrame`] when it refused a
//!   request (with its code, retryability and whether the worker closed the connection).
//!
//! [`ErrorFrame`]: scheduler_core::protocol::app::ErrorFrame
//!
//! Other Rust programs use it as a library (`testbed = { path = "..." }`; the crate's binary is
//! not needed). A small job manager: two GUARANTEED containers, each started on the node its
//! grant names, waited for until they end.
//!
//! ```no_run
//! use scheduler_core::protocol::app::{Allocate, ContainerEventKind, LaunchSpec};
//! use scheduler_core::{ContainerType, Resources};
//! use testbed::client::{ClientPool, ConnectOptions};
//!
//! # async fn job() -> Result<(), Box<dyn std::error::Error>> {
//! // Credentials from `coordinator init` / `coordinator apps add`; the cluster CA pins workers.
//! let options = ConnectOptions::with_ca_cert(std::path::Path::new("ca.pem"))?;
//! let (pool, mut events) = ClientPool::with_options("etl", "APP-SECRET", options);
//! // Any worker takes asks; GUARANTEED ones go on to the coordinator's guarantor.
//! let local = pool.get("tls://worker-1.example:7500").await?;
//! let submitted_ms = 1_764_000_000_000;
//! let ask = Allocate::new(Resources::new(500, 512), 2, ContainerType::Guaranteed, "job-1", submitted_ms);
//! let granted = local.allocate(ask).await?;
//! for grant in &granted.containers {
//!     let launch = LaunchSpec {
//!         command: "/bin/sh".into(),
//!         args: vec!["-c".into(), "echo hello".into()],
//!         ..Default::default()
//!     };
//!     pool.start(grant, launch).await?;
//! }
//! // Events of every connection of the pool arrive here (each connection is subscribed).
//! let mut running = granted.containers.len();
//! while running > 0 {
//!     let Some(event) = events.recv().await else { break };
//!     match event.event {
//!         ContainerEventKind::Completed { exit_code } => {
//!             println!("{} exited with {exit_code}", event.container_id);
//!             running -= 1;
//!         }
//!         ContainerEventKind::Killed { reason, message } => {
//!             println!("{} killed ({reason}): {message}", event.container_id);
//!             running -= 1;
//!         }
//!         _ => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod connection;
mod error;
mod pool;

pub use connection::{AppClient, ConnectOptions, Endpoint};
pub use error::ClientError;
pub use pool::ClientPool;
