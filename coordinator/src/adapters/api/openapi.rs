//! The OpenAPI 3.1 document of the API, served at `/api/v1/openapi.json`.
//! Its paths come from [`super::routes`], the table the router is built
//! from, so the two cannot drift; each route's description is here.

use axum::http::Method;
use axum::response::Response;
use serde_json::{json, Map, Value};

use super::ok;

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
            json!({"summary": "render these frames of the job again (even of a done job); answers the job and the frames to render", "body": "Rerun", "ok": ["200", "Rerun"]})
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

/// A job's preview video in a job view.
fn preview_schema() -> Value {
    json!({"type": "object", "properties": {
        "state": {"enum": ["pending", "ready", "failed"]}, "digest": {"type": "string"},
        "size": {"type": "integer"}, "frames": {"type": "integer"}, "width": {"type": "integer"},
        "height": {"type": "integer"}, "fps": {"type": "number"}, "message": {"type": "string"},
    }})
}

/// The whole document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for (method, path, _) in super::routes() {
        let entry = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        entry[method.as_str().to_lowercase()] = operation(&method, path);
    }
    let s = |props: Value| json!({"type": "object", "properties": props});
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
            "schemas": {
                "Error": s(json!({"error": {"type": "string"}, "hint": {"type": "string"}})),
                "WhoAmI": s(json!({"user": {"type": "string"}, "role": {"enum": ["user", "admin", "worker"]}, "version": {"type": "string"}, "csrf": {"type": "string"}})),
                "SignIn": s(json!({"token": {"type": "string"}})),
                "Empty": s(json!({})),
                "Any": {},
                "Image": {"type": "string", "format": "binary"},
                "Video": {"type": "string", "format": "binary", "description": "video/mp4"},
                "EventStream": {"type": "string", "description": "text/event-stream"},
                "JobSpec": s(json!({
                    "scene_digest": {"type": "string"}, "scene_name": {"type": "string"},
                    "frames": {"type": "string", "examples": ["1-250", "1,5,10-20"]},
                    "chunk": {"type": "integer"}, "priority": {"type": "integer"},
                    "max_attempts": {"type": "integer"}, "tiles": {"type": "string", "examples": ["2x2"]},
                    "overscan": {"type": "integer"},
                    "scene_info": s(json!({"width": {"type": "integer"}, "height": {"type": "integer"}, "file_format": {"type": "string"}, "fps": {"type": "number"}})),
                    "device": {"enum": ["", "any", "cpu", "cuda", "optix"]}, "min_vram_gb": {"type": "number"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "file_set_digest": {"type": "string"},
                    "features": {"type": "array", "items": {"type": "string"}},
                    "after": {"type": "array", "items": {"type": "integer"}},
                    "max_cost": {"type": "number"},
                    "capacity": {"enum": ["", "spot-ok", "on-demand-only"]},
                    "preview": {"type": "boolean"},
                    "verify": {"type": "number", "minimum": 0, "maximum": 1, "description": "fraction of tasks rendered again on a different worker and compared"},
                })),
                "JobCheck": s(json!({"tasks": {"type": "integer"}, "frames": {"type": "integer"}, "workers": {"type": "integer"}, "waiting": {"type": "string"}})),
                "JobCreated": s(json!({"job_id": {"type": "integer"}})),
                "Rerun": s(json!({"frames": {"type": "string", "examples": ["10-20"]}, "job": {"type": "object"}})),
                "JobUpdate": s(json!({"after": {"type": "array", "items": {"type": "integer"}}, "max_cost": {"type": "number"}, "clear_max_cost": {"type": "boolean"}})),
                "Job": s(json!({
                    "id": {"type": "integer"}, "state": {"enum": ["queued", "running", "paused", "done", "failed", "canceled"]},
                    "frames_total": {"type": "integer"}, "frames_done": {"type": "integer"},
                    "outputs": {"type": "array", "items": s(json!({"frame": {"type": "integer"}, "digest": {"type": "string"}, "ext": {"type": "string"}, "size": {"type": "integer"}, "pass": {"type": "string"}}))},
                    "outputs_total": {"type": "integer"},
                    "tasks": {"type": "array", "items": {"type": "object"}},
                    "frame_tiles": {"type": "array", "items": {"type": "object"}},
                    "waiting": {"type": "string"}, "message": {"type": "string"}, "owner": {"type": "string"},
                    "warnings": {"type": "array", "items": {"type": "string"}, "description": "what workers reported about how the frames were rendered, e.g. a driver that needs auto-run Python and was not evaluated"},
                    "fps": {"type": ["number", "null"]},
                    "preview": {"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/Preview"}]},
                    "verify": {"type": "number"}, "tasks_verifying": {"type": "integer"},
                    "outages": {"type": "array", "items": {"type": "string"}, "description": "what the farm depends on that does not answer now (GET of one job only), e.g. \"blobs: S3 s3://renders/farm at http://s3:8333 unreachable since 2026-12-04 14:30:00 UTC (connection refused)\""},
                    "frame_stats": {"type": "array", "items": {"type": "object", "description": "frame, tile, render_ms, sync_ms, samples, memory_peak_bytes"}},
                    "after": {"type": "array", "items": {"type": "integer"}}, "waiting_for": {"type": ["integer", "null"]},
                    "max_cost": {"type": ["number", "null"]}, "capacity": {"enum": ["spot-ok", "on-demand-only"]},
                    "usage": {"type": "object", "description": "gpu_hours, cpu_hours, cost, failed_hours, failed_cost, preempted_hours, preempted_cost"},
                })),
                "Preview": preview_schema(),
                "JobList": s(json!({"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}, "next_after": {"type": ["integer", "null"]}})),
                "WorkerList": s(json!({"workers": {"type": "array", "items": {"type": "object"}}})),
                "Digests": s(json!({"digests": {"type": "array", "items": {"type": "string"}}})),
                "Missing": s(json!({"missing": {"type": "array", "items": {"type": "string"}}})),
                "BlobStored": s(json!({"digest": {"type": "string"}, "size": {"type": "integer"}, "already_present": {"type": "boolean"}})),
                "FileSet": s(json!({
                    "scene": {"type": "string"},
                    "files": {"type": "array", "items": s(json!({"path": {"type": "string"}, "digest": {"type": "string"}, "size": {"type": "integer"}, "mode": {"type": "integer"}, "shared": {"type": "string"}}))},
                    "mappings": {"type": "array", "items": s(json!({"from": {"type": "string"}, "to": {"type": "string"}}))},
                    "missing": {"type": "array", "items": {"type": "string"}},
                })),
                "FileSetStored": s(json!({"digest": {"type": "string"}})),
            },
        },
    })
}
