//! How a coordinator that is not the active one refuses calls, on both
//! ports, so that workers and clients move on to the next address: gRPC
//! `Unavailable` and HTTP 503, each marked `tessera-role: standby`.

/// The response metadata that marks a standby's refusal.
pub const ROLE_HEADER: &str = "tessera-role";

/// A standby's refusal of a gRPC call: `Unavailable`, marked
/// `tessera-role: standby` so that clients move on to the next address.
pub fn refusal_status(text: impl Into<String>) -> tonic::Status {
    let mut status = tonic::Status::unavailable(text);
    status.metadata_mut().insert(
        ROLE_HEADER,
        tonic::metadata::MetadataValue::from_static("standby"),
    );
    status
}

/// A standby's answer on the HTTP port: 503 with the words and the role.
pub fn http_refusal(text: String) -> axum::response::Response {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [
            (ROLE_HEADER, "standby"),
            (header::CONTENT_TYPE.as_str(), "application/json"),
        ],
        serde_json::json!({
            "error": text,
            "hint": "use the active coordinator",
        })
        .to_string(),
    )
        .into_response()
}
