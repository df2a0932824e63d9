//! Thin adapters over [`crate::farm::Farm`]: the gRPC service ([`grpc`],
//! with [`convert`] between domain and protocol types), the JSON API and
//! dashboard ([`api`]), the HTTP port that serves them and the Prometheus
//! metrics ([`http`], [`metrics`]), and connection limits on both ports
//! ([`connections`]). They translate and check callers; the farm decides.

pub mod api;
pub mod connections;
pub mod convert;
pub mod grpc;
pub mod http;
pub mod lanes;
pub mod metrics;
pub mod refusal;
pub(crate) mod throttle;
