//! The time source of the actors. The core takes `now` from its callers; the actors take it from
//! a [`Clock`]: the wall clock in production, a hand-driven clock in tests (so node timeouts,
//! token expiries and key rotations are exercised without sleeping).

use scheduler_core::Time;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The operating system's wall clock.
    System,
    /// A clock that moves only when told to.
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// A manual clock starting at `start`.
    pub fn manual(start: Time) -> Clock {
        Clock::Manual(Arc::new(AtomicU64::new(start.as_micros())))
    }

    pub fn now(&self) -> Time {
        match self {
            Clock::System => {
                let since = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                Time::from_micros(since.as_micros().min(u64::MAX as u128) as u64)
            }
            Clock::Manual(t) => Time::from_micros(t.load(Ordering::SeqCst)),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.now().as_millis()
    }

    /// Move a manual clock forward; no effect on the system clock.
    pub fn advance(&self, by: Duration) {
        if let Clock::Manual(t) = self {
            t.fetch_add(
                by.as_micros().min(u64::MAX as u128) as u64,
                Ordering::SeqCst,
            );
        }
    }
}
