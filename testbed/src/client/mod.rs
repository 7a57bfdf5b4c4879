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

mod connection;
mod error;
mod pool;

pub use connection::{AppClient, ConnectOptions, Endpoint};
pub use error::ClientError;
pub use pool::ClientPool;
