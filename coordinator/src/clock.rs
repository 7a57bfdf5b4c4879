//! The coordinator's time source: [`scheduler_core::time::Clock`] (shared with the worker) reading
//! the operating system's wall clock, or a manual clock in tests.

use scheduler_core::Time;
pub use scheduler_core::time::Clock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The operating system's wall clock, µs since the Unix epoch.
pub fn system() -> Clock {
    Clock::Wall(os_wall_time)
}

fn os_wall_time() -> Time {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    Time::from_micros(since.as_micros().min(u64::MAX as u128) as u64)
}
