//! The dashboard: plain HTML, CSS and JavaScript embedded in the binary with
//! `include_str!` (no bundler, no build step, nothing fetched from elsewhere),
//! and its sign-in: a token kept in an HttpOnly, SameSite=Strict cookie, and
//! a CSRF token, derived from it, that every change carries.
//!
//! Pages: `/` (jobs), `/jobs/{id}` (one job), `/workers`, `/login`. They are
//! one page script that routes by path and talks to `/api/v1/`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{csrf_token, ok, read_json, Api, ApiError, Caller, SESSION_COOKIE};

const INDEX: &str = include_str!("../../../web/index.html");
const SCRIPT: &str = include_str!("../../../web/app.js");
const STYLE: &str = include_str!("../../../web/app.css");

/// How long a sign-in lasts, in seconds (30 days; the token itself may be
/// revoked sooner with `tessera users remove`).
const SESSION_SECS: u64 = 30 * 24 * 3600;

/// The dashboard's pages and assets.
pub fn pages() -> Router<Api> {
    Router::new()
        .route("/", get(page))
        .route("/login", get(page))
        .route("/workers", get(page))
        .route("/jobs/{id}", get(page))
        .route("/assets/app.js", get(script))
        .route("/assets/app.css", get(style))
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Scripts and styles only from here; no framing by other sites.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        INDEX,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

async fn style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], STYLE).into_response()
}

/// Who a token belongs to: the answer of whoami and of sign-in.
#[derive(Serialize, ToSchema)]
pub struct WhoAmI {
    user: String,
    /// `user`, `admin` or `worker`.
    #[schema(examples("user", "admin", "worker"))]
    role: &'static str,
    /// The coordinator's version.
    version: &'static str,
    /// The CSRF token to send with the session cookie (absent without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    csrf: Option<String>,
}

impl WhoAmI {
    fn new(who: &crate::auth::Identity, csrf: Option<String>) -> Self {
        Self {
            user: who.name.clone(),
            role: who.role.name(),
            version: env!("CARGO_PKG_VERSION"),
            csrf,
        }
    }
}

/// `GET /api/v1/whoami`: `{"user", "role", "version"}`, and `csrf` when
/// called with the session cookie.
pub async fn whoami(caller: Caller) -> Response {
    ok(WhoAmI::new(&caller.who, caller.csrf.clone()))
}

/// The body of `POST /api/v1/session`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// A token made by `tessera users add` (or the admin token).
    token: String,
}

fn session_cookie(api: &Api, value: &str, max_age: u64) -> String {
    let secure = if api.tls { "; Secure" } else { "" };
    format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    )
}

/// `POST /api/v1/session` `{"token": ...}`: checks the token and keeps it in
/// the session cookie; answers as whoami (with the CSRF token).
pub async fn sign_in(
    State(api): State<Api>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    // A JSON content type cannot be sent by a plain cross-site form.
    let json_body = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !json_body {
        return Err(ApiError::bad(
            "sign-in takes a JSON body",
            "send Content-Type: application/json with {\"token\": \"tsr_...\"}",
        ));
    }
    let req: SignIn = read_json(body, 4096, "sign-in").await?;
    let token = req.token.trim();
    let who = api.farm.authenticate(Some(token)).map_err(|e| {
        let mut err = ApiError::from(e);
        err.hint = "paste a token made by `tessera users add NAME` (or the admin token)".into();
        err
    })?;
    if !token.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(ApiError::bad(
            "the token has characters a cookie cannot hold",
            "use a token made by `tessera users add`",
        ));
    }
    let mut r = ok(WhoAmI::new(&who, Some(csrf_token(token))));
    let cookie = session_cookie(&api, token, SESSION_SECS);
    if let Ok(v) = cookie.parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(r)
}

/// `POST /api/v1/session/end`: signs out (clears the cookie).
pub async fn sign_out(State(api): State<Api>, _caller: Caller) -> Response {
    let mut r = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        "{}",
    )
        .into_response();
    if let Ok(v) = session_cookie(&api, "", 0).parse() {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}
