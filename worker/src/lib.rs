//! The Tessera worker: leases tasks from a coordinator and renders them with
//! Blender.
//!
//! # Layout
//! - [`agent`]: registration and the per-slot lease loop.
//! - [`blender`]: running Blender and judging whether a render really worked.
//! - [`slots`]: one slot per GPU, CPU slots, declared GPUs for tests.
//! - [`session`]: warm Blender sessions, one per job and slot.
//! - [`cache`]: the scene cache, keyed by blake3 digest.
//! - [`capabilities`]: what this worker's Blender can render (version, denoiser, OSL, Eevee).
//! - [`fileset`]: job roots built from file sets, and the bounded file cache.
//! - [`transfer`]: streaming blobs to and from a coordinator (also used by the CLI).
//! - [`gpu`]: probing the machine's GPUs (Vulkan) and their telemetry (NVML).
//! - [`image_size`]: reading image sizes from PNG and OpenEXR headers.
//! - [`error`]: the worker's error type.

pub mod agent;
pub mod blender;
pub mod cache;
pub mod capabilities;
pub mod error;
pub mod fileset;
pub mod gpu;
pub mod image_size;
pub mod session;
pub mod slots;
pub mod transfer;

pub use error::Error;
