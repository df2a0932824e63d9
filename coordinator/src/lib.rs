//! The Tessera coordinator: accepts render jobs, splits them into tasks,
//! leases tasks to workers and keeps everything durable.
//!
//! # Layout, lowest layer first (see ARCHITECTURE.md at the top of the repo)
//! - Foundations: [`error`], [`digest`] (blake3 content addresses),
//!   [`clock`], [`space`] (free space on volumes), [`health`] (whether a
//!   store on another machine answers), [`blendfile`] (recognising Blender
//!   files), [`auth`] (tokens and roles).
//! - [`model`]: the domain records (jobs, tasks, workers, usage,
//!   verification) and their value types (frame sets, tile grids, hardware,
//!   runtimes, file sets, previews). No I/O, no import circle.
//! - [`store`]: durable metadata (sled, PostgreSQL) and the leadership
//!   lease that fences PostgreSQL writes; [`blobs`]: content-addressed blobs
//!   (a directory, memory, S3).
//! - [`imaging`]: stitching, decoded frames, preview videos, size limits.
//! - [`farm`]: the domain service (submit, lease, complete, fail, expire)
//!   over one lock, its state in parts that own their indexes.
//! - [`adapters`]: gRPC, the JSON API and dashboard, HTTP(S), metrics,
//!   connection limits: thin translations over [`farm::Farm`].
//! - [`ha`]: an active and standby coordinators on one PostgreSQL database.
//! - [`server`]: opening a data directory and serving.

// The OpenAPI document is one large `json!` literal.

pub mod adapters;
pub mod auth;
pub mod blendfile;
pub mod blobs;
pub mod bridge;
pub mod clock;
pub mod digest;
pub mod error;
pub mod farm;
pub mod ha;
pub mod health;
pub mod imaging;
pub mod model;
pub mod server;
pub mod space;
pub mod store;

pub use error::Error;
pub use farm::{Config, Farm};
pub use model::verify::DEFAULT_VERIFY_UNTRUSTED;
pub use server::Coordinator;
