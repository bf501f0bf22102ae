//! Fake-API-server tests: the in-process API server of `support/fake_apiserver.rs`, alone and under `migdra serve`.
//! One test binary for the tier, one module per file in `tests/apiserver/`: each binary links the whole
//! dependency tree, so fewer of them build and link faster.

#[path = "../support/mod.rs"]
mod support;

mod fake_apiserver;
mod serve_fake_apiserver;
