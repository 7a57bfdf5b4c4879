//! The testbed: local-cluster launcher, load generator (a job manager speaking the app
//! protocol), the synthetic task program, and the discrete-event simulator that drives the
//! production `scheduler-core` policies under a virtual clock.
//!
//! Each subcommand of the `testbed` binary lives in its own module below.

pub mod client;
pub mod demo;
pub mod demo_3sigma;
pub mod demo_shaping;
pub mod experiment;
pub mod fleet;
pub mod floor;
pub mod fuzz;
pub mod load;
pub mod local;
pub mod partition;
pub mod plan;
pub mod quic_floor;
pub mod reservations;
pub mod sim;
pub mod task;
pub mod traces;
pub mod workload;
