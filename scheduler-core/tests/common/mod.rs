//! Builders shared by the scenario tests (each test file is its own crate and includes this).

use scheduler_core::guarantor::GuaranteedAsk;
use scheduler_core::{AppId, JobId, Resources};

/// A GUARANTEED ask of app "app", job "j", no locality and no runtime estimate.
pub fn guaranteed_ask(key: u64, resources: Resources, count: u32) -> GuaranteedAsk {
    GuaranteedAsk {
        ask_key: key,
        app_id: AppId::from("app"),
        resources,
        count,
        priority: 0,
        locality: None,
        runtime_estimate_ms: None,
        job_id: JobId::from("j"),
        job_submit_time_ms: 0,
        role: Default::default(),
        allow_shaping: false,
    }
}
