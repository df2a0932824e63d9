//! A `tessera coordinator` process the generator starts itself (loopback,
//! port 0, its own data directory), kills with SIGKILL, and restarts; and
//! what `/proc` says about any process: resident memory and CPU time.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use super::{LoadError, Target};

/// A running coordinator, killed when dropped.
pub struct CoordinatorProcess {
    child: Child,
    // Held open: the coordinator may still print.
    _stdout: BufReader<ChildStdout>,
    /// Where to reach it, as its admin.
    pub target: Target,
    /// From spawning the process to its "listening" line (which it prints
    /// once its data directory is open).
    pub listening_after: Duration,
    /// When the process was spawned.
    pub spawned: Instant,
    /// Its log (stderr).
    pub log: PathBuf,
}

/// Every fake worker connects from loopback, so one address stands for a
/// whole farm's: lift the connection caps, on a coordinator that has them
/// (a baseline build from before them would refuse the flags).
fn uncapped(bin: &Path) -> Vec<&'static str> {
    let help = Command::new(bin)
        .args(["coordinator", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if help.contains("--max-connections-per-address") {
        vec![
            "--max-connections-per-address",
            "1000000",
            "--max-connections",
            "1000000",
        ]
    } else {
        Vec::new()
    }
}

impl CoordinatorProcess {
    /// Starts `bin coordinator` over `data` on loopback with `/metrics`,
    /// passing `extra` arguments on, and waits up to `limit` for it to listen.
    /// `listen` is `127.0.0.1:0` for a fresh port.
    pub fn start(
        bin: &Path,
        data: &Path,
        listen: &str,
        extra: &[String],
        limit: Duration,
    ) -> Result<Self, LoadError> {
        std::fs::create_dir_all(data)
            .map_err(|e| LoadError::io(format!("cannot create {}", data.display()), e))?;
        let log = data.with_extension("coordinator.log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| LoadError::io(format!("cannot write {}", log.display()), e))?;
        let spawned = Instant::now();
        let mut child = Command::new(bin)
            .args([
                "coordinator",
                "--listen",
                listen,
                "--http",
                "127.0.0.1:0",
                "--data",
            ])
            .arg(data)
            .args(uncapped(bin))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| LoadError::io(format!("cannot start {}", bin.display()), e))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        // Read the two address lines on a thread, so a coordinator that never
        // gets there is given up on after `limit`.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut lines = [String::new(), String::new()];
            for l in &mut lines {
                if reader.read_line(l).unwrap_or(0) == 0 {
                    break;
                }
            }
            let _ = tx.send((lines, reader));
        });
        let tail = |log: &Path| {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(10)..].join("\n")
        };
        let Ok(([grpc, http], reader)) = rx.recv_timeout(limit) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LoadError::Timeout {
                what: format!("the coordinator over {} starting", data.display()),
                after: limit,
            });
        };
        let listening_after = spawned.elapsed();
        let addr = grpc
            .trim()
            .strip_prefix("tessera coordinator listening on ");
        let metrics = http.trim().strip_prefix("tessera coordinator metrics on ");
        let (Some(addr), Some(metrics)) = (addr, metrics) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LoadError::Coordinator(format!(
                "the coordinator did not start ({:?}); its log ends:\n{}",
                grpc.trim(),
                tail(&log)
            )));
        };
        let token_file = data.join("admin.token");
        let admin_token = std::fs::read_to_string(&token_file)
            .map_err(|e| {
                LoadError::io(
                    format!(
                        "cannot read {} (the coordinator writes it on its first start)",
                        token_file.display()
                    ),
                    e,
                )
            })?
            .trim()
            .to_string();
        Ok(Self {
            child,
            _stdout: reader,
            target: Target {
                url: format!("http://{addr}"),
                admin_token,
                metrics: Some(metrics.to_string()),
            },
            listening_after,
            spawned,
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `127.0.0.1:PORT` of its gRPC side, to restart it on the same port.
    pub fn addr(&self) -> &str {
        self.target
            .url
            .strip_prefix("http://")
            .unwrap_or(&self.target.url)
    }

    /// Kills it with SIGKILL and reaps it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Memory and CPU time of a process, from `/proc/PID/status` and `/proc/PID/stat`.
#[derive(Debug, Clone, Copy)]
pub struct ProcStat {
    /// Resident set size now (`VmRSS`), in bytes.
    pub rss: u64,
    /// Peak resident set size (`VmHWM`), in bytes.
    pub rss_peak: u64,
    /// User plus system CPU time so far.
    pub cpu: Duration,
}

/// Clock ticks per second of `/proc/PID/stat`'s times.
fn ticks_per_second() -> f64 {
    static HZ: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Reads `pid`'s memory and CPU time.
pub fn proc_stat(pid: u32) -> Result<ProcStat, LoadError> {
    let read = |f: &str| {
        let path = format!("/proc/{pid}/{f}");
        std::fs::read_to_string(&path).map_err(|e| {
            LoadError::io(format!("cannot read {path} (is process {pid} running?)"), e)
        })
    };
    let status = read("status")?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |k| k * 1024)
    };
    let stat = read("stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of stat: 11 and 12 counted from
    // the state (field 3), the first after the name.
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let cpu = Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / ticks_per_second());
    Ok(ProcStat {
        rss: kib("VmRSS:"),
        rss_peak: kib("VmHWM:"),
        cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        // Spin until the kernel has charged at least one tick.
        let start = Instant::now();
        let mut s = proc_stat(std::process::id()).unwrap();
        while s.cpu == Duration::ZERO && start.elapsed() < Duration::from_secs(5) {
            s = proc_stat(std::process::id()).unwrap();
        }
        assert!(s.rss > 1 << 20, "{s:?}");
        assert!(s.rss_peak >= s.rss, "{s:?}");
        assert!(s.cpu > Duration::ZERO, "{s:?}");
    }
}
