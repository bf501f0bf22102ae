//! Waiting for what a process does by itself: poll a condition until a deadline, and fail with
//! what was awaited, what was last seen, and whatever the caller adds to explain it (a log).
//!
//! ```ignore
//! eventually("the registration socket").within(Duration::from_secs(20)).explain(|| daemon.log())
//!     .until(|| UnixStream::connect(&path).is_ok()).await;
//! ```

use std::future::Future;
use std::time::{Duration, Instant};

/// A wait being set up; [`Eventually::until`] runs it.
#[must_use = "an Eventually waits only when `until` is awaited"]
pub struct Eventually<'a> {
    what: String,
    within: Duration,
    every: Duration,
    explain: Option<Box<dyn Fn() -> String + 'a>>,
}

/// Wait for `what` (it names the wait in the failure): 20 s at most, polling every 10 ms.
pub fn eventually<'a>(what: impl Into<String>) -> Eventually<'a> {
    Eventually { what: what.into(), within: Duration::from_secs(20), every: Duration::from_millis(10), explain: None }
}

/// What a condition returns: `true`, `Some(value)` or `Ok(value)` once it holds; an `Err`
/// describes what was seen instead, for the failure message.
pub trait Done {
    type Output;
    fn done(self) -> Result<Self::Output, Option<String>>;
}

impl Done for bool {
    type Output = ();
    fn done(self) -> Result<(), Option<String>> {
        if self { Ok(()) } else { Err(None) }
    }
}

impl<T> Done for Option<T> {
    type Output = T;
    fn done(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T> Done for Result<T, String> {
    type Output = T;
    fn done(self) -> Result<T, Option<String>> {
        self.map_err(Some)
    }
}

impl<'a> Eventually<'a> {
    /// The deadline, from the first check.
    pub fn within(mut self, timeout: Duration) -> Self {
        self.within = timeout;
        self
    }

    /// How long to sleep between checks.
    pub fn every(mut self, interval: Duration) -> Self {
        self.every = interval;
        self
    }

    /// Added to the failure message, read only then: a daemon's log, a cluster's diagnostics.
    pub fn explain(mut self, f: impl Fn() -> String + 'a) -> Self {
        self.explain = Some(Box::new(f));
        self
    }

    /// Check until the condition holds; its value.
    ///
    /// # Panics
    /// At the deadline, naming what was awaited.
    pub async fn until<D: Done>(self, mut check: impl FnMut() -> D) -> D::Output {
        self.until_async(|| std::future::ready(check())).await
    }

    /// [`Eventually::until`] with a check that awaits (an API call).
    pub async fn until_async<D: Done, F: Future<Output = D>>(self, mut check: impl FnMut() -> F) -> D::Output {
        let started = Instant::now();
        loop {
            let last = match check().await.done() {
                Ok(value) => return value,
                Err(last) => last,
            };
            if started.elapsed() >= self.within {
                self.fail(last);
            }
            tokio::time::sleep(self.every).await;
        }
    }

    /// How long the condition took to hold, or `None` at the deadline: for a test that measures
    /// the time, or reports a miss in its own words.
    pub async fn measure(self, mut check: impl FnMut() -> bool) -> Option<Duration> {
        self.measure_async(|| std::future::ready(check())).await
    }

    /// [`Eventually::measure`] with a check that awaits.
    pub async fn measure_async<F: Future<Output = bool>>(self, mut check: impl FnMut() -> F) -> Option<Duration> {
        let started = Instant::now();
        loop {
            if check().await {
                return Some(started.elapsed());
            }
            if started.elapsed() >= self.within {
                return None;
            }
            tokio::time::sleep(self.every).await;
        }
    }

    fn fail(&self, last: Option<String>) -> ! {
        let mut msg = format!("timed out after {:?} waiting for {}", self.within, self.what);
        if let Some(last) = last {
            msg.push_str(&format!("; last seen: {last}"));
        }
        if let Some(explain) = &self.explain {
            msg.push('\n');
            msg.push_str(&explain());
        }
        panic!("{msg}");
    }
}
