//! The event queue: a binary heap of timestamped events. Events at the same instant are taken in
//! the order they were scheduled (a sequence number breaks ties), so a run is deterministic.

use scheduler_core::Time;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    at: Time,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at && self.seq == other.seq
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest (then first scheduled).
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// Timestamped events, earliest first, FIFO among equal timestamps.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    pub fn push(&mut self, at: Time, event: E) {
        self.heap.push(Entry {
            at,
            seq: self.next_seq,
            event,
        });
        self.next_seq += 1;
    }

    pub fn pop(&mut self) -> Option<(Time, E)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }

    /// The time and sequence number of the next event, without taking it.
    pub fn peek_key(&self) -> Option<(Time, u64)> {
        self.heap.peek().map(|e| (e.at, e.seq))
    }

    /// Take the next sequence number without scheduling anything: an event held outside the
    /// queue and ordered against [`EventQueue::peek_key`] by `(time, seq)` keeps the place among
    /// equal-time events that a push now would have given it.
    pub fn reserve_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_fifo_among_ties() {
        let mut q = EventQueue::default();
        q.push(Time::from_secs(2), "late");
        q.push(Time::from_secs(1), "a");
        q.push(Time::from_secs(1), "b");
        q.push(Time::ZERO, "first");
        q.push(Time::from_secs(1), "c");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, vec!["first", "a", "b", "c", "late"]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_reserved_sequence_number_orders_a_held_event_among_ties() {
        let mut q = EventQueue::default();
        q.push(Time::from_secs(1), "a");
        let held = (Time::from_secs(1), q.reserve_seq());
        q.push(Time::from_secs(1), "c");
        q.push(Time::ZERO, "first");
        assert_eq!(q.peek_key(), Some((Time::ZERO, 3)));
        // Merge the held event with the queue by (time, seq), as the simulator does.
        let mut held = Some(held);
        let mut order = Vec::new();
        loop {
            let take_held = held.is_some_and(|h| q.peek_key().is_none_or(|k| h < k));
            if take_held {
                held = None;
                order.push("b");
            } else if let Some((_, e)) = q.pop() {
                order.push(e);
            } else {
                break;
            }
        }
        assert_eq!(order, vec!["first", "a", "b", "c"]);
        assert_eq!(q.peek_key(), None);
    }
}
