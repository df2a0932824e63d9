//! The Tessera coordinator: accepts render jobs, splits them into tasks,
//! leases tasks to workers and keeps everything durable.
//!
//! # Layout
//! - [`auth`]: tokens, roles and who may see what.
//! - [`frames`]: the frame-set syntax and chunking.
//! - [`digest`]: blake3 content addresses.
//! - [`blendfile`]: recognising Blender files by their header.
//! - [`job`], [`task`], [`worker`]: the domain records and their lifecycles.
//! - [`hardware`]: GPUs, slot capabilities, job requirements, GPU health.
//! - [`runtime`]: Blender runtimes, versions and version requirements.
//! - [`farm`]: the domain service (submit, lease, complete, fail, expire); its
//!   submodules hold jobs, leases, the scheduler, stitching, users, workers and access. and
//!   who may act for which worker and lease and use which blob.
//! - [`fileset`]: job file sets (every file a scene needs) and their checks.
//! - [`store`]: durable metadata (sled, PostgreSQL) and its in-memory twin,
//!   with one suite of cases every store passes.
//! - [`ha`]: an active and standby coordinators on one PostgreSQL database.
//! - [`blob_location`]: where blobs live, from `--blobs`.
//! - [`blob_store`]: content-addressed blobs on disk and in memory.
//! - [`s3_blobs`]: blobs in an S3-compatible bucket; [`aws_profile`]: its
//!   settings from the AWS config files; [`blob_location`]: `--blobs` (a
//!   directory or `s3://bucket/prefix`).
//! - [`refs`]: blob reference counts, deciding which blobs may be collected.
//! - [`clock`]: time behind a trait.
//! - [`convert`]: domain <-> protocol conversions.
//! - [`grpc`]: thin tonic adapters over [`farm::Farm`].
//! - [`connections`]: connection caps and stall timeouts on both ports.
//! - [`metrics`], [`http`]: Prometheus metrics served over HTTP (or HTTPS).
//! - [`api`]: the JSON API under `/api/v1/` (with Server-Sent Events) and the
//!   web dashboard, thin adapters over [`farm::Farm`] like [`grpc`].
//! - [`server`]: opening a data directory and serving.
//! - [`space`]: free space on the coordinator's volumes, kept for its metadata.
//! - [`tiles`]: tile grids, overscan and Blender render borders.
//! - [`stitch`]: assembling a frame from rendered tiles, pixel for pixel.
//! - [`limits`]: image size limits (`--max-pixels`), checked before allocating.
//! - [`frame_image`]: frames decoded for people (EXR tone-mapped to sRGB).
//! - [`preview`]: preview videos of done jobs, made with ffmpeg.
//! - [`verify`]: verifiable frames: which tasks are rendered twice, what
//!   several results settle, render statistics.

// The OpenAPI document is one large `json!` literal.

pub mod api;
pub mod auth;
pub mod aws_profile;
pub mod blendfile;
pub mod blob_location;
pub mod blob_store;
pub mod clock;
pub mod connections;
pub mod convert;
pub mod digest;
pub mod error;
pub mod farm;
pub mod fileset;
pub mod frame_image;
pub mod frames;
pub mod grpc;
pub mod ha;
pub mod hardware;
pub mod http;
pub mod job;
pub mod limits;
pub mod metrics;
pub mod preview;
pub mod refs;
pub mod runtime;
pub mod s3_blobs;
pub mod server;
pub mod space;
pub mod stitch;
pub mod store;
pub mod task;
pub mod tiles;
pub mod usage;
pub mod verify;
pub mod worker;

pub use error::Error;
pub use farm::{Config, Farm};
pub use server::Coordinator;
pub use verify::DEFAULT_VERIFY_UNTRUSTED;
