//! worker
pub mod exec;
