//! The watchers of a run: a client that polls `ListJobs` and `GetJob` (what
//! `tessera jobs` and `tessera status` ask) and a Prometheus-style scraper
//! of `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_proto as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::stats::Timings;
use super::{connect, farm, LoadError, Target};

/// Tasks in the page `tessera status` asks for.
pub const STATUS_TASKS: u32 = 1000;

/// What the watchers saw.
#[derive(Debug, Default)]
pub struct Observed {
    /// `GetJob` with the first page of tasks (`tessera status`).
    pub status: Timings,
    /// `ListJobs` (`tessera jobs`).
    pub jobs: Timings,
    /// `/metrics` scrapes.
    pub metrics: Timings,
    /// Polls and scrapes that failed.
    pub errors: AtomicU64,
    last_metrics: Mutex<Option<String>>,
}

impl Observed {
    /// The last `/metrics` text scraped.
    pub fn last_metrics(&self) -> Option<String> {
        self.last_metrics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The watchers on a thread and runtime of their own, as an operator's
/// `tessera status` and a Prometheus server are processes of their own: on
/// the fleet's runtime their calls would wait behind thousands of fake
/// slots' tasks in this process, and the figures would say more of the load
/// generator than of the coordinator.
pub struct Watchers {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchers {
    /// Starts polling `job`'s status and scraping `/metrics`.
    pub fn start(
        target: Target,
        job: u64,
        pause: Duration,
        every: Duration,
        limit: Duration,
        seen: std::sync::Arc<Observed>,
    ) -> Result<Self, LoadError> {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| LoadError::io("starting the watchers' runtime", e))?;
        let thread = std::thread::Builder::new()
            .name("load-watchers".into())
            .spawn(move || {
                rt.block_on(async move {
                    let both = async {
                        tokio::join!(
                            poll_status(target.clone(), job, pause, limit, seen.clone()),
                            scrape_every(target, every, limit, seen),
                        )
                    };
                    tokio::select! {
                        _ = both => {}
                        _ = stopped => {}
                    }
                });
            })
            .map_err(|e| LoadError::io("starting the watchers' thread", e))?;
        Ok(Self {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops both watchers and waits for their thread (as dropping does).
    pub fn stop(self) {}
}

impl Drop for Watchers {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Polls `ListJobs` then `GetJob(job)` over and over, `pause` apart, each
/// call allowed `limit`; runs until aborted.
async fn poll_status(
    target: Target,
    job: u64,
    pause: Duration,
    limit: Duration,
    seen: std::sync::Arc<Observed>,
) {
    let Ok(conn) = connect(&target.url, &target.admin_token) else {
        seen.errors.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut client = farm(conn);
    loop {
        let start = Instant::now();
        let req = pb::ListJobsRequest {
            limit: 100,
            ..Default::default()
        };
        match tokio::time::timeout(limit, client.list_jobs(req)).await {
            Ok(Ok(_)) => seen.jobs.record(start),
            _ => {
                seen.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        let start = Instant::now();
        let req = pb::JobRef {
            job_id: job,
            task_limit: STATUS_TASKS,
            ..Default::default()
        };
        match tokio::time::timeout(limit, client.get_job(req)).await {
            Ok(Ok(_)) => seen.status.record(start),
            _ => {
                seen.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(pause).await;
    }
}

/// Scrapes `/metrics` every `every` (the first at once); runs until aborted.
async fn scrape_every(
    target: Target,
    every: Duration,
    limit: Duration,
    seen: std::sync::Arc<Observed>,
) {
    let Some(url) = target.metrics.clone() else {
        return;
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        scrape_into(&url, &target.admin_token, limit, &seen).await;
    }
}

/// One timed scrape, kept as the latest when it worked.
pub async fn scrape_into(url: &str, token: &str, limit: Duration, seen: &Observed) -> bool {
    let start = Instant::now();
    match tokio::time::timeout(limit, scrape(url, token)).await {
        Ok(Ok(text)) => {
            seen.metrics.record(start);
            *seen.last_metrics.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
            true
        }
        _ => {
            seen.errors.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// `GET url` over plain HTTP/1.1 with a bearer token; the body when the
/// answer is 200.
pub async fn scrape(url: &str, token: &str) -> Result<String, LoadError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| LoadError::Coordinator(format!("{url} is not an http:// URL")))?;
    let (host, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(h, p)| (h, format!("/{p}")));
    let io = |e| LoadError::io(format!("GET {url}"), e);
    let mut s = tokio::net::TcpStream::connect(host).await.map_err(io)?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\nConnection: close\r\n\r\n",
        token.trim()
    );
    s.write_all(req.as_bytes()).await.map_err(io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.lines().next().unwrap_or("");
    if !status.contains(" 200") {
        return Err(LoadError::Coordinator(format!("GET {url}: {status}")));
    }
    // axum answers with a length, or chunked when it streams.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Ok(dechunk(body));
    }
    Ok(body.to_string())
}

/// The body of a chunked HTTP/1.1 answer.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The sum of every sample of metric `name` (whatever its labels) in a
/// Prometheus text exposition; None when there is no such sample.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_over_labels_and_names_must_match_whole() {
        let text = "# HELP tessera_tasks Tasks.\n# TYPE tessera_tasks gauge\n\
            tessera_tasks{state=\"queued\"} 5\ntessera_tasks{state=\"done\"} 7\n\
            tessera_leases_expired_total 0\ntessera_leases_expired_total_x 9\n";
        assert_eq!(metric(text, "tessera_tasks"), Some(12.0));
        assert_eq!(metric(text, "tessera_leases_expired_total"), Some(0.0));
        assert_eq!(metric(text, "tessera_nothing"), None);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
