//! The API's handlers over a real router and an in-memory farm: status
//! codes, ownership, CSRF, and the OpenAPI document against the routes.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use tessera_proto::v1 as pb;
use tower::ServiceExt;

use super::{router, routes, Api, MAX_STREAMS_PER_USER};
use crate::auth::Role;
use crate::blobs::{BlobStore, MemoryBlobStore};
use crate::clock::ManualClock;
use crate::digest::Digest;
use crate::farm::{Config, Farm, Registration};
use crate::store::MemoryStore;

const SCENE: &[u8] = b"BLENDER-v304 scene ... ENDB\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";

struct T {
    app: Router,
    farm: Arc<Farm>,
    blobs: Arc<MemoryBlobStore>,
    alice: String,
    bob: String,
    admin: String,
    worker: String,
}

fn setup() -> T {
    let blobs = Arc::new(MemoryBlobStore::default());
    let config = Config {
        max_upload: 1 << 20,
        ..Config::default()
    };
    let farm = Arc::new(
        Farm::open(
            Arc::new(MemoryStore::default()),
            blobs.clone(),
            Arc::new(ManualClock::at(1_000_000)),
            config,
        )
        .unwrap(),
    );
    let tok = |n: &str, r| farm.issue_token(n, r).unwrap();
    T {
        app: router(Api::new(farm.clone(), false)),
        alice: tok("alice", Role::User),
        bob: tok("bob", Role::User),
        admin: tok("root", Role::Admin),
        worker: tok("w", Role::Worker),
        farm,
        blobs,
    }
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

async fn call(
    t: &T,
    method: Method,
    uri: &str,
    token: Option<&str>,
    body: impl Into<Body>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(tok) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {tok}"));
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let res = t
        .app
        .clone()
        .oneshot(req.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    // An event stream never ends: keep only its status and headers.
    let stream = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v == "text/event-stream");
    let body = if stream {
        Vec::new()
    } else {
        axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec()
    };
    Answer {
        status,
        headers,
        body,
    }
}

async fn get(t: &T, uri: &str, token: &str) -> Answer {
    call(t, Method::GET, uri, Some(token), Body::empty(), &[]).await
}

async fn post(t: &T, uri: &str, token: &str, body: Value) -> Answer {
    call(t, Method::POST, uri, Some(token), body.to_string(), &[]).await
}

async fn upload(t: &T, token: &str, bytes: &[u8]) -> Answer {
    let d = Digest::of(bytes).to_hex();
    let len = bytes.len().to_string();
    call(
        t,
        Method::PUT,
        &format!("/api/v1/blobs/{d}"),
        Some(token),
        bytes.to_vec(),
        &[("content-length", &len)],
    )
    .await
}

fn spec(frames: &str) -> Value {
    json!({"scene_digest": Digest::of(SCENE).to_hex(), "scene_name": "a.blend", "frames": frames})
}

/// Alice uploads the scene and submits a job; its id.
async fn alice_job(t: &T, frames: &str) -> u64 {
    assert_eq!(upload(t, &t.alice, SCENE).await.status, StatusCode::OK);
    let r = post(t, "/api/v1/jobs", &t.alice, spec(frames)).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.json());
    r.json()["job_id"].as_u64().unwrap()
}

#[tokio::test]
async fn without_a_valid_token_every_endpoint_answers_401_in_json() {
    let t = setup();
    for (uri, token) in [("/api/v1/jobs", None), ("/api/v1/whoami", Some("tsr_nope"))] {
        let r = call(&t, Method::GET, uri, token, Body::empty(), &[]).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers[header::WWW_AUTHENTICATE], "Bearer");
        let v = r.json();
        assert!(!v["error"].as_str().unwrap().is_empty());
        assert!(
            v["hint"]
                .as_str()
                .unwrap()
                .contains("Authorization: Bearer"),
            "{v}"
        );
    }
}

#[tokio::test]
async fn whoami_names_the_user_role_and_version() {
    let t = setup();
    let v = get(&t, "/api/v1/whoami", &t.alice).await.json();
    assert_eq!(
        v,
        json!({"user": "alice", "role": "user", "version": env!("CARGO_PKG_VERSION")})
    );
    assert_eq!(
        get(&t, "/api/v1/whoami", &t.worker).await.json()["role"],
        "worker"
    );
}

#[tokio::test]
async fn a_job_submitted_over_http_is_seen_by_its_owner_and_admins_only() {
    let t = setup();
    let id = alice_job(&t, "1-3").await;
    let mine = get(&t, &format!("/api/v1/jobs/{id}"), &t.alice).await;
    assert_eq!(mine.status, StatusCode::OK);
    let v = mine.json();
    assert_eq!(
        (v["id"].as_u64(), v["state"].as_str()),
        (Some(id), Some("queued"))
    );
    assert_eq!(v["frames_total"], 3);
    // Submitted without `chunk`: one queued run of frames, which leases
    // carve (see `farm::chunking`).
    assert_eq!(v["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(v["tasks"][0]["frames"], json!([1, 2, 3]));
    // The same object as `tessera status --json`: the one conversion.
    let snap = t
        .farm
        .job_page(crate::model::job::JobId(id), super::jobs::page_for_tests())
        .unwrap();
    assert_eq!(v, tessera_proto::json::job(&(&snap).into()));
    // Bob cannot tell it from a missing job, nor act on it.
    let other = get(&t, &format!("/api/v1/jobs/{id}"), &t.bob).await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    let cancel = post(&t, &format!("/api/v1/jobs/{id}/cancel"), &t.bob, json!({})).await;
    assert_eq!(cancel.status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&t, "/api/v1/jobs", &t.bob).await.json()["jobs"],
        json!([])
    );
    let all = get(&t, "/api/v1/jobs", &t.admin).await.json();
    assert_eq!(all["jobs"][0]["id"], id);
    assert_eq!(all["next_after"], Value::Null);
    // Workers and worker tokens are not clients.
    assert_eq!(
        get(&t, "/api/v1/jobs", &t.worker).await.status,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn jobs_are_paged_with_limit_and_after() {
    let t = setup();
    let a = alice_job(&t, "1").await;
    let b = alice_job(&t, "2").await;
    let p = get(&t, "/api/v1/jobs?limit=1", &t.alice).await.json();
    assert_eq!(p["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(p["next_after"], a);
    let p = get(&t, &format!("/api/v1/jobs?limit=1&after={a}"), &t.alice)
        .await
        .json();
    assert_eq!(p["jobs"][0]["id"], b);
    assert_eq!(
        get(&t, "/api/v1/jobs?limit=x", &t.alice).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn actions_answer_the_job_and_a_wrong_one_is_a_conflict() {
    let t = setup();
    let id = alice_job(&t, "1-2").await;
    let r = post(&t, &format!("/api/v1/jobs/{id}/pause"), &t.alice, json!({})).await;
    assert_eq!(r.json()["state"], "paused");
    let r = post(
        &t,
        &format!("/api/v1/jobs/{id}/resume"),
        &t.alice,
        json!({}),
    )
    .await;
    assert_eq!(r.json()["state"], "queued");
    let r = post(
        &t,
        &format!("/api/v1/jobs/{id}/cancel"),
        &t.alice,
        json!({}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (StatusCode::OK, json!("canceled"))
    );
    let again = post(
        &t,
        &format!("/api/v1/jobs/{id}/cancel"),
        &t.alice,
        json!({}),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.json());
    let r = post(&t, &format!("/api/v1/jobs/{id}/retry"), &t.admin, json!({})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        get(&t, "/api/v1/jobs/abc", &t.alice).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn submit_needs_the_callers_own_upload_and_a_valid_spec() {
    let t = setup();
    // Not uploaded (by Bob, or at all): refused.
    assert_eq!(upload(&t, &t.alice, SCENE).await.status, StatusCode::OK);
    let r = post(&t, "/api/v1/jobs", &t.bob, spec("1")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["hint"].as_str().unwrap().contains("upload"),
        "{}",
        r.json()
    );
    for bad in [
        json!({"scene_digest": "zz", "frames": "1"}),
        json!({"scene_digest": Digest::of(SCENE).to_hex(), "frames": "9-1"}),
        json!({"scene_digest": Digest::of(SCENE).to_hex(), "frames": "1", "frame": "2"}),
    ] {
        let r = post(&t, "/api/v1/jobs", &t.alice, bad.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let r = call(
        &t,
        Method::POST,
        "/api/v1/jobs",
        Some(&t.alice),
        "not json",
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.json()["error"].as_str().unwrap().contains("JobSpec"));
}

#[tokio::test]
async fn uploads_are_rehashed_idempotent_and_size_limited() {
    let t = setup();
    let first = upload(&t, &t.alice, b"some bytes").await.json();
    assert_eq!(first["already_present"], false);
    assert_eq!(first["size"], 10);
    assert_eq!(
        upload(&t, &t.alice, b"some bytes").await.json()["already_present"],
        true
    );
    // Bob uploading the same bytes learns nothing about Alice's.
    assert_eq!(
        upload(&t, &t.bob, b"some bytes").await.json()["already_present"],
        false
    );
    // Bytes that are not the digest's.
    let d = Digest::of(b"other").to_hex();
    let r = call(
        &t,
        Method::PUT,
        &format!("/api/v1/blobs/{d}"),
        Some(&t.alice),
        "some bytes",
        &[("content-length", "10")],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(!t.blobs.contains(&Digest::of(b"other")));
    // A bad digest, a body over the limit, no length.
    let r = call(
        &t,
        Method::PUT,
        "/api/v1/blobs/xyz",
        Some(&t.alice),
        "x",
        &[("content-length", "1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let big = (2u64 << 20).to_string();
    let r = call(
        &t,
        Method::PUT,
        &format!("/api/v1/blobs/{d}"),
        Some(&t.alice),
        Body::empty(),
        &[("content-length", &big)],
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", r.json());
    let r = call(
        &t,
        Method::PUT,
        &format!("/api/v1/blobs/{d}"),
        Some(&t.alice),
        Body::empty(),
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::LENGTH_REQUIRED);
    // A JSON body over the message limit.
    let huge = vec![b' '; (4 << 20) + 10];
    let r = call(
        &t,
        Method::POST,
        "/api/v1/blobs/missing",
        Some(&t.alice),
        huge,
        &[],
    )
    .await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn missing_answers_only_about_the_callers_own_blobs() {
    let t = setup();
    upload(&t, &t.alice, b"mine").await;
    let asked = json!({"digests": [Digest::of(b"mine").to_hex(), Digest::of(b"none").to_hex()]});
    let a = post(&t, "/api/v1/blobs/missing", &t.alice, asked.clone())
        .await
        .json();
    assert_eq!(a["missing"], json!([Digest::of(b"none").to_hex()]));
    let b = post(&t, "/api/v1/blobs/missing", &t.bob, asked)
        .await
        .json();
    assert_eq!(b["missing"].as_array().unwrap().len(), 2);
    let bad = post(
        &t,
        "/api/v1/blobs/missing",
        &t.bob,
        json!({"digests": ["nope"]}),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_file_set_from_json_is_the_protobuf_blob_submit_uses() {
    let t = setup();
    let scene = Digest::of(SCENE).to_hex();
    upload(&t, &t.alice, SCENE).await;
    let set = json!({"scene": "shots/a.blend", "files": [{"path": "shots/a.blend", "digest": scene, "size": SCENE.len(), "mode": 420}]});
    let r = post(&t, "/api/v1/filesets", &t.alice, set).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json());
    let d = r.json()["digest"].as_str().unwrap().to_string();
    let expected = prost::Message::encode_to_vec(&tessera_proto::FileSet {
        scene: "shots/a.blend".into(),
        files: vec![tessera_proto::FileEntry {
            path: "shots/a.blend".into(),
            digest: scene.clone(),
            size: SCENE.len() as u64,
            mode: 420,
            shared: String::new(),
        }],
        ..Default::default()
    });
    assert_eq!(d, Digest::of(&expected).to_hex());
    let mut s = spec("1");
    s["file_set_digest"] = json!(d);
    let r = post(&t, "/api/v1/jobs", &t.alice, s).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.json());
    // A set whose paths escape the root is refused like at submit.
    let bad = json!({"scene": "../a.blend", "files": [{"path": "../a.blend", "digest": scene, "size": 1}]});
    assert_eq!(
        post(&t, "/api/v1/filesets", &t.alice, bad).await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn check_says_how_a_job_splits_and_why_it_would_wait_and_creates_nothing() {
    let t = setup();
    // Nothing is uploaded: the check does not need it.
    let mut s = spec("1-10");
    s["chunk"] = json!(3);
    let v = post(&t, "/api/v1/jobs/check", &t.alice, s.clone())
        .await
        .json();
    assert_eq!(
        (
            v["tasks"].as_u64(),
            v["frames"].as_u64(),
            v["workers"].as_u64()
        ),
        (Some(4), Some(10), Some(0))
    );
    assert!(
        v["waiting"]
            .as_str()
            .unwrap()
            .starts_with("waiting: no available worker"),
        "{v}"
    );
    t.farm
        .register(Registration {
            blender_version: "Blender 3.4.1".into(),
            name: "w".into(),
            slots: 1,
            ..Default::default()
        })
        .unwrap();
    let v = post(&t, "/api/v1/jobs/check", &t.alice, s).await.json();
    assert_eq!(
        (v["workers"].as_u64(), v["waiting"].as_str()),
        (Some(1), Some(""))
    );
    let v = post(&t, "/api/v1/jobs/check", &t.alice, json!({"frames": "1-4", "tiles": "2x2", "scene_info": {"width": 64, "height": 32, "file_format": "PNG"}})).await.json();
    assert_eq!(v["tasks"], 16);
    for bad in [
        json!({"frames": "x"}),
        json!({"frames": "1", "tiles": "2x2"}),
        json!({"frames": "1", "tiles": "2x2", "scene_info": {"width": 64, "height": 32, "file_format": "JPEG"}}),
        json!({"frames": "1", "device": "tpu"}),
        json!({"frames": "1", "features": ["time-travel"]}),
        json!({"frames": "1", "scene_info": {"width": 1000000, "height": 1000000}}),
    ] {
        let r = post(&t, "/api/v1/jobs/check", &t.alice, bad.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.json());
    }
    assert_eq!(
        get(&t, "/api/v1/jobs", &t.admin).await.json()["jobs"],
        json!([])
    );
}

#[tokio::test]
async fn check_accepts_exactly_what_submit_accepts() {
    let t = setup();
    upload(&t, &t.alice, SCENE).await;
    let cases = [
        json!({"frames": "1-5", "chunk": 2}),
        json!({"frames": "0-99999999"}),
        json!({"frames": "1", "max_attempts": 101}),
        json!({"frames": "1", "overscan": 5000}),
        json!({"frames": "1", "tiles": "3x3", "scene_info": {"width": 90, "height": 90, "file_format": "OPEN_EXR"}}),
        json!({"frames": "1", "tiles": "99x99", "scene_info": {"width": 90, "height": 90, "file_format": "PNG"}}),
        json!({"frames": "1", "tiles": "0x2"}),
        json!({"frames": "1", "min_vram_gb": -1.0}),
        json!({"frames": "1", "device": "optix", "tags": ["big"]}),
    ];
    for mut c in cases {
        c["scene_digest"] = json!(Digest::of(SCENE).to_hex());
        let checked = post(&t, "/api/v1/jobs/check", &t.alice, c.clone()).await;
        let submitted = post(&t, "/api/v1/jobs", &t.alice, c.clone()).await;
        assert_eq!(
            checked.status == StatusCode::OK,
            submitted.status == StatusCode::CREATED,
            "{c}: check {} / submit {}",
            checked.json(),
            submitted.json()
        );
        if submitted.status == StatusCode::CREATED {
            let id = submitted.json()["job_id"].as_u64().unwrap();
            let job = get(&t, &format!("/api/v1/jobs/{id}"), &t.alice)
                .await
                .json();
            assert_eq!(checked.json()["tasks"], job["tasks_total"], "{c}");
        }
    }
}

#[tokio::test]
async fn a_frame_not_rendered_is_404_and_frame_numbers_are_checked() {
    let t = setup();
    let id = alice_job(&t, "1").await;
    let r = get(&t, &format!("/api/v1/jobs/{id}/frames/1"), &t.alice).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("not rendered yet"));
    let r = get(&t, &format!("/api/v1/jobs/{id}/frames/one"), &t.alice).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = get(&t, &format!("/api/v1/jobs/{id}/frames/1"), &t.bob).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_dashboard_session_is_an_httponly_strict_cookie_and_changes_need_csrf() {
    let t = setup();
    let id = alice_job(&t, "1").await;
    let json_ct = [("content-type", "application/json")];
    let body = json!({"token": t.alice}).to_string();
    let r = call(
        &t,
        Method::POST,
        "/api/v1/session",
        None,
        body.clone(),
        &json_ct,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let cookie = r.headers[header::SET_COOKIE].to_str().unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let csrf = r.json()["csrf"].as_str().unwrap().to_string();
    let session = cookie.split(';').next().unwrap().to_string();
    // A form post (no JSON) cannot sign in; a bad token cannot either.
    let r = call(&t, Method::POST, "/api/v1/session", None, body, &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = call(
        &t,
        Method::POST,
        "/api/v1/session",
        None,
        r#"{"token":"tsr_x"}"#,
        &json_ct,
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Reads with the cookie alone; changes need the CSRF token too.
    let r = call(
        &t,
        Method::GET,
        "/api/v1/whoami",
        None,
        Body::empty(),
        &[("cookie", &session)],
    )
    .await;
    assert_eq!(r.json()["csrf"], json!(csrf));
    let uri = format!("/api/v1/jobs/{id}/pause");
    let r = call(
        &t,
        Method::POST,
        &uri,
        None,
        Body::empty(),
        &[("cookie", &session)],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = call(
        &t,
        Method::POST,
        &uri,
        None,
        Body::empty(),
        &[("cookie", &session), ("x-csrf-token", "0000")],
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = call(
        &t,
        Method::POST,
        &uri,
        None,
        Body::empty(),
        &[("cookie", &session), ("x-csrf-token", &csrf)],
    )
    .await;
    assert_eq!(
        (r.status, r.json()["state"].clone()),
        (StatusCode::OK, json!("paused"))
    );
    // Pages are served to anyone (they hold no data); the script signs in.
    for page in ["/", "/jobs/1", "/workers", "/login"] {
        let r = call(&t, Method::GET, page, None, Body::empty(), &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{page}");
        assert!(String::from_utf8_lossy(&r.body).contains("/assets/app.js"));
    }
}

#[tokio::test]
async fn too_many_event_streams_of_one_user_answer_429() {
    let t = setup();
    let mut open = Vec::new();
    for _ in 0..MAX_STREAMS_PER_USER {
        let req = Request::get("/api/v1/events")
            .header(header::AUTHORIZATION, format!("Bearer {}", t.alice))
            .body(Body::empty())
            .unwrap();
        let res = t.app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()[header::CONTENT_TYPE], "text/event-stream");
        open.push(res);
    }
    let r = get(&t, "/api/v1/events", &t.alice).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    drop(open);
    // Bob is not limited by Alice's streams.
    let req = Request::get("/api/v1/events")
        .header(header::AUTHORIZATION, format!("Bearer {}", t.bob))
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        t.app.clone().oneshot(req).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_openapi_document_matches_the_routes() {
    let t = setup();
    let doc = call(
        &t,
        Method::GET,
        "/api/v1/openapi.json",
        None,
        Body::empty(),
        &[],
    )
    .await
    .json();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    let mut routed: Vec<(String, String)> = routes()
        .iter()
        .map(|(m, p, _)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    routed.sort();
    assert_eq!(documented, routed);
    for (m, p, _) in routes() {
        assert!(
            super::openapi::describe(&m, p).is_some(),
            "{m} {p} is not described"
        );
        // Every documented route is served: the router's fallback never answers.
        let uri = p
            .replace("{id}", "1")
            .replace("{frame}", "1")
            .replace("{digest}", &"a".repeat(64));
        let r = call(&t, m.clone(), &uri, Some(&t.admin), Body::empty(), &[]).await;
        let text = String::from_utf8_lossy(&r.body);
        assert!(
            r.status != StatusCode::METHOD_NOT_ALLOWED
                && !text.contains("no such page or endpoint"),
            "{m} {p}: {} {text}",
            r.status
        );
    }
    // And an undocumented one is not.
    let r = get(&t, "/api/v1/nothing", &t.admin).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(r.json()["hint"].as_str().unwrap().contains("openapi.json"));
}

#[tokio::test]
async fn pipeline_routes_update_dependencies_and_budgets_and_refuse_cycles() {
    let t = setup();
    let a = alice_job(&t, "1-2").await;
    let b = alice_job(&t, "1").await;
    let r = post(
        &t,
        &format!("/api/v1/jobs/{b}/update"),
        &t.alice,
        json!({"after": [a], "max_cost": 12.5}),
    )
    .await;
    assert_eq!(r.json()["after"], json!([a]));
    assert_eq!(r.json()["max_cost"], 12.5);
    assert_eq!(r.json()["waiting_for"], a);
    let r = post(
        &t,
        &format!("/api/v1/jobs/{a}/update"),
        &t.alice,
        json!({"after": [b]}),
    )
    .await;
    assert!(
        r.json()["error"].as_str().unwrap().contains("cycle"),
        "{}",
        r.json()
    );
    let r = post(&t, &format!("/api/v1/jobs/{a}/update"), &t.alice, json!({})).await;
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("nothing to change"));
    // Frames of a queued job are queued already.
    let r = post(
        &t,
        &format!("/api/v1/jobs/{a}/rerun"),
        &t.alice,
        json!({"frames": "1"}),
    )
    .await;
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("already queued"),
        "{}",
        r.json()
    );
}

#[test]
fn a_store_failure_answers_with_its_backends_fix() {
    use crate::error::{Backend, Error, StoreFailure};
    let s3 = Backend::S3 {
        location: "s3://renders/farm".into(),
        endpoint: "http://minio:9000".into(),
    };
    let e = super::ApiError::from(Error::from(StoreFailure::new(
        s3,
        "cannot write blob ab12: access denied",
    )));
    assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        e.error.contains("s3://renders/farm at http://minio:9000"),
        "{}",
        e.error
    );
    assert!(e.hint.contains("credentials"), "{}", e.hint);
    assert!(!e.hint.contains("--data"), "{}", e.hint);
    let sled = Backend::Sled {
        dir: "/var/lib/tessera/db".into(),
    };
    let e = super::ApiError::from(Error::from(StoreFailure::new(sled, "cannot flush")));
    assert!(e.hint.contains("--data volume"), "{}", e.hint);
}

/// The object schema a schema of the OpenAPI document stands for: `$ref`s,
/// nullable `oneOf`s and array items followed.
fn object_schema<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    let mut s = schema;
    loop {
        if let Some(r) = s["$ref"].as_str() {
            s = &doc["components"]["schemas"][r.rsplit('/').next().unwrap()];
        } else if let Some(some) = s["oneOf"]
            .as_array()
            .and_then(|o| o.iter().find(|x| x["type"] != "null"))
        {
            s = some;
        } else if s["items"].is_object() {
            s = &s["items"];
        } else {
            return s;
        }
    }
}

/// The properties a schema names.
fn schema_properties(doc: &Value, schema: &Value) -> BTreeSet<String> {
    object_schema(doc, schema)["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every object in `answer` has exactly the properties its schema names.
fn check_against_schema(doc: &Value, schema: &Value, answer: &Value, at: &str) {
    let object = match answer {
        Value::Array(items) => items.first(),
        Value::Object(_) => Some(answer),
        _ => None,
    };
    let Some(Value::Object(fields)) = object else {
        return;
    };
    let named = schema_properties(doc, schema);
    let sent: BTreeSet<String> = fields.keys().cloned().collect();
    assert_eq!(
        sent, named,
        "{at}: the answer's fields and the schema's differ"
    );
    let s = object_schema(doc, schema);
    for (k, v) in fields {
        check_against_schema(doc, &s["properties"][k.as_str()], v, &format!("{at}.{k}"));
    }
}

#[test]
fn the_openapi_schemas_name_every_field_of_the_views() {
    let doc = super::openapi::document();
    let schemas = &doc["components"]["schemas"];
    let job = pb::JobView {
        id: 3,
        usage: Some(Default::default()),
        preview: Some(Default::default()),
        outputs: vec![Default::default()],
        frame_tiles: vec![Default::default()],
        frame_stats: vec![Default::default()],
        tasks: vec![pb::TaskView {
            attempt_log: vec![Default::default()],
            ..Default::default()
        }],
        ..Default::default()
    };
    let list = json!({"jobs": [tessera_proto::json::job(&job)], "next_after": 4});
    check_against_schema(&doc, &schemas["JobList"], &list, "JobList");
    let worker = pb::WorkerView {
        runtimes: vec![Default::default()],
        slot_info: vec![Default::default()],
        gpus: vec![pb::Gpu {
            telemetry: Some(Default::default()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let list = json!({"workers": [tessera_proto::json::worker(&worker)]});
    check_against_schema(&doc, &schemas["WorkerList"], &list, "WorkerList");
    // The request bodies' schemas refuse unknown fields, as the API does.
    for body in [
        "JobSpec",
        "FileSet",
        "JobUpdate",
        "Rerun",
        "SignIn",
        "Digests",
    ] {
        assert_eq!(schemas[body]["additionalProperties"], false, "{body}");
    }
    let spec = schema_properties(&doc, &schemas["JobSpec"]);
    for field in [
        "scene_digest",
        "frames",
        "scene_info",
        "file_set_digest",
        "verify",
    ] {
        assert!(spec.contains(field), "JobSpec has no {field}: {spec:?}");
    }
}
