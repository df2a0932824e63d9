//! The OpenAPI 3.1 document of the API, served at `/api/v1/openapi.json`.
//! Its paths come from [`super::routes`], the table the router is built
//! from, and its schemas from the serde types of the bodies (utoipa's
//! `ToSchema`), so neither can drift; each route's description is here.

use axum::http::Method;
use axum::response::Response;
use serde_json::{json, Map, Value};
use tessera_proto::{json, v1 as pb};
use utoipa::openapi::{RefOr, Schema};
use utoipa::ToSchema;

use super::{blobs, jobs, ok, pipeline, web};

/// `GET /api/v1/openapi.json`.
pub async fn serve() -> Response {
    ok(document())
}

fn error_ref() -> Value {
    json!({"description": "an error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}})
}

fn json_body(schema: &str) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

fn answer(schema: &str) -> Value {
    json!({"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}})
}

fn query(name: &str, what: &str) -> Value {
    json!({"name": name, "in": "query", "required": false, "description": what, "schema": {"type": "integer", "minimum": 0}})
}

/// What a route does: summary, extra query parameters, request body schema,
/// the success status and its schema. None for a route not described (the
/// unit tests refuse that).
pub fn describe(method: &Method, path: &str) -> Option<Value> {
    let job_actions = |verb: &str| json!({"summary": format!("{verb} the job; answers the job"), "ok": ["200", "Job"]});
    let d = match (method.as_str(), path) {
        ("GET", "/api/v1/whoami") => {
            json!({"summary": "who the token belongs to", "ok": ["200", "WhoAmI"]})
        }
        ("POST", "/api/v1/session") => {
            json!({"summary": "dashboard sign-in: keeps the token in an HttpOnly cookie", "body": "SignIn", "ok": ["200", "WhoAmI"], "public": true})
        }
        ("POST", "/api/v1/session/end") => {
            json!({"summary": "dashboard sign-out", "ok": ["200", "Empty"]})
        }
        ("GET", "/api/v1/jobs") => {
            json!({"summary": "a page of job summaries the caller may see, oldest first", "query": [["limit", "most jobs (default 100, at most 1000)"], ["after", "only jobs with a greater id (the last page's next_after)"]], "ok": ["200", "JobList"]})
        }
        ("POST", "/api/v1/jobs") => {
            json!({"summary": "submit a job (its scene and file set uploaded first)", "body": "JobSpec", "ok": ["201", "JobCreated"]})
        }
        ("POST", "/api/v1/jobs/check") => {
            json!({"summary": "check a job as submit would, except that its blobs exist; creates nothing", "body": "JobSpec", "ok": ["200", "JobCheck"]})
        }
        ("GET", "/api/v1/jobs/{id}") => {
            json!({"summary": "one job: state, progress, tasks, outputs, failures with Blender's log tail, why it waits", "query": [["task_from", "first task"], ["task_limit", "most tasks (default 1000, at most 10000)"], ["output_from", "first output"], ["output_limit", "most outputs (default 10000, at most 10000)"]], "ok": ["200", "Job"]})
        }
        ("POST", "/api/v1/jobs/{id}/cancel") => job_actions("cancel"),
        ("POST", "/api/v1/jobs/{id}/pause") => job_actions("pause"),
        ("POST", "/api/v1/jobs/{id}/resume") => job_actions("resume"),
        ("POST", "/api/v1/jobs/{id}/retry") => job_actions("retry the failed tasks of"),
        ("POST", "/api/v1/jobs/{id}/rerun") => {
            json!({"summary": "render these frames of the job again (even of a done job); answers the job and the frames to render", "body": "Rerun", "ok": ["200", "Reran"]})
        }
        ("POST", "/api/v1/jobs/{id}/update") => {
            json!({"summary": "change the jobs it waits for (before it starts; a cycle is refused) or its budget; answers the job", "body": "JobUpdate", "ok": ["200", "Job"]})
        }
        ("GET", "/api/v1/jobs/{id}/frames/{frame}") => {
            json!({"summary": "a rendered frame (image/png or image/x-exr), or with ?thumb=N a PNG thumbnail at most N pixels on a side (EXR tone-mapped)", "query": [["thumb", "thumbnail size in pixels (1-1024)"]], "ok": ["200", "Image"]})
        }
        ("GET", "/api/v1/jobs/{id}/preview") => {
            json!({"summary": "the job's preview video (video/mp4, H.264), whole or a byte range (Range: bytes=A-B); 404 while it is not made", "ok": ["200", "Video"]})
        }
        ("POST", "/api/v1/jobs/{id}/preview") => {
            json!({"summary": "ask for the job's preview video: made with ffmpeg when the job is done (a failed one is tried again); answers the job, whose `preview` says when it is ready", "ok": ["200", "Job"]})
        }
        ("GET", "/api/v1/workers") => {
            json!({"summary": "every worker: slots, GPUs with telemetry, health and drain reason", "ok": ["200", "WorkerList"]})
        }
        ("GET", "/api/v1/events") => {
            json!({"summary": "Server-Sent Events: `hello`, then `job` (a job summary) and `worker` (a worker) as they change", "ok": ["200", "EventStream"]})
        }
        ("POST", "/api/v1/blobs/missing") => {
            json!({"summary": "which of these blobs the caller must upload", "body": "Digests", "ok": ["200", "Missing"]})
        }
        ("PUT", "/api/v1/blobs/{digest}") => {
            json!({"summary": "upload a blob: the raw bytes with Content-Length; re-hashed, idempotent, size-limited", "body": "Bytes", "ok": ["200", "BlobStored"]})
        }
        ("POST", "/api/v1/filesets") => {
            json!({"summary": "store a file set (as `tessera submit` builds it) given as JSON; answers its digest", "body": "FileSet", "ok": ["200", "FileSetStored"]})
        }
        ("GET", "/api/v1/openapi.json") => {
            json!({"summary": "this document", "ok": ["200", "Any"], "public": true})
        }
        _ => return None,
    };
    Some(d)
}

fn operation(method: &Method, path: &str) -> Value {
    let d = describe(method, path).unwrap_or_else(|| json!({"summary": "", "ok": ["200", "Any"]}));
    let mut params: Vec<Value> = path
        .split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|name| {
            let schema = if name == "digest" {
                json!({"type": "string", "pattern": "^[0-9a-f]{64}$"})
            } else {
                json!({"type": "integer", "minimum": 0})
            };
            json!({"name": name, "in": "path", "required": true, "schema": schema})
        })
        .collect();
    if let Some(q) = d["query"].as_array() {
        for p in q {
            params.push(query(
                p[0].as_str().unwrap_or_default(),
                p[1].as_str().unwrap_or_default(),
            ));
        }
    }
    let (status, schema) = (
        d["ok"][0].as_str().unwrap_or("200"),
        d["ok"][1].as_str().unwrap_or("Any"),
    );
    let mut responses = Map::new();
    responses.insert(status.into(), answer(schema));
    for code in ["400", "401", "403", "404", "409", "413", "429"] {
        responses.insert(code.into(), error_ref());
    }
    let mut op = json!({
        "summary": d["summary"],
        "operationId": format!("{} {}", method.as_str().to_lowercase(), path),
        "parameters": params,
        "responses": responses,
    });
    if let Some(body) = d["body"].as_str() {
        op["requestBody"] = if body == "Bytes" {
            json!({"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})
        } else {
            json_body(body)
        };
    }
    if d["public"] == json!(true) {
        op["security"] = json!([]);
    }
    op
}

/// Adds `T`'s schema and those it refers to.
fn add<T: ToSchema>(schemas: &mut Vec<(String, RefOr<Schema>)>) {
    schemas.push((T::name().into_owned(), T::schema()));
    T::schemas(schemas);
}

/// The schemas of the JSON bodies, derived from the serde types the API
/// reads and writes them with, and of the bodies that are not JSON.
fn schemas() -> Map<String, Value> {
    let mut derived = Vec::new();
    add::<super::ApiError>(&mut derived);
    add::<web::WhoAmI>(&mut derived);
    add::<web::SignIn>(&mut derived);
    add::<pb::JobSpec>(&mut derived);
    add::<jobs::JobCheck>(&mut derived);
    add::<jobs::JobCreated>(&mut derived);
    add::<pipeline::Rerun>(&mut derived);
    add::<pipeline::Reran>(&mut derived);
    add::<pipeline::Update>(&mut derived);
    add::<json::Job>(&mut derived);
    add::<jobs::JobList>(&mut derived);
    add::<jobs::WorkerList>(&mut derived);
    add::<blobs::MissingRequest>(&mut derived);
    add::<blobs::Missing>(&mut derived);
    add::<blobs::BlobStored>(&mut derived);
    add::<pb::FileSet>(&mut derived);
    add::<blobs::FileSetStored>(&mut derived);
    let mut out: Map<String, Value> = derived
        .into_iter()
        .map(|(name, schema)| {
            let schema = serde_json::to_value(schema).unwrap_or_default();
            (name, schema)
        })
        .collect();
    for (name, schema) in [
        ("Empty", json!({"type": "object", "properties": {}})),
        ("Any", json!({})),
        ("Image", json!({"type": "string", "format": "binary"})),
        (
            "Video",
            json!({"type": "string", "format": "binary", "description": "video/mp4"}),
        ),
        (
            "EventStream",
            json!({"type": "string", "description": "text/event-stream"}),
        ),
    ] {
        out.insert(name.into(), schema);
    }
    out
}

/// The whole document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, _) in super::routes() {
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[method.as_str().to_lowercase()] = operation(&method, path);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tessera coordinator API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The render farm over HTTP: the same jobs, blobs, roles and ownership as the gRPC API. Send `Authorization: Bearer <token>`. Errors are {\"error\", \"hint\"}.",
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": schemas(),
        },
    })
}
