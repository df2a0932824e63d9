//! `tessera doctor`: checks a worker machine (or, with `doctor coordinator`,
//! a coordinator's) and prints one line per check, each problem with its fix.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use tessera_proto as pb;
use tessera_worker::connect::Access;
use tonic::Code;

/// Below this many open files a busy worker or coordinator runs out.
const FEW_FILES: u64 = 8192;
/// A clock further off than this confuses lease expiry and logs.
const CLOCK_WARN: Duration = Duration::from_secs(3);
/// Free space under which the cache cannot hold a typical job's files.
const DISK_WARN: u64 = 10 << 30;
/// Free space under which a render cannot even write its frames.
const DISK_FAIL: u64 = 1 << 30;
/// A TLS certificate that ends sooner than this needs renewing now.
const CERT_WARN: Duration = Duration::from_secs(14 * 86_400);

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

/// Prints check lines and remembers whether any failed.
#[derive(Default)]
struct Report {
    failed: bool,
}

impl Report {
    fn line(&mut self, level: Level, what: &str, text: impl std::fmt::Display) {
        let tag = match level {
            Level::Ok => "OK  ",
            Level::Warn => "WARN",
            Level::Fail => {
                self.failed = true;
                "FAIL"
            }
        };
        println!("{tag} {what:<12} {text}");
    }

    fn finish(self) -> Result<()> {
        if self.failed {
            bail!("some checks failed; see the FAIL lines above for their fixes");
        }
        Ok(())
    }
}

/// What `tessera doctor` checks on a worker machine.
pub struct WorkerChecks<'a> {
    /// The coordinator and the token.
    pub access: &'a Access,
    /// The worker's --cache.
    pub cache: &'a Path,
    /// The worker's --blender values.
    pub blender: &'a [String],
    /// Where `bpy` runtimes are installed (the worker's --runtimes).
    pub runtimes: Option<PathBuf>,
}

/// `tessera doctor`: the checks of a worker machine.
pub async fn worker(c: WorkerChecks<'_>) -> Result<()> {
    let mut r = Report::default();
    coordinator_reachable(&mut r, c.access).await;
    let cache = std::path::absolute(c.cache).unwrap_or_else(|_| c.cache.to_path_buf());
    let dir = c
        .runtimes
        .clone()
        .or_else(|| std::env::var_os("TESSERA_RUNTIMES").map(Into::into))
        .unwrap_or_else(|| cache.join("runtimes"));
    for spec in c.blender {
        // One at a time, so that each runtime gets its own line.
        match crate::runtimes::offer(std::slice::from_ref(spec), &dir).await {
            Ok(offered) => {
                for o in offered {
                    let mut what = o.caps.features.clone();
                    what.extend(o.caps.devices.iter().cloned());
                    r.line(
                        Level::Ok,
                        "blender",
                        format!(
                            "Blender {} ({}) {} [{}]",
                            o.caps.version,
                            o.runtime.kind.name(),
                            o.runtime.exe.display(),
                            what.join(", ")
                        ),
                    );
                }
            }
            Err(e) => r.line(Level::Fail, "blender", format!("{e:#}")),
        }
    }
    gpus(&mut r).await;
    disk(&mut r, &cache);
    files(&mut r);
    r.finish()
}

/// The coordinator answers, over valid TLS, and accepts the token; the
/// clock offset from its `Date` header.
async fn coordinator_reachable(r: &mut Report, access: &Access) {
    let url = &access.url;
    if access.token.is_none() {
        r.line(
            Level::Fail,
            "token",
            "no token; set $TESSERA_TOKEN, pass --token-file FILE, or put it in ~/.config/tessera/token",
        );
    }
    let channel = match tessera_worker::connect::channel(access) {
        Ok(c) => c,
        Err(e) => {
            r.line(Level::Fail, "coordinator", format!("{e:#}"));
            return;
        }
    };
    let mut farm = pb::farm_client::FarmClient::new(channel);
    let asked = SystemTime::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        farm.list_workers(pb::ListWorkersRequest {}),
    )
    .await;
    let answered = SystemTime::now();
    let tls = url.starts_with("https://");
    let (meta, token_ok) = match answer {
        Err(_) => {
            r.line(Level::Fail, "coordinator", format!("{url} did not answer within 10 s; check that the coordinator runs and that no firewall drops its port"));
            return;
        }
        Ok(Ok(resp)) => (resp.metadata().clone(), true),
        // A worker token may not list workers, but it was accepted.
        Ok(Err(s)) if s.code() == Code::PermissionDenied => (s.metadata().clone(), true),
        Ok(Err(s)) if s.code() == Code::Unauthenticated => (s.metadata().clone(), false),
        Ok(Err(s)) => {
            let text = format!("{s}");
            let fix = if tls && text.to_lowercase().contains("certificate") {
                "the TLS certificate is not trusted; pass --ca (or $TESSERA_CA) with the CA that signed it, and use the host name it was made for"
            } else {
                "start the coordinator, or point --coordinator (or $TESSERA_COORDINATOR) at it"
            };
            r.line(
                Level::Fail,
                "coordinator",
                format!("cannot reach {url}: {}; {fix}", s.message()),
            );
            return;
        }
    };
    r.line(Level::Ok, "coordinator", format!("{url} answers"));
    if tls {
        r.line(
            Level::Ok,
            "tls",
            "the coordinator's certificate is valid and trusted",
        );
    }
    if token_ok {
        if access.token.is_some() {
            r.line(Level::Ok, "token", "accepted by the coordinator");
        }
    } else if access.token.is_some() {
        r.line(Level::Fail, "token", "the coordinator rejected the token; make a worker token with `tessera users add NAME --role worker` on the farm and give it by --token-file or $TESSERA_TOKEN");
    }
    // The HTTP/2 `Date` header has one-second resolution; the round trip
    // bounds what else the offset may be.
    let date = meta
        .get("date")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| httpdate::parse_http_date(v).ok());
    match date {
        None => r.line(
            Level::Warn,
            "clock",
            "the coordinator sent no Date header; cannot measure the clock offset (run chrony or systemd-timesyncd on both)",
        ),
        Some(theirs) => {
            let mid = asked + answered.duration_since(asked).unwrap_or_default() / 2;
            let (offset, sign) = match theirs.duration_since(mid) {
                Ok(d) => (d, "ahead of"),
                Err(e) => (e.duration(), "behind"),
            };
            // Whole seconds on the wire: under 1.5 s is noise.
            let secs = offset.as_secs_f64();
            if offset > CLOCK_WARN {
                r.line(
                    Level::Warn,
                    "clock",
                    format!("the coordinator's clock is {secs:.0} s {sign} this machine's; sync both with NTP (chrony or systemd-timesyncd)"),
                );
            } else {
                r.line(
                    Level::Ok,
                    "clock",
                    format!("within {:.0} s of the coordinator's", secs.max(1.0)),
                );
            }
        }
    }
}

/// The GPUs that Vulkan and NVML see, and what they say is missing.
async fn gpus(r: &mut Report) {
    let probe = tokio::task::spawn_blocking(tessera_worker::gpu::Hardware::probe).await;
    let Ok(probe) = probe else {
        r.line(
            Level::Warn,
            "gpu",
            "the GPU probe crashed; check the GPU driver (nvidia-smi)",
        );
        return;
    };
    for g in probe.gpus() {
        r.line(
            Level::Ok,
            "gpu",
            format!(
                "{} ({}, {} MiB, {})",
                g.name,
                g.vendor,
                g.memory_bytes >> 20,
                g.device_type
            ),
        );
    }
    if probe.gpus().is_empty() {
        r.line(
            Level::Warn,
            "gpu",
            "no GPU found; this worker renders on the CPU",
        );
    }
    // The probe's notes already say what to install. Beside a GPU they are
    // context (no NVML on a machine without NVIDIA cards is fine), except
    // a missing NVML beside an NVIDIA card: no telemetry, no OptiX check.
    for note in probe.notes() {
        let matters = probe.gpus().is_empty()
            || (probe.gpus().iter().any(|g| g.is_nvidia()) && note.contains("NVML"));
        r.line(if matters { Level::Warn } else { Level::Ok }, "gpu", note);
    }
}

/// Free space in the cache folder (or its nearest existing parent).
fn disk(r: &mut Report, cache: &Path) {
    let mut at = cache;
    while !at.exists() {
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    match tessera_worker::disk::free_bytes(at) {
        Err(e) => r.line(
            Level::Fail,
            "disk",
            format!(
                "cannot read the free space of {}: {e}; check that --cache is on a mounted disk",
                at.display()
            ),
        ),
        Ok(free) => {
            let gib = free as f64 / (1u64 << 30) as f64;
            let text = format!("{gib:.1} GiB free in {}", at.display());
            if free < DISK_FAIL {
                r.line(
                    Level::Fail,
                    "disk",
                    format!("{text}; free space there or point --cache at a larger disk"),
                );
            } else if free < DISK_WARN {
                r.line(Level::Warn, "disk", format!("{text}; a job's files may not fit: free space or point --cache at a larger disk"));
            } else {
                r.line(Level::Ok, "disk", text);
            }
        }
    }
}

/// The open-file limit this process (and so a worker started the same way) has.
#[allow(unsafe_code)] // getrlimit(2); std has no safe form.
fn files(r: &mut Report) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        r.line(
            Level::Warn,
            "files",
            format!(
                "cannot read the open-file limit: {}",
                std::io::Error::last_os_error()
            ),
        );
        return;
    }
    let soft: u64 = lim.rlim_cur;
    if soft < FEW_FILES {
        r.line(Level::Warn, "files", format!("only {soft} open files allowed (ulimit -n); raise it to at least {FEW_FILES}: LimitNOFILE=65536 in the systemd unit, or `ulimit -n 65536`"));
    } else {
        r.line(Level::Ok, "files", format!("{soft} open files allowed"));
    }
}

/// What `tessera doctor coordinator` checks.
pub struct CoordinatorChecks<'a> {
    /// The coordinator's --data.
    pub data: &'a Path,
    /// Its --store (sled or postgres://).
    pub store: Option<&'a str>,
    /// Its --blobs.
    pub blobs: Option<&'a str>,
    /// Its --ffmpeg.
    pub ffmpeg: &'a Path,
    /// Its --tls-cert.
    pub tls_cert: Option<&'a Path>,
}

/// `tessera doctor coordinator`: the checks of a coordinator machine.
pub async fn coordinator(c: CoordinatorChecks<'_>) -> Result<()> {
    let mut r = Report::default();
    let probe = c
        .data
        .join(format!(".tessera-doctor-{}", std::process::id()));
    match std::fs::create_dir_all(c.data).and_then(|_| std::fs::write(&probe, b"ok")) {
        Ok(()) => {
            let _ = std::fs::remove_file(&probe);
            r.line(
                Level::Ok,
                "data",
                format!("{} is writable", c.data.display()),
            );
        }
        Err(e) => r.line(
            Level::Fail,
            "data",
            format!(
                "cannot write in {}: {e}; create it and give it to the coordinator's user (chown)",
                c.data.display()
            ),
        ),
    }
    match c.store.map(str::trim) {
        Some(url) if crate::setup::is_postgres(url) => postgres(&mut r, url).await,
        None | Some("") | Some("sled") => sled(&mut r, &c.data.join("db")),
        Some(other) => r.line(
            Level::Fail,
            "store",
            format!("--store {other}: not a store; use sled or postgres://USER@HOST:PORT/DATABASE"),
        ),
    }
    let spec = c.blobs.unwrap_or("");
    let place = tessera_coordinator::blobs::location::describe(spec, c.data);
    let opened = tessera_coordinator::blobs::location::open(spec, c.data, 1 << 20);
    match opened {
        Ok(store) => {
            // A lookup makes an S3 bucket answer; a folder just opened.
            let digest = tessera_coordinator::digest::Digest::of(b"tessera doctor");
            match tokio::task::spawn_blocking(move || store.contains(&digest)).await {
                Ok(_) => r.line(Level::Ok, "blobs", format!("{place} opens")),
                Err(e) => r.line(Level::Fail, "blobs", format!("{place}: {e}")),
            }
        }
        Err(e) => r.line(
            Level::Fail,
            "blobs",
            format!("cannot open {place}: {e}; check --blobs (and the AWS variables for s3://)"),
        ),
    }
    match tokio::process::Command::new(c.ffmpeg)
        .arg("-version")
        .output()
        .await
    {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            r.line(Level::Ok, "ffmpeg", text.lines().next().unwrap_or("ffmpeg"));
        }
        _ => r.line(
            Level::Warn,
            "ffmpeg",
            format!(
                "cannot run {}; preview videos will fail: apt-get install ffmpeg, or pass --ffmpeg PATH",
                c.ffmpeg.display()
            ),
        ),
    }
    if let Some(cert) = c.tls_cert {
        tls_expiry(&mut r, cert);
    }
    files(&mut r);
    r.finish()
}

/// The sled store opens, unless a running coordinator holds it (then it is
/// in use, which is fine).
fn sled(r: &mut Report, db: &Path) {
    if !db.exists() {
        r.line(
            Level::Ok,
            "store",
            format!(
                "{} does not exist yet; the coordinator makes it on first start",
                db.display()
            ),
        );
        return;
    }
    match tessera_coordinator::store::SledStore::open(db) {
        Ok(_) => r.line(Level::Ok, "store", format!("{} opens", db.display())),
        Err(_) if locked(&db.join("db")) => r.line(
            Level::Ok,
            "store",
            format!("{} is in use by a running coordinator", db.display()),
        ),
        Err(e) => r.line(Level::Fail, "store", format!("{e}")),
    }
}

/// Whether another process holds sled's lock on `file` (its `db`, locked
/// with flock(2) while a coordinator has it open).
#[allow(unsafe_code)] // flock(2); std's File::try_lock is newer than our MSRV.
fn locked(file: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(file) else {
        return false;
    };
    // SAFETY: a valid descriptor; the lock, if taken, goes with `f`.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    r != 0
}

/// PostgreSQL answers, and an active coordinator holds an unexpired lease.
async fn postgres(r: &mut Report, url: &str) {
    let election = tessera_coordinator::ha::Election::connect(
        url,
        "tessera doctor",
        "",
        Duration::from_secs(10),
        tessera_coordinator::store::StoreHealth::new("PostgreSQL"),
    )
    .await;
    let election = match election {
        Ok(e) => e,
        Err(e) => {
            r.line(Level::Fail, "store", format!("{e}"));
            return;
        }
    };
    r.line(Level::Ok, "store", "PostgreSQL answers");
    match election.leader().await {
        Ok(l) if l.epoch == 0 || l.expired => r.line(
            Level::Fail,
            "standby",
            "no coordinator is active on this database; start one (`tessera coordinator --store ...`), or check why the active one died",
        ),
        Ok(l) => r.line(
            Level::Ok,
            "standby",
            format!("an active coordinator ({}) at {} since {}", l.holder, l.url, l.since),
        ),
        Err(e) => r.line(Level::Fail, "standby", format!("{e}")),
    }
}

/// When the first certificate of a PEM file ends, and whether that is soon.
fn tls_expiry(r: &mut Report, cert: &Path) {
    let ends = std::fs::read_to_string(cert)
        .with_context(|| format!("cannot read {}", cert.display()))
        .and_then(|pem| not_after(&pem));
    match ends {
        Err(e) => r.line(
            Level::Fail,
            "tls",
            format!("{e:#}; pass --tls-cert with a PEM certificate"),
        ),
        Ok(ends) => {
            let when = httpdate::fmt_http_date(ends);
            match ends.duration_since(SystemTime::now()) {
                Err(_) => r.line(
                    Level::Fail,
                    "tls",
                    format!("{} expired on {when}; renew it", cert.display()),
                ),
                Ok(left) if left < CERT_WARN => r.line(
                    Level::Warn,
                    "tls",
                    format!(
                        "{} expires in {} days ({when}); renew it",
                        cert.display(),
                        left.as_secs() / 86_400
                    ),
                ),
                Ok(left) => r.line(
                    Level::Ok,
                    "tls",
                    format!(
                        "{} valid for {} more days",
                        cert.display(),
                        left.as_secs() / 86_400
                    ),
                ),
            }
        }
    }
}

/// The `notAfter` of the first certificate in `pem`.
fn not_after(pem: &str) -> Result<SystemTime> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    if body.is_empty() {
        bail!("no CERTIFICATE block");
    }
    let der = base64_decode(&body).context("the certificate is not valid base64")?;
    // Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version?,
    // serial, signature, issuer, validity SEQUENCE { notBefore, notAfter } ...
    let (_, cert, _) = der_item(&der).context("not a DER certificate")?;
    let (_, tbs, _) = der_item(cert).context("no tbsCertificate")?;
    let mut rest = tbs;
    let (tag, _, after) = der_item(rest).context("empty tbsCertificate")?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..3 {
        rest = der_item(rest).context("short tbsCertificate")?.2;
    }
    let (_, validity, _) = der_item(rest).context("no validity")?;
    let after_before = der_item(validity).context("no notBefore")?.2;
    let (tag, time, _) = der_item(after_before).context("no notAfter")?;
    let text = std::str::from_utf8(time).context("notAfter is not text")?;
    let full = match tag {
        // UTCTime: YYMMDDHHMMSSZ, years 1950-2049.
        0x17 if text.len() >= 12 => {
            let yy: u32 = text[..2].parse()?;
            format!("{}{}", if yy < 50 { "20" } else { "19" }, text)
        }
        0x18 => text.to_string(),
        _ => bail!("notAfter has an unknown form"),
    };
    let n =
        |a: usize, b: usize| -> Result<u64> { Ok(full.get(a..b).context("short time")?.parse()?) };
    let (y, mo, d, h, mi, s) = (
        n(0, 4)?,
        n(4, 6)?,
        n(6, 8)?,
        n(8, 10)?,
        n(10, 12)?,
        n(12, 14)?,
    );
    let days = days_from_civil(y as i64, mo as i64, d as i64);
    let secs = days * 86_400 + (h * 3600 + mi * 60 + s) as i64;
    let secs = u64::try_from(secs).context("notAfter before 1970")?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

/// One DER item at the start of `b`: (tag, contents, what follows).
fn der_item(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let tag = *b.first()?;
    let first = *b.get(1)? as usize;
    let (len, head) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let len = b
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |a, x| a << 8 | *x as usize);
        (len, 2 + n)
    };
    let body = b.get(head..head + len)?;
    Some((tag, body, &b[head + len..]))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Standard base64 without line breaks or with `=` padding.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32;
        acc = acc << 6 | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2026, 12, 3), 20_790);
    }

    #[test]
    fn base64_decodes_padded_text() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert!(base64_decode("a*b").is_none());
    }

    #[test]
    fn a_short_der_item_is_refused() {
        assert!(der_item(&[0x30, 0x05, 1, 2]).is_none());
        assert_eq!(
            der_item(&[0x02, 0x01, 7, 9]).unwrap(),
            (0x02, &[7u8][..], &[9u8][..])
        );
    }
}
