//! Node heartbeats held outside the event queue.
//!
//! Every node has at most one heartbeat scheduled, at a slot of its own phase and at most one
//! interval ahead. This set holds them instead of the event heap, each with the
//! `(time, sequence number)` a push would have given it (the number is reserved from the
//! queue), so the simulation takes events in exactly the order it would have: the caller
//! compares [`LazyHeartbeats::next`] with the queue's head.
//!
//! It matters most with idle heartbeats elided and heartbeat-driven GUARANTEED allocation: a new
//! GUARANTEED ask wakes every dormant node, each gets a heartbeat at its next slot, and most of
//! them find nothing to do there and fall asleep again. Such a heartbeat is held as *untouched*
//! (the node has had nothing happen to it since it fell asleep) until something gives the node
//! work ([`LazyHeartbeats::touch`]); an untouched node can go back to sleep in O(1).
//!
//! The same structure holds heartbeat arrivals and acknowledgements: they come a fixed delay
//! after a heartbeat slot, and with that delay as the set's `offset` they are held like
//! heartbeats.
//!
//! Nodes' heartbeat phases must be strictly increasing with the node index (true whenever the
//! interval in µs is at least the node count). A held heartbeat is at most one interval after
//! now, and at most one node's slot falls on any instant, so the held heartbeats are ordered by
//! node index rotated at the current phase: the next one is found with a bitset scan from the
//! current phase, in O(nodes / 64) per interval plus O(1) per heartbeat.

use scheduler_core::Time;

pub(crate) struct LazyHeartbeats {
    interval_us: u64,
    /// Held events are this long after a slot of their node's phase (µs); times below are
    /// stored and compared less the offset.
    offset_us: u64,
    /// Phase of each node within the interval (µs), strictly increasing.
    phases: Vec<u64>,
    /// Per node: time (µs) and reserved sequence number of its held heartbeat.
    held: Vec<(u64, u64)>,
    bits: Vec<u64>,
    /// Held heartbeats of nodes untouched since they were woken from sleep.
    untouched: Vec<u64>,
    count: usize,
    /// The earliest held heartbeat: (time µs, seq, node).
    next: Option<(u64, u64, u32)>,
}

impl LazyHeartbeats {
    /// `None` if the phases are not strictly increasing (two nodes could heartbeat at the same
    /// instant; the caller then uses the event queue), or the offset is not below the interval.
    pub(crate) fn new(
        interval_us: u64,
        offset_us: u64,
        phases: Vec<u64>,
    ) -> Option<LazyHeartbeats> {
        if interval_us == 0
            || offset_us >= interval_us
            || phases.windows(2).any(|w| w[0] >= w[1])
            || phases.last().is_some_and(|&p| p >= interval_us)
        {
            return None;
        }
        let n = phases.len();
        Some(LazyHeartbeats {
            interval_us,
            offset_us,
            phases,
            held: vec![(0, 0); n],
            bits: vec![0; n.div_ceil(64)],
            untouched: vec![0; n.div_ceil(64)],
            count: 0,
            next: None,
        })
    }

    pub(crate) fn is_held(&self, node: u32) -> bool {
        self.bits[node as usize / 64] & (1 << (node % 64)) != 0
    }

    /// Something happened to the node: its held heartbeat (if any) is no longer untouched.
    pub(crate) fn touch(&mut self, node: u32) {
        self.untouched[node as usize / 64] &= !(1 << (node % 64));
    }

    /// Hold node's heartbeat at `at` (a slot of its phase, within one interval of every later
    /// `now` until it is taken) under the reserved sequence number `seq`; `untouched`: the
    /// node was just woken from sleep.
    pub(crate) fn insert(&mut self, node: u32, at: Time, seq: u64, untouched: bool) {
        debug_assert!(!self.is_held(node), "node {node} already held");
        let at = at.as_micros() - self.offset_us;
        self.bits[node as usize / 64] |= 1 << (node % 64);
        if untouched {
            self.untouched[node as usize / 64] |= 1 << (node % 64);
        }
        self.held[node as usize] = (at, seq);
        self.count += 1;
        if self.next.is_none_or(|(t, s, _)| (at, seq) < (t, s)) {
            self.next = Some((at, seq, node));
        }
    }

    /// The earliest held heartbeat: (time, seq, node).
    pub(crate) fn next(&self) -> Option<(Time, u64, u32)> {
        self.next
            .map(|(t, s, n)| (Time::from_micros(t + self.offset_us), s, n))
    }

    /// Release node's held heartbeat, if any: its (time, seq, untouched). `now` is the
    /// simulated time (no held heartbeat is earlier).
    pub(crate) fn take(&mut self, node: u32, now: Time) -> Option<(Time, u64, bool)> {
        if !self.is_held(node) {
            return None;
        }
        let untouched = self.untouched[node as usize / 64] & (1 << (node % 64)) != 0;
        self.touch(node);
        self.bits[node as usize / 64] &= !(1 << (node % 64));
        self.count -= 1;
        let (at, seq) = self.held[node as usize];
        if self.next.is_some_and(|(.., n)| n == node) {
            let now_us = now.as_micros() - self.offset_us;
            self.next = if self.count == 0 {
                None
            } else if at == now_us {
                // It is due now: the next ones follow it in phase order (no other node's
                // slot is now).
                self.scan_from(node as usize + 1)
            } else {
                self.find_next(now_us)
            };
        }
        Some((Time::from_micros(at + self.offset_us), seq, untouched))
    }

    /// Scan for the earliest held heartbeat at or after `now_us`.
    fn find_next(&self, now_us: u64) -> Option<(u64, u64, u32)> {
        if self.count == 0 {
            return None;
        }
        let r = now_us % self.interval_us;
        // The node whose slot is now, if any, is first if its heartbeat is now, else last.
        let after = self.first_phase_after(r);
        if after > 0 && self.phases[after - 1] == r {
            let node = (after - 1) as u32;
            if self.is_held(node) && self.held[node as usize].0 == now_us {
                let (t, s) = self.held[node as usize];
                return Some((t, s, node));
            }
        }
        self.scan_from(after)
    }

    /// The first held node in phase order from index `from`, wrapping around.
    fn scan_from(&self, from: usize) -> Option<(u64, u64, u32)> {
        let node = self
            .first_set(from, self.phases.len())
            .or_else(|| self.first_set(0, from))?;
        let (t, s) = self.held[node as usize];
        Some((t, s, node))
    }

    /// Index of the first node whose phase is after `r`. Phases are spread over the interval
    /// (the simulator's are evenly), so start from the proportional guess and walk.
    fn first_phase_after(&self, r: u64) -> usize {
        let n = self.phases.len();
        let guess = match r.checked_mul(n as u64) {
            Some(x) => x / self.interval_us,
            None => (u128::from(r) * n as u128 / u128::from(self.interval_us)) as u64,
        };
        let mut i = (guess as usize).min(n);
        while i > 0 && self.phases[i - 1] > r {
            i -= 1;
        }
        while i < n && self.phases[i] <= r {
            i += 1;
        }
        i
    }

    /// The first held node in `from..to`.
    fn first_set(&self, from: usize, to: usize) -> Option<u32> {
        let mut i = from;
        while i < to {
            let word = self.bits[i / 64] >> (i % 64);
            if word != 0 {
                let found = i + word.trailing_zeros() as usize;
                return (found < to).then_some(found as u32);
            }
            i = (i / 64 + 1) * 64;
        }
        None
    }

    /// Brute-force check of the cached earliest heartbeat (for invariant checking).
    pub(crate) fn check(&self, now: Time) -> Result<(), String> {
        let now_us = now.as_micros().saturating_sub(self.offset_us);
        let mut best: Option<(u64, u64, u32)> = None;
        let mut count = 0;
        for node in 0..self.phases.len() as u32 {
            if !self.is_held(node) {
                if self.untouched[node as usize / 64] & (1 << (node % 64)) != 0 {
                    return Err(format!("node {node} untouched but not held"));
                }
                continue;
            }
            count += 1;
            let (t, s) = self.held[node as usize];
            if t < now_us || t > now_us + self.interval_us {
                return Err(format!(
                    "held heartbeat of node {node} at {t} µs is not within one interval of {now_us} µs"
                ));
            }
            if best.is_none_or(|(bt, bs, _)| (t, s) < (bt, bs)) {
                best = Some((t, s, node));
            }
        }
        if count != self.count || best != self.next {
            return Err(format!(
                "held heartbeats: cached next {:?} of {} but {best:?} of {count}",
                self.next, self.count
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn phases_must_be_strictly_increasing_within_the_interval() {
        assert!(LazyHeartbeats::new(10, 0, vec![0, 3, 6]).is_some());
        assert!(LazyHeartbeats::new(10, 0, vec![0, 3, 3]).is_none());
        assert!(LazyHeartbeats::new(10, 0, vec![0, 10]).is_none());
    }

    #[test]
    fn first_phase_after_agrees_with_a_binary_search() {
        for phases in [
            vec![0, 1, 2, 500, 998, 999],
            (0..100).map(|i| i * 7).collect(),
        ] {
            let held = LazyHeartbeats::new(1_000, 0, phases.clone()).unwrap();
            for r in 0..1_000 {
                assert_eq!(
                    held.first_phase_after(r),
                    phases.partition_point(|&p| p <= r),
                    "{phases:?} at {r}"
                );
            }
        }
    }

    /// Random wakes and takes with time moving forward: the cached next heartbeat agrees with
    /// a brute-force minimum after every step.
    #[test]
    fn next_agrees_with_a_scan_after_every_step() {
        let interval = 1_000u64;
        let n = 150usize;
        let phases: Vec<u64> = (0..n as u64).map(|i| interval * i / n as u64).collect();
        for offset in [0, 1, 7, interval - 1] {
            random_steps(interval, offset, &phases);
        }
        assert!(LazyHeartbeats::new(interval, interval, phases).is_none());
    }

    fn random_steps(interval: u64, offset: u64, phases: &[u64]) {
        let n = phases.len();
        let mut held = LazyHeartbeats::new(interval, offset, phases.to_vec()).unwrap();
        let mut rng = StdRng::seed_from_u64(7 + offset);
        // Time less the offset.
        let mut now = 0u64;
        let mut seq = 0u64;
        for step in 0..20_000 {
            match rng.random_range(0..10) {
                // Wake a random node at its next slot strictly after now.
                0..=3 => {
                    let node = rng.random_range(0..n as u32);
                    if !held.is_held(node) {
                        let p = phases[node as usize];
                        let next = if now < p {
                            p
                        } else {
                            p + ((now - p) / interval + 1) * interval
                        };
                        held.insert(
                            node,
                            Time::from_micros(next + offset),
                            seq,
                            seq.is_multiple_of(2),
                        );
                        seq += 1;
                    }
                }
                // Take a random node (a wake of a held node).
                4 => {
                    let node = rng.random_range(0..n as u32);
                    held.take(node, Time::from_micros(now + offset));
                }
                // Advance time, possibly to the next held heartbeat and take it.
                _ => {
                    let target = now + rng.random_range(0..interval / 3);
                    match held.next() {
                        Some((t, _, node)) if t.as_micros() - offset <= target => {
                            now = t.as_micros() - offset;
                            let taken = held.take(node, t);
                            assert_eq!(taken.map(|(t, ..)| t.as_micros()), Some(now + offset));
                        }
                        _ => now = target,
                    }
                }
            }
            held.check(Time::from_micros(now + offset))
                .unwrap_or_else(|e| panic!("step {step}: {e}"));
        }
    }
}
