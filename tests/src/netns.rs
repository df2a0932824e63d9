//! Network partitions made with Linux network namespaces that the test
//! creates itself.
//!
//! A [`NetNs`] is a private namespace joined to the host by a veth pair on
//! a /30 of its own (`10.201.X.Y/30`: the host end `.1`, the namespace end
//! `.2`). A process started with [`NetNs::spawn`] runs inside it and reaches
//! a server on the host at [`NetNs::host_ip`]; a server on the host must
//! therefore listen on that address or on `0.0.0.0`.
//!
//! Faults are iptables rules inside the namespace, on its veth only:
//! * [`NetNs::cut`] drops every packet both ways, with no reset and no FIN,
//!   as a real partition does: TCP connections stay open and silent;
//! * [`NetNs::lose`] drops a random share of packets both ways
//!   (`-m statistic --mode random`).
//!
//! Every fault is bounded: a watchdog heals it after the bound it was given
//! even if the test forgets to, or panics first. Dropping the [`NetNs`]
//! kills every process left inside it and deletes the namespace and its
//! veth pair, on panic too.
//!
//! Latency is not made here: `tc qdisc … netem` needs the kernel's `sch_netem`,
//! which this kind of machine lacks ("Specified qdisc kind is unknown"). A
//! userspace delaying proxy gives it instead: [`crate::proxy::SilentProxy::with_delay`].
//!
//! Needs root (CAP_NET_ADMIN) and iptables, which [`NetNs::create_or_skip`]
//! installs with apt-get when it is missing; without them a test prints
//! why and skips, unless `TESSERA_REQUIRE_SERVERS=1` says it must run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::Proc;

/// The rules a fault adds, each applied with `-A` and removed with `-D`.
type Rules = Vec<Vec<String>>;

/// A network namespace with a veth pair to the host, removed on drop.
pub struct NetNs {
    name: String,
    host_if: String,
    ns_if: String,
    host_ip: String,
    ns_ip: String,
    /// The rules of the fault in force (empty: the link is whole), and a
    /// generation that tells a watchdog whether the fault it guards is
    /// still the one in force.
    fault: Arc<Mutex<(Rules, u64)>>,
}

/// Runs `cmd`; Err with its output when it fails.
fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    run(Command::new("ip").args(args))
}

/// Makes sure `iptables` and `ip` run, installing Debian's packages when
/// one is missing (as `scripts/lib.sh`'s `ensure_iptables` does). Checked once.
pub fn ensure_iptables() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let runs = |program: &str, arg: &str| {
            Command::new(program)
                .arg(arg)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let missing = || {
            [("iptables", "--version", "iptables"), ("ip", "-V", "iproute2")]
                .into_iter()
                .filter(|(p, a, _)| !runs(p, a))
                .map(|(_, _, package)| package)
                .collect::<Vec<_>>()
        };
        let packages = missing();
        if packages.is_empty() {
            return Ok(());
        }
        eprintln!(
            "installing {} for the partition tests...",
            packages.join(" ")
        );
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(&packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
        match missing().as_slice() {
            [] => Ok(()),
            still => Err(format!(
                "{} missing and apt-get could not install it; install it by hand (apt-get install {})",
                still.join(" and "),
                still.join(" ")
            )),
        }
    })
    .clone()
}

/// Picks a /30 in 10.201.0.0/16 no interface of the host uses: a block per
/// test process (by process id), a few namespaces per block.
fn free_subnet() -> (String, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let used = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let base = (std::process::id() % 2048) * 8;
    loop {
        let k = (base + NEXT.fetch_add(1, Ordering::Relaxed)) % 16384;
        let (c, d) = (k / 64, (k % 64) * 4);
        let host = format!("10.201.{c}.{}", d + 1);
        if !used.contains(&format!("inet {host}/")) {
            return (host, format!("10.201.{c}.{}", d + 2));
        }
    }
}

impl NetNs {
    /// Creates a namespace linked to the host, or says why it cannot.
    pub fn create() -> Result<NetNs, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        ensure_iptables()?;
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        if n == 0 {
            sweep_orphans();
        }
        // Interface names hold at most 15 bytes.
        let tag = format!("{}{n}", pid % 10_000_000);
        let (host_ip, ns_ip) = free_subnet();
        let ns = NetNs {
            name: format!("tessera-{pid}-{n}"),
            host_if: format!("tsh{tag}"),
            ns_if: format!("tsn{tag}"),
            host_ip,
            ns_ip,
            fault: Arc::new(Mutex::new((Vec::new(), 0))),
        };
        // From here on, a failure drops `ns`, which removes what was made.
        ip(&["netns", "add", &ns.name])?;
        ip(&[
            "link",
            "add",
            &ns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns.ns_if,
        ])?;
        ip(&["link", "set", &ns.ns_if, "netns", &ns.name])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/30", ns.host_ip),
            "dev",
            &ns.host_if,
        ])?;
        ip(&["link", "set", &ns.host_if, "up"])?;
        ns.exec_ok(&[
            "ip",
            "addr",
            "add",
            &format!("{}/30", ns.ns_ip),
            "dev",
            &ns.ns_if,
        ])?;
        ns.exec_ok(&["ip", "link", "set", &ns.ns_if, "up"])?;
        ns.exec_ok(&["ip", "link", "set", "lo", "up"])?;
        // iptables in a fresh namespace: fails here, not mid-test, when the
        // kernel or the binary cannot do it.
        ns.exec_ok(&["iptables", "-S"])?;
        Ok(ns)
    }

    /// [`NetNs::create`], or prints why not and returns None; with
    /// `TESSERA_REQUIRE_SERVERS=1` a namespace that cannot be made fails
    /// the test.
    pub fn create_or_skip(test: &str) -> Option<NetNs> {
        match Self::create() {
            Ok(ns) => Some(ns),
            Err(e) if std::env::var("TESSERA_REQUIRE_SERVERS").as_deref() == Ok("1") => {
                panic!("{test}: cannot make a network namespace: {e}")
            }
            Err(e) => {
                eprintln!("skipped {test}: cannot make a network namespace (needs root and iptables): {e}");
                None
            }
        }
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's address on the link: what a process inside dials to reach
    /// a server on the host.
    pub fn host_ip(&self) -> &str {
        &self.host_ip
    }

    /// The host end of the veth pair.
    pub fn host_if(&self) -> &str {
        &self.host_if
    }

    /// The namespace's own address on the link.
    pub fn ns_ip(&self) -> &str {
        &self.ns_ip
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        // `ip netns exec` execs the program: the child's id is the program's.
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    fn exec_ok(&self, args: &[&str]) -> Result<(), String> {
        run(self.command(args[0]).args(&args[1..]))
    }

    /// Starts `cmd` (made with [`NetNs::command`]) with its standard error in
    /// `log` and its standard output in `log` + `.out`.
    pub fn spawn(&self, mut cmd: Command, log: &Path) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log.with_extension("out")).unwrap())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?} in {}: {e}", self.name));
        Proc {
            child,
            log: log.to_path_buf(),
        }
    }

    /// A worker inside the namespace (one slot of one thread, CPU) that
    /// reaches the coordinator at `url` (on [`NetNs::host_ip`]) with `token`.
    pub fn worker(&self, url: &str, token: &str, dir: &Path, name: &str) -> Proc {
        let mut cmd = self.command(crate::tessera());
        crate::worker_args(&mut cmd, url, dir, name).env("TESSERA_TOKEN", token);
        self.spawn(cmd, &dir.join(format!("worker-{name}.log")))
    }

    /// Cuts the link silently, both ways, until [`NetNs::heal`] or for
    /// `bound` at most: every packet is dropped, nothing is refused.
    pub fn cut(&self, bound: Duration) {
        let rules = vec![
            vec!["INPUT", "-i", &self.ns_if, "-j", "DROP"],
            vec!["OUTPUT", "-o", &self.ns_if, "-j", "DROP"],
        ];
        self.apply(rules, bound);
    }

    /// Drops every packet between the namespace and `ip:port` (TCP), both
    /// ways, until [`NetNs::heal`] or for `bound` at most: one link of the
    /// namespace cut silently, every other one whole.
    pub fn cut_to(&self, ip: &str, port: u16, bound: Duration) {
        let port = port.to_string();
        let rules = vec![
            vec![
                "OUTPUT",
                "-o",
                &self.ns_if,
                "-p",
                "tcp",
                "-d",
                ip,
                "--dport",
                &port,
                "-j",
                "DROP",
            ],
            vec![
                "INPUT",
                "-i",
                &self.ns_if,
                "-p",
                "tcp",
                "-s",
                ip,
                "--sport",
                &port,
                "-j",
                "DROP",
            ],
        ];
        self.apply(rules, bound);
    }

    /// Drops each packet with probability `p` (0..1), both ways, until
    /// [`NetNs::heal`] or for `bound` at most.
    pub fn lose(&self, p: f64, bound: Duration) {
        let p = format!("{p:.4}");
        let random = [
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            &p,
            "-j",
            "DROP",
        ];
        let rules = [["INPUT", "-i"], ["OUTPUT", "-o"]]
            .map(|[chain, dir]| [&[chain, dir, &self.ns_if][..], &random[..]].concat())
            .to_vec();
        self.apply(rules, bound);
    }

    /// Replaces the fault in force with `rules` (iptables chain and match,
    /// inside the namespace: the host's own firewall is never touched), and
    /// starts its watchdog.
    fn apply(&self, rules: Vec<Vec<&str>>, bound: Duration) {
        let rules: Rules = rules
            .into_iter()
            .map(|r| r.into_iter().map(String::from).collect())
            .collect();
        self.heal();
        // The lock guards the rules themselves, so rule changes (here, in
        // heal and in the watchdog) run under it, one at a time.
        let generation = {
            let mut fault = self.fault.lock().unwrap_or_else(|e| e.into_inner());
            for r in &rules {
                let mut args = vec!["iptables", "-A"];
                args.extend(r.iter().map(String::as_str));
                self.exec_ok(&args)
                    .unwrap_or_else(|e| panic!("cannot add a fault in {}: {e}", self.name));
            }
            fault.0 = rules;
            fault.1 += 1;
            fault.1
        };
        let (fault, name) = (self.fault.clone(), self.name.clone());
        std::thread::spawn(move || {
            std::thread::sleep(bound);
            let mut f = fault.lock().unwrap_or_else(|e| e.into_inner());
            if f.1 == generation && !f.0.is_empty() {
                eprintln!("netns {name}: a fault outlived its bound of {bound:?}; healed");
                remove_rules(&name, &f.0);
                f.0.clear();
            }
        });
    }

    /// Removes the fault in force: the link is whole again.
    pub fn heal(&self) {
        let mut fault = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        remove_rules(&self.name, &fault.0);
        fault.0.clear();
    }

    /// Packets the fault in force has dropped so far (both ways), from the
    /// rules' counters.
    pub fn dropped(&self) -> u64 {
        let out = self
            .command("iptables")
            .args(["-L", "-v", "-n", "-x"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        out.lines()
            .filter(|l| l.contains("DROP"))
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Ids of the processes running inside the namespace.
    pub fn pids(&self) -> Vec<u32> {
        Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Removes the namespaces of test processes that died without dropping
/// theirs (SIGKILL, a crash): `tessera-PID-N` whose process is gone.
fn sweep_orphans() {
    let listed = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    for name in listed.split_whitespace() {
        let Some((pid, n)) = name
            .strip_prefix("tessera-")
            .and_then(|rest| rest.split_once('-'))
        else {
            continue;
        };
        let (Ok(pid), Ok(n)) = (pid.parse::<u32>(), n.parse::<u64>()) else {
            continue;
        };
        if crate::process_alive(pid) {
            continue;
        }
        eprintln!("netns: removing {name}, left behind by process {pid}");
        drop(NetNs {
            name: name.to_string(),
            host_if: format!("tsh{}{n}", pid % 10_000_000),
            ns_if: String::new(),
            host_ip: String::new(),
            ns_ip: String::new(),
            fault: Arc::new(Mutex::new((Vec::new(), 0))),
        });
    }
}

fn remove_rules(ns: &str, rules: &Rules) {
    for r in rules {
        let _ = Command::new("ip")
            .args(["netns", "exec", ns, "iptables", "-D"])
            .args(r)
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        self.heal();
        // Every process left inside (workers, their Blender sessions), by id.
        for _ in 0..50 {
            let pids = self.pids();
            if pids.is_empty() {
                break;
            }
            let _ = Command::new("kill")
                .arg("-9")
                .args(pids.iter().map(u32::to_string))
                .stderr(Stdio::null())
                .status();
            std::thread::sleep(Duration::from_millis(100));
        }
        // The host end goes with the namespace, but only once the kernel
        // gets to it; delete it now so that its address is free at once.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}
