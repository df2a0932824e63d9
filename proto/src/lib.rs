//! Tessera's wire protocol: the code generated from `proto/tessera/v1/tessera.proto`.
//!
//! Beside it, [`json`]: the one JSON form of job and worker views, shared by
//! the CLI's `--json` output and the coordinator's HTTP API. Conversions to
//! domain types sit beside those types in the coordinator and worker crates.

#![allow(clippy::all, missing_docs)]

/// Version 1 of the protocol.
pub mod v1 {
    tonic::include_proto!("tessera.v1");
}

pub use v1::*;

pub mod json;
