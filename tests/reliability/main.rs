//! Reliability and security suite (crash points, a storm, outages, security checks): every test
//! prints its figures as `FIGURE` lines,
//! which `hack/reliability.sh` gathers into one table. The counts that must be zero (leaked
//! instances, double allocations, stuck claims) are also asserted here.

#![allow(clippy::print_stdout, clippy::print_stderr)] // figures, and what a failed check found

#[path = "../support/mod.rs"]
mod support;

mod common;
#[cfg(feature = "crash-points")]
mod crash;
mod outage;
mod security;
mod storm;
