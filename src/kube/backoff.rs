//! The one backoff every API retry uses: doubling from a first wait up to a cap, each wait drawn
//! from the upper half of its step, so that the nodes of a cluster whose API server comes back
//! do not all retry in the same instant.
//!
//! kube-runtime's watcher would give the two watches (the publisher's drift watch, the claim
//! follower) paging, a relist on 410 and a backoff; migdra keeps them by hand on this backoff
//! instead: the publisher needs only "has anything but my own writes changed since my list" (a
//! watch from the list's version, nothing kept), the follower only device names, and the crate
//! would bring its own dependency tree into a cold build on two cores for those two loops.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The cap of the waits before a broken or refused watch is tried again: a node whose watches
/// the API server refuses falls back to a list every half minute, not a list loop.
pub const WATCH_MAX: Duration = Duration::from_secs(30);

/// A watch stream that ends sooner than this was closed on opening (the server's own timeout is at
/// least a second): it counts as refused, and waits like one.
pub const WATCH_LIVED: Duration = Duration::from_secs(1);

/// Waits between retries: `first`, doubling to `max`, each jittered into `[step/2, step]`.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
    /// xorshift64 state: jitter needs no more than this.
    rng: u64,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let seed = nanos ^ (u64::from(std::process::id()) << 32) | 1;
        Self { first, max, step: first, rng: seed }
    }

    /// The next wait; the step after it doubles, up to the cap.
    pub fn next_wait(&mut self) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let half = self.step / 2;
        let jitter = half.mul_f64((self.rng >> 11) as f64 / (1u64 << 53) as f64);
        let wait = half + jitter;
        self.step = (self.step * 2).min(self.max);
        wait
    }

    /// Back to the first step, after a success.
    pub fn reset(&mut self) {
        self.step = self.first;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_to_the_cap_within_the_upper_half_of_each_step() {
        let (first, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let mut b = Backoff::new(first, max);
        let mut step = first;
        let mut waits = Vec::new();
        for _ in 0..12 {
            let w = b.next_wait();
            assert!(w >= step / 2 && w <= step, "{w:?} outside [{:?}, {step:?}]", step / 2);
            waits.push(w);
            step = (step * 2).min(max);
        }
        assert!(waits[11] > Duration::from_millis(2500), "capped at 5 s: {waits:?}");
        let distinct: std::collections::BTreeSet<_> = waits[6..].iter().collect();
        assert!(distinct.len() > 1, "jittered: {waits:?}");
        b.reset();
        assert!(b.next_wait() <= first);
    }
}
