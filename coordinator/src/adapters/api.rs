//! The HTTP JSON API under `/api/v1/` and the dashboard that uses it: thin
//! adapters over [`Farm`], calling the same domain functions (and the same
//! access checks) as the gRPC handlers in [`crate::adapters::grpc`], with views in the
//! one JSON form of [`tessera_proto::json`].
//!
//! # Layout
//! - this file: the router, who is calling (a bearer token, or the
//!   dashboard's session cookie with its CSRF token), errors as JSON.
//! - [`jobs`]: list, view, check, submit, cancel/pause/resume/retry, frames.
//! - [`blobs`]: missing blobs, streamed uploads, file sets.
//! - [`events`]: Server-Sent Events of job and worker changes.
//! - [`thumb`]: frame thumbnails (EXR tone-mapped).
//! - [`previews`]: a job's preview video: asked for, and served as MP4.
//! - [`web`]: the dashboard's pages and its sign-in.
//! - [`openapi`]: the OpenAPI document, built from the route table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::{header, request::Parts, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::Router;

use crate::auth::{self, Identity, Role};
use crate::error::Error;
use crate::farm::Farm;

pub mod blobs;
pub mod events;
pub mod jobs;
pub mod openapi;
pub mod pipeline;
pub mod previews;
pub mod thumb;
pub mod web;

#[cfg(test)]
mod tests;

/// The dashboard's session cookie: the token itself, HttpOnly, so page
/// scripts never see it.
pub const SESSION_COOKIE: &str = "tessera_session";

/// The header a cookie-authenticated change must carry (see [`csrf_token`]).
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Event streams one user may hold open at once.
pub const MAX_STREAMS_PER_USER: u32 = 16;

/// What every handler shares.
#[derive(Clone)]
pub struct Api {
    farm: Arc<Farm>,
    /// Whether the port serves TLS (session cookies are then `Secure`).
    tls: bool,
    /// Open event streams per user.
    streams: Arc<Mutex<HashMap<String, u32>>>,
}

impl Api {
    /// The API over `farm`; `tls` when the port serves HTTPS.
    pub fn new(farm: Arc<Farm>, tls: bool) -> Self {
        Self {
            farm,
            tls,
            streams: Default::default(),
        }
    }
}

/// The routes of the API and the dashboard: method, path (axum and OpenAPI
/// syntax), and handler. The router and the OpenAPI document are both built
/// from this one table.
pub fn routes() -> Vec<(Method, &'static str, MethodRouter<Api>)> {
    use axum::routing::{get, post, put};
    vec![
        (Method::GET, "/api/v1/whoami", get(web::whoami)),
        (Method::POST, "/api/v1/session", post(web::sign_in)),
        (Method::POST, "/api/v1/session/end", post(web::sign_out)),
        (Method::GET, "/api/v1/jobs", get(jobs::list)),
        (Method::POST, "/api/v1/jobs", post(jobs::submit)),
        (Method::POST, "/api/v1/jobs/check", post(jobs::check)),
        (Method::GET, "/api/v1/jobs/{id}", get(jobs::view)),
        (Method::POST, "/api/v1/jobs/{id}/cancel", post(jobs::cancel)),
        (Method::POST, "/api/v1/jobs/{id}/pause", post(jobs::pause)),
        (Method::POST, "/api/v1/jobs/{id}/resume", post(jobs::resume)),
        (Method::POST, "/api/v1/jobs/{id}/retry", post(jobs::retry)),
        (
            Method::POST,
            "/api/v1/jobs/{id}/rerun",
            post(pipeline::rerun),
        ),
        (
            Method::POST,
            "/api/v1/jobs/{id}/update",
            post(pipeline::update),
        ),
        (
            Method::GET,
            "/api/v1/jobs/{id}/frames/{frame}",
            get(jobs::frame),
        ),
        (
            Method::GET,
            "/api/v1/jobs/{id}/preview",
            get(previews::video),
        ),
        (
            Method::POST,
            "/api/v1/jobs/{id}/preview",
            post(previews::request),
        ),
        (Method::GET, "/api/v1/workers", get(jobs::workers)),
        (Method::GET, "/api/v1/events", get(events::stream)),
        (Method::POST, "/api/v1/blobs/missing", post(blobs::missing)),
        (Method::PUT, "/api/v1/blobs/{digest}", put(blobs::put)),
        (Method::POST, "/api/v1/filesets", post(blobs::file_set)),
        (Method::GET, "/api/v1/openapi.json", get(openapi::serve)),
    ]
}

/// The API and the dashboard as one router.
pub fn router(api: Api) -> Router {
    let mut r: Router<Api> = Router::new();
    let mut merged: Vec<(&'static str, MethodRouter<Api>)> = Vec::new();
    for (_, path, handler) in routes() {
        match merged.iter_mut().find(|(p, _)| *p == path) {
            Some((_, m)) => *m = std::mem::take(m).merge(handler),
            None => merged.push((path, handler)),
        }
    }
    for (path, handler) in merged {
        r = r.route(path, handler);
    }
    r.merge(web::pages())
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(api)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such page or endpoint: {method} {}", uri.path()),
        "see /api/v1/openapi.json for the API's routes, or open / for the dashboard",
    )
}

/// An error as the API answers it: `{"error": "...", "hint": "..."}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Error)]
pub struct ApiError {
    /// The HTTP status.
    #[serde(skip)]
    pub status: StatusCode,
    /// What went wrong.
    pub error: String,
    /// What to do about it.
    pub hint: String,
}

impl ApiError {
    /// An error with its status and hint.
    pub fn new(status: StatusCode, error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            status,
            error: error.into(),
            hint: hint.into(),
        }
    }

    /// A 400 Bad Request.
    pub fn bad(error: impl Into<String>, hint: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, error, hint)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let (status, fallback) = match &e {
            Error::NoSpace(_) => (
                StatusCode::INSUFFICIENT_STORAGE,
                "free space on the coordinator's volume, then try again",
            ),
            Error::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "try again in a little while",
            ),
            Error::Invalid(_) => (StatusCode::BAD_REQUEST, "fix the request and send it again"),
            Error::NotFound(_) => (
                StatusCode::NOT_FOUND,
                "check the id; you see only your own jobs and blobs",
            ),
            Error::Conflict(_) | Error::LeaseLost(_) => {
                (StatusCode::CONFLICT, "reload the job to see its state now")
            }
            Error::Unauthenticated(_) => (
                StatusCode::UNAUTHORIZED,
                "send `Authorization: Bearer <token>`; `tessera users add` makes a token",
            ),
            Error::PermissionDenied(_) => {
                (StatusCode::FORBIDDEN, "use a token with the right role")
            }
            Error::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "check that the PostgreSQL server runs and that the coordinator reaches it, then try again",
            ),
            Error::NotActive(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "use the active coordinator",
            ),
            // The failure carries its backend's fix, taken below.
            Error::Store(_) => (StatusCode::SERVICE_UNAVAILABLE, "try again"),
            Error::Io { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "check that path's disk and permissions, then try again",
            ),
            Error::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "see the coordinator's log",
            ),
        };
        let error = e.to_string();
        // Domain messages end with what to do after their last `; `; the
        // token's own advice is for the CLI, so HTTP callers get theirs.
        let hint = match &e {
            Error::Unauthenticated(_) => None,
            Error::Store(f) => Some(f.fix.clone()),
            _ => error.rsplit_once("; ").map(|(_, h)| h.to_string()),
        }
        .unwrap_or_else(|| fallback.to_string());
        Self::new(status, error, hint)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_string(&self).unwrap_or_default(),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// A JSON answer with `status`.
pub fn json_response(status: StatusCode, v: &impl serde::Serialize) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        // Values and the API's own answer types always serialize.
        serde_json::to_string(v).unwrap_or_default(),
    )
        .into_response()
}

/// A 200 JSON answer.
pub fn ok(v: impl serde::Serialize) -> Response {
    json_response(StatusCode::OK, &v)
}

/// The CSRF token of a session: derived from its token, so it needs no
/// server-side state, and tells nothing about the token.
pub fn csrf_token(token: &str) -> String {
    blake3::derive_key("tessera dashboard csrf v1", token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts
        .headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty())
}

/// Who is calling: from `Authorization: Bearer`, or else the dashboard's
/// session cookie. A change (any method but GET) through the cookie must
/// carry the session's CSRF token in `X-CSRF-Token`.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's holder.
    pub who: Identity,
    /// The session's CSRF token, when the cookie authenticated the call.
    pub csrf: Option<String>,
}

impl Caller {
    /// Fails with 403 unless the caller has one of `roles`.
    pub fn need(&self, roles: &[Role]) -> Result<&Identity, ApiError> {
        if roles.contains(&self.who.role) {
            return Ok(&self.who);
        }
        let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            format!("a {} token cannot do this", self.who.role.name()),
            format!("use a token with role {}", names.join(" or ")),
        ))
    }

    /// Fails with 403 unless the caller may submit and see jobs (the roles
    /// of the gRPC `Farm` service).
    pub fn client(&self) -> Result<&Identity, ApiError> {
        self.need(&[Role::Admin, Role::User])
    }
}

impl FromRequestParts<Api> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if header.is_some() {
            let who = api.farm.authenticate(auth::bearer(header))?;
            return Ok(Self { who, csrf: None });
        }
        let Some(token) = cookie(parts, SESSION_COOKIE) else {
            // No credentials at all: the domain's own "no token" error.
            let who = api.farm.authenticate(None)?;
            return Ok(Self { who, csrf: None });
        };
        let who = api.farm.authenticate(Some(token)).map_err(|e| {
            let mut err = ApiError::from(e);
            err.hint = "sign in again on the dashboard".into();
            err
        })?;
        let csrf = csrf_token(token);
        let safe = matches!(parts.method, Method::GET | Method::HEAD);
        let sent = parts.headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        if !safe && sent != Some(csrf.as_str()) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "this change carries no valid CSRF token",
                "send the session's csrf (from GET /api/v1/whoami) in the X-CSRF-Token header; reload the dashboard",
            ));
        }
        Ok(Self {
            who,
            csrf: Some(csrf),
        })
    }
}

/// The query string's `name=value` pairs (values are plain: numbers and
/// words, so no percent-decoding is needed beyond rejecting it).
pub fn query(raw: Option<&str>) -> HashMap<&str, &str> {
    raw.unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// Parses query parameter `name` as a number, `default` when absent.
pub fn number<T: std::str::FromStr>(
    q: &HashMap<&str, &str>,
    name: &str,
    default: T,
) -> Result<T, ApiError> {
    match q.get(name) {
        None | Some(&"") => Ok(default),
        Some(v) => v.parse().map_err(|_| {
            ApiError::bad(
                format!("query parameter {name}={v} is not a number"),
                format!("give {name} as a whole number, e.g. ?{name}=10"),
            )
        }),
    }
}

/// Reads a JSON body of at most `limit` bytes into `T`.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    body: Body,
    limit: usize,
    what: &str,
) -> Result<T, ApiError> {
    let bytes = read_body(body, limit).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad(
            format!("the body is not a valid {what} in JSON: {e}"),
            "send a JSON object with the documented field names (see /api/v1/openapi.json)",
        )
    })
}

/// Reads a whole body of at most `limit` bytes (413 beyond).
pub async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
        if too_large {
            too_large_error(limit as u64)
        } else {
            ApiError::bad(
                format!("cannot read the request body: {e}"),
                "send the request again",
            )
        }
    })
}

/// The 413 answer for a body over `limit` bytes.
pub fn too_large_error(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than the limit of {limit} bytes"),
        "send less (split the job or the file set), or ask the farm's admin to raise the coordinator's limits (--max-upload-mib, --max-message-mib)",
    )
}
