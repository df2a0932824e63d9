// Tessera's dashboard: one script, no build step. It routes by path
// (/, /jobs/ID, /workers, /login), reads /api/v1/ with the session cookie,
// sends the CSRF token with every change, and follows /api/v1/events so
// that nothing polls.
"use strict";

const S = { me: null, events: null, handlers: {} };
const FINAL = ["done", "failed", "canceled"];

// Builds an element; strings become text nodes (never HTML).
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "style") e.style.cssText = v;
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const k of kids.flat()) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
  return e;
}

async function api(path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  if (opts.method && opts.method !== "GET") {
    headers["X-CSRF-Token"] = S.me ? S.me.csrf : "";
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";
  }
  const r = await fetch(path, { ...opts, headers, credentials: "same-origin" });
  const text = await r.text();
  let body = {};
  try { body = text ? JSON.parse(text) : {}; } catch (_) { body = { error: text }; }
  if (!r.ok) {
    const err = new Error(body.error || r.statusText);
    err.status = r.status; err.hint = body.hint || "";
    throw err;
  }
  return body;
}

function duration(ms) {
  if (!isFinite(ms) || ms < 0) return "–";
  const s = Math.round(ms / 1000);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}

function progress(j) {
  const total = j.frames_total || 0;
  const done = j.frames_done || 0;
  return { done, total, pct: total ? Math.min(100, (100 * done) / total) : 0 };
}

function bar(j) {
  const p = progress(j);
  const cls = "bar" + (j.state === "done" ? " done" : j.state === "failed" ? " failed" : "");
  return h("div", { class: cls, title: p.pct.toFixed(0) + "%" }, h("span", { style: "width:" + p.pct + "%" }));
}

function times(j) {
  const end = j.finished_ms || Date.now();
  const elapsed = end - j.created_ms;
  const p = progress(j);
  let left = "–";
  if (j.state === "running" && p.done > 0 && p.done < p.total) left = duration((elapsed / p.done) * (p.total - p.done));
  if (FINAL.includes(j.state)) left = "";
  return { elapsed: duration(elapsed), left };
}

function stateBadge(s) { return h("span", { class: "state " + s }, s); }

function mayChange(j) { return S.me && (S.me.role === "admin" || S.me.user === j.owner); }

function setLive(on) { document.getElementById("live").className = on ? "on" : ""; }

// One event stream for the page; pages register what they do with events.
function follow() {
  if (S.events) return;
  const es = new EventSource("/api/v1/events");
  S.events = es;
  es.addEventListener("hello", () => setLive(true));
  es.onerror = () => setLive(false);
  for (const kind of ["job", "worker"]) {
    es.addEventListener(kind, (ev) => {
      const f = S.handlers[kind];
      if (f) { try { f(JSON.parse(ev.data)); } catch (e) { console.error(e); } }
    });
  }
}

function showError(where, e) {
  where.replaceChildren(h("p", { class: "error" }, e.message), e.hint ? h("p", { class: "muted" }, e.hint) : null);
}

// ---- Sign-in ----
function loginPage(app, message) {
  document.getElementById("nav").hidden = true;
  const input = h("input", { type: "password", name: "token", id: "token", autocomplete: "current-password", placeholder: "tsr_…", required: true });
  const out = h("p", { class: "error", id: "login-error" }, message || "");
  const form = h("form", { class: "login card", id: "login" },
    h("h1", {}, "Sign in"),
    h("label", { for: "token" }, "Token (from `tessera users add NAME`, or the admin token)"),
    input, h("button", { type: "submit" }, "Sign in"), out);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      S.me = await api("/api/v1/session", { method: "POST", body: JSON.stringify({ token: input.value.trim() }) });
      location.href = "/";
    } catch (e) { out.textContent = e.message + (e.hint ? " — " + e.hint : ""); }
  });
  app.replaceChildren(form);
}

// ---- Jobs ----
function jobRow(j) {
  const t = times(j), p = progress(j);
  return h("tr", { "data-job": j.id, "data-state": j.state },
    h("td", {}, h("a", { href: "/jobs/" + j.id }, "#" + j.id)),
    h("td", { class: "hide-narrow" }, j.owner),
    h("td", {}, j.scene),
    h("td", {}, h("span", { class: "count" }, p.done + "/" + p.total), " ", bar(j)),
    h("td", { class: "hide-narrow" }, j.priority),
    h("td", {}, stateBadge(j.state), j.waiting ? h("div", { class: "muted" }, j.waiting) : null),
    h("td", { class: "hide-narrow" }, t.elapsed),
    h("td", {}, t.left));
}

async function jobsPage(app) {
  app.replaceChildren(h("h1", {}, S.me.role === "admin" ? "All jobs" : "Your jobs"));
  const body = h("tbody", { id: "jobs" });
  const table = h("div", { class: "scroll" }, h("table", {},
    h("thead", {}, h("tr", {}, ["Job", "Owner", "Scene", "Frames", "Priority", "State", "Elapsed", "Left"].map((c, i) =>
      h("th", { class: [1, 4, 6].includes(i) ? "hide-narrow" : null }, c)))), body));
  const empty = h("p", { class: "muted" }, "No jobs yet. Submit one with `tessera submit SCENE.blend` or the Blender add-on.");
  app.append(table);
  const rows = new Map(), data = new Map();
  const put = (j) => {
    data.set(j.id, j);
    const row = jobRow(j);
    const old = rows.get(j.id);
    if (old) old.replaceWith(row); else body.prepend(row);
    rows.set(j.id, row);
    empty.remove();
  };
  try {
    let after = 0;
    for (;;) {
      const page = await api("/api/v1/jobs?limit=1000&after=" + after);
      page.jobs.forEach(put);
      if (page.next_after === null) break;
      after = page.next_after;
    }
  } catch (e) { showError(app, e); return; }
  if (!rows.size) app.append(empty);
  S.handlers.job = put;
  // Elapsed and time left move on between events.
  setInterval(() => data.forEach((j) => { if (!FINAL.includes(j.state)) put(j); }), 5000);
}

// ---- One job ----
function expandFrames(job) {
  const frames = new Set();
  for (const t of job.tasks) for (const f of t.frames) frames.add(f);
  return [...frames].sort((a, b) => a - b);
}

function frameStates(job) {
  const st = new Map();
  const rank = { failed: 4, leased: 3, queued: 1, canceled: 0, done: 2 };
  for (const t of job.tasks) for (const f of t.frames) {
    const s = t.state;
    if (!st.has(f) || rank[s] > rank[st.get(f)]) st.set(f, s);
  }
  // A tiled frame is done once stitched; a whole frame once output.
  for (const ft of job.frame_tiles) st.set(ft.frame, ft.stitched ? "done" : (ft.tiles_done ? "leased" : st.get(ft.frame)));
  for (const o of job.outputs) if (!o.pass) st.set(o.frame, "done");
  return st;
}

function tilesOf(job) {
  const m = /^(\d+)x(\d+)$/.exec(job.tiles || "");
  if (!m) return null;
  const cols = +m[1], rows = +m[2];
  if (cols * rows <= 1) return null;
  // The frame being worked on: the lowest not stitched, else the last.
  const open = job.frame_tiles.find((f) => !f.stitched) || job.frame_tiles[job.frame_tiles.length - 1];
  if (!open) return null;
  const tasks = job.tasks.filter((t) => t.frames[0] === open.frame);
  const byTile = new Map(tasks.map((t) => [t.tile, t.state]));
  const grid = h("div", { class: "tiles", id: "tiles", style: "grid-template-columns:repeat(" + cols + ",1fr)" });
  // Tile 0 is at the bottom left (Blender's y axis); draw top row first.
  for (let r = rows - 1; r >= 0; r--) for (let c = 0; c < cols; c++) {
    const i = r * cols + c;
    grid.append(h("div", { class: "cell " + (open.stitched ? "done" : byTile.get(i) || "queued"), "data-tile": i }, i));
  }
  return h("div", {}, h("h2", {}, "Tiles of frame " + open.frame + " (" + open.tiles_done + "/" + open.tiles_total + ")"), grid);
}

// What Blender stamped into each frame (moved out by the workers), and verification.
function frameStats(job) {
  const stats = job.frame_stats || [];
  if (!stats.length) return null;
  const s = (ms) => ms ? (ms / 1000).toFixed(2) + " s" : "-";
  const mib = (b) => b ? (b / 1048576).toFixed(1) + " MiB" : "-";
  const rows = stats.map((f) => h("tr", {}, h("td", {}, f.frame + (f.tile == null ? "" : " tile " + f.tile)),
    h("td", {}, s(f.render_ms)), h("td", {}, s(f.sync_ms)), h("td", {}, f.samples || "-"), h("td", {}, mib(f.memory_peak_bytes))));
  return [h("h2", {}, "Render statistics"),
    job.verify ? h("p", { class: "muted" }, Math.round(job.verify * 100) + " % of tasks verified on a second worker; " + job.tasks_verifying + " awaiting a second result") : null,
    h("table", { id: "frame-stats" }, h("tr", {}, ["frame", "render", "sync", "samples", "peak memory"].map((c) => h("th", {}, c))), rows)];
}

function jobView(job) {
  const p = progress(job), t = times(job);
  const act = (name, label, cls) => h("button", { "data-action": name, class: cls, onclick: async (ev) => {
    ev.target.disabled = true;
    try { render(await api("/api/v1/jobs/" + job.id + "/" + name, { method: "POST" })); }
    catch (e) { alert(e.message + (e.hint ? "\n" + e.hint : "")); }
    finally { ev.target.disabled = false; refresh(); }
  } }, label);
  const buttons = h("div", { class: "actions" });
  if (mayChange(job)) {
    if (["queued", "running"].includes(job.state)) buttons.append(act("pause", "Pause"));
    if (job.state === "paused") buttons.append(act("resume", "Resume"));
    if (!FINAL.includes(job.state)) buttons.append(act("cancel", "Cancel", "danger"));
    if (["failed", "canceled"].includes(job.state)) buttons.append(act("retry", "Retry"));
  }
  const head = h("div", { class: "card" },
    h("h1", {}, "Job #" + job.id + " · " + job.scene + " ", h("span", { id: "job-state", class: "state " + job.state }, job.state)),
    h("div", {}, p.done + " of " + p.total + " frames", " ", bar(job), " ", h("span", { class: "muted" }, "elapsed " + t.elapsed + (t.left ? ", about " + t.left + " left" : ""))),
    job.waiting ? h("p", { class: "muted" }, job.waiting) : null,
    job.message ? h("pre", {}, job.message) : null,
    h("p", { class: "muted" }, "owner " + job.owner + " · frames " + job.frames + " · priority " + job.priority + " · device " + (job.device || "any") +
      (job.tags.length ? " · tags " + job.tags.join(",") : "") + (job.tiles && job.tiles !== "1x1" ? " · tiles " + job.tiles : "")),
    costLine(job),
    buttons);
  const states = frameStates(job);
  const grid = h("div", { class: "grid", id: "frames" }, expandFrames(job).map((f) =>
    h("div", { class: "cell " + (states.get(f) || "queued"), "data-frame": f, title: "frame " + f + ": " + (states.get(f) || "queued") }, f)));
  const beauty = job.outputs.filter((o) => !o.pass);
  const src = (f, n) => "/api/v1/jobs/" + job.id + "/frames/" + f + "?thumb=" + n;
  const last = beauty[beauty.length - 1];
  const hero = last ? h("div", { class: "hero" }, h("figure", {}, h("img", { id: "last-frame", src: src(last.frame, 1024), alt: "frame " + last.frame }),
    h("figcaption", { class: "muted" }, "last finished: frame " + last.frame))) : h("p", { class: "muted" }, "No frame finished yet.");
  const thumbs = h("div", { class: "thumbs", id: "thumbs" }, beauty.map((o) =>
    h("figure", {}, h("a", { href: "/api/v1/jobs/" + job.id + "/frames/" + o.frame }, h("img", { class: "thumb", loading: "lazy", src: src(o.frame, 256), alt: "frame " + o.frame, "data-frame": o.frame })), h("figcaption", {}, o.frame))));
  const failures = job.tasks.filter((t) => t.message);
  return [head, h("h2", {}, "Frames"), grid, tilesOf(job), previewOf(job, act), h("h2", {}, "Last frame"), hero,
    beauty.length ? [h("h2", {}, "All frames"), thumbs] : null, frameStats(job),
    failures.length ? [h("h2", {}, "Failures"), failures.map((t) =>
      h("div", { class: "card failure" }, h("strong", {}, "task " + t.index + " (frames " + t.frames.join(",") + ") · " + t.state + " · " + t.attempts + " attempt(s)" + (t.worker ? " · " + t.worker : "")), h("pre", {}, t.message)))] : null];
}

// The job's preview video (an MP4 the coordinator made with ffmpeg): the
// player when it is ready, why not when it failed, and a button to ask for
// one. The player is kept across re-renders so that playback goes on.
let player = null;
function previewOf(job, act) {
  const p = job.preview;
  const src = "/api/v1/jobs/" + job.id + "/preview";
  const ask = mayChange(job) && job.state === "done" && (!p || p.state === "failed")
    ? h("div", { class: "actions" }, act("preview", p ? "Try again" : "Make preview video")) : null;
  if (!p) return ask ? [h("h2", {}, "Preview video"), ask] : null;
  let body;
  if (p.state === "ready") {
    if (!player || player.dataset.digest !== p.digest) {
      player = h("video", { id: "preview", class: "preview", src: src, controls: true, loop: true, muted: true, preload: "metadata", "data-digest": p.digest });
    }
    body = [player, h("p", { class: "muted" }, p.frames + " frames · " + p.width + "×" + p.height + " · " + p.fps + " fps · " +
      Math.ceil(p.size / 1024) + " KiB · ", h("a", { href: src, download: "job-" + job.id + "-preview.mp4" }, "download MP4")),
      p.message ? h("p", { class: "muted" }, p.message) : null];
  } else if (p.state === "failed") {
    body = [h("p", { class: "error" }, "No preview video:"), h("pre", { id: "preview-error" }, p.message), ask];
  } else {
    body = h("p", { class: "muted", id: "preview-pending" }, job.state === "done" ? "Being made…" : "Made when the job is done (" + p.fps + " fps).");
  }
  // One level deep, like the rest of the page's parts.
  return [h("h2", {}, "Preview video")].concat(body);
}

let current = null, render = () => {}, refresh = () => {};

// What the job waits for and what it has cost (GPU/CPU slot-hours, budget).
function costLine(job) {
  const u = job.usage || {};
  const parts = [];
  if (job.after && job.after.length) parts.push("after job " + job.after.join(", "));
  parts.push("cost " + (u.cost || 0).toFixed(4) + " (" + (u.gpu_hours || 0).toFixed(3) + " GPU-h, " + (u.cpu_hours || 0).toFixed(3) + " CPU-h)");
  if (u.failed_cost) parts.push("failed attempts " + u.failed_cost.toFixed(4));
  if (u.preempted_cost) parts.push("preempted " + u.preempted_cost.toFixed(4));
  if (job.max_cost != null) parts.push("budget " + job.max_cost.toFixed(2));
  return h("p", { class: "muted", id: "job-cost" }, parts.join(" · "));
}

async function jobPage(app, id) {
  let timer = null, busy = false;
  render = (job) => { current = job; app.replaceChildren(...jobView(job).flat().filter(Boolean)); };
  refresh = async () => {
    if (busy) return; busy = true;
    try { render(await api("/api/v1/jobs/" + id)); } catch (e) { showError(app, e); }
    finally { busy = false; }
  };
  await refresh();
  // Changes come in bursts: fetch the whole view at most every 400 ms.
  S.handlers.job = (j) => {
    if (j.id !== id || timer) return;
    timer = setTimeout(() => { timer = null; refresh(); }, 400);
  };
}

// ---- Workers ----
function gib(b) { return (b / 1073741824).toFixed(1) + " GiB"; }

function workerCard(w) {
  const gpus = w.gpus.map((g) => {
    const t = g.telemetry;
    return h("div", { class: "gpu" }, h("strong", {}, "GPU " + g.index + ": " + g.name), " ", h("span", { class: "muted" }, gib(g.memory_bytes)),
      t ? h("div", {}, "memory " + gib(t.memory_used_bytes) + " · utilisation " + t.utilization_pct + "% · " + t.temperature_c + " °C" + (t.ecc_errors ? " · ECC " + t.ecc_errors : "")) : h("div", { class: "muted" }, "no telemetry"));
  });
  return h("div", { class: "card", "data-worker": w.id },
    h("h2", {}, w.name + " ", h("span", { class: "muted" }, w.id), " ", stateBadge(w.state)),
    w.drain_reason ? h("p", { class: "error" }, "draining: " + w.drain_reason) : null,
    w.suspect ? h("p", { class: "error", "data-suspect": "" }, "suspect: " + w.suspect) : null,
    w.untrusted ? h("p", { class: "muted" }, "untrusted: a share of its tasks is verified on other workers") : null,
    h("dl", { class: "kv" },
      h("dt", {}, "slots"), h("dd", {}, w.tasks_running + " busy of " + w.slots),
      h("dt", {}, "in hand"), h("dd", {}, (w.tasks_in_hand || []).length
        ? (w.tasks_in_hand || []).flatMap((t, i) => { const [job, task] = t.split("."); const a = h("a", { href: "/jobs/" + job }, "job " + job + " task " + task); return i ? [" · ", a] : [a]; })
        : "nothing"),
      h("dt", {}, "device"), h("dd", {}, w.device + (w.tags.length ? " · tags " + w.tags.join(",") : "")),
      h("dt", {}, "tasks"), h("dd", {}, w.tasks_done + " done, " + w.tasks_failed + " failed"),
      h("dt", {}, "blender"), h("dd", { "data-runtimes": "" }, (w.runtimes || []).length
        ? w.runtimes.map((r) => r.version + (r.kind === "bpy" ? " (bpy)" : "")
            + ((r.features.length || r.devices.length) ? ": " + r.features.concat(r.devices).join(", ") : "")).join(" · ")
        : w.blender),
      h("dt", {}, "cpu"), h("dd", {}, w.cpu_cores + " cores, " + gib(w.memory_bytes)),
      h("dt", {}, "last seen"), h("dd", {}, duration(Date.now() - w.last_seen_ms) + " ago")),
    gpus);
}

async function workersPage(app) {
  app.replaceChildren(h("h1", {}, "Workers"));
  const list = h("div", { class: "workers", id: "workers" });
  app.append(list);
  const cards = new Map();
  const put = (w) => {
    const c = workerCard(w);
    const old = cards.get(w.id);
    if (old) old.replaceWith(c); else list.append(c);
    cards.set(w.id, c);
  };
  try { (await api("/api/v1/workers")).workers.forEach(put); } catch (e) { showError(app, e); return; }
  if (!cards.size) list.append(h("p", { class: "muted" }, "No workers; start one with `tessera worker --coordinator URL`."));
  S.handlers.worker = put;
}

// ---- Start ----
async function main() {
  const app = document.getElementById("app");
  const path = location.pathname;
  try { S.me = await api("/api/v1/whoami"); }
  catch (e) { loginPage(app, e.status === 401 || path === "/login" ? "" : e.message); return; }
  if (path === "/login") { location.replace("/"); return; }
  if (S.me.role === "worker") { loginPage(app, "A worker token cannot use the dashboard; sign in with a user or admin token."); return; }
  document.getElementById("nav").hidden = false;
  document.getElementById("me").textContent = S.me.user + " (" + S.me.role + ")";
  document.getElementById("sign-out").onclick = async () => {
    try { await api("/api/v1/session/end", { method: "POST" }); } finally { location.href = "/login"; }
  };
  const m = /^\/jobs\/(\d+)$/.exec(path);
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", (a.dataset.nav === "workers") === (path === "/workers"));
  follow();
  if (m) await jobPage(app, +m[1]);
  else if (path === "/workers") await workersPage(app);
  else await jobsPage(app);
}

main();
