//! Identifiers. Strings for names chosen by operators and applications; a structured `u64` for
//! container ids so that any scheduler can mint them without coordination.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Shared (`Arc<str>`): ids are cloned into every token, container spec and event, so a
        /// clone is a reference count rather than an allocation, and equal clones compare by
        /// pointer first.
        #[derive(Clone, Debug, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Arc<str>);

        impl $name {
            pub fn new(s: impl Into<Arc<str>>) -> Self {
                $name(s.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq for $name {
            fn eq(&self, other: &Self) -> bool {
                Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
            }
        }

        impl Eq for $name {}

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                if Arc::ptr_eq(&self.0, &other.0) {
                    std::cmp::Ordering::Equal
                } else {
                    self.0.cmp(&other.0)
                }
            }
        }

        impl std::hash::Hash for $name {
            fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
                self.as_str().hash(state)
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.into())
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s.into())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0.to_string()
            }
        }
    };
}

string_id!(
    /// A worker node's name, unique in the cluster.
    NodeId
);
string_id!(
    /// An application (job manager) registered with the cluster.
    AppId
);
string_id!(
    /// A job of an application; queue reordering groups containers by their job's submit time.
    JobId
);

/// FNV-1a: a fast, deterministic hash for the short names of [`NodeId`] and friends, for maps
/// looked up on every heartbeat or view. Names come from joined (authenticated) workers and
/// registered apps, so the hash-flooding resistance of the std default is not needed there.
#[derive(Clone, Copy, Debug)]
pub struct NameHasher(u64);

impl Default for NameHasher {
    fn default() -> Self {
        NameHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for NameHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Builds [`NameHasher`]s, for `HashMap<NodeId, _, NameBuildHasher>`.
pub type NameBuildHasher = std::hash::BuildHasherDefault<NameHasher>;

/// A container id: the high 24 bits name the issuer (0 = the central guarantor, 1.. = the
/// distributed scheduler of one worker incarnation, assigned by the coordinator at join), the low
/// 40 bits are that issuer's sequence number. Completion events are routed back to the issuer by
/// this prefix so it can keep its quota counts exact (Mercury §6.3 "Quotas").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContainerId(pub u64);

impl ContainerId {
    pub const SEQ_BITS: u32 = 40;
    pub const MAX_ISSUER: u32 = (1 << 24) - 1;

    pub fn new(issuer: u32, seq: u64) -> ContainerId {
        debug_assert!(issuer <= Self::MAX_ISSUER);
        ContainerId(((issuer as u64) << Self::SEQ_BITS) | (seq & ((1 << Self::SEQ_BITS) - 1)))
    }

    pub fn issuer(&self) -> u32 {
        (self.0 >> Self::SEQ_BITS) as u32
    }

    pub fn seq(&self) -> u64 {
        self.0 & ((1 << Self::SEQ_BITS) - 1)
    }
}

impl std::fmt::Display for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "c{}-{}", self.issuer(), self.seq())
    }
}

/// Mints container ids for one issuer.
#[derive(Clone, Debug)]
pub struct ContainerIdMinter {
    issuer: u32,
    next_seq: u64,
}

impl ContainerIdMinter {
    pub fn new(issuer: u32) -> Self {
        ContainerIdMinter {
            issuer,
            next_seq: 1,
        }
    }

    /// Resume after `last_seq` (e.g. recovered from a store).
    pub fn resume(issuer: u32, last_seq: u64) -> Self {
        ContainerIdMinter {
            issuer,
            next_seq: last_seq + 1,
        }
    }

    pub fn issuer(&self) -> u32 {
        self.issuer
    }

    pub fn next_id(&mut self) -> ContainerId {
        let id = ContainerId::new(self.issuer, self.next_seq);
        self.next_seq += 1;
        id
    }

    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_id_round_trips_issuer_and_seq() {
        let id = ContainerId::new(77, 123_456);
        assert_eq!(id.issuer(), 77);
        assert_eq!(id.seq(), 123_456);
        let mut m = ContainerIdMinter::new(3);
        let a = m.next_id();
        let b = m.next_id();
        assert_ne!(a, b);
        assert_eq!(a.issuer(), 3);
        assert_eq!(m.last_seq(), 2);
    }
}
