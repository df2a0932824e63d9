//! A real TCP forwarding proxy for network-fault tests.
//!
//! [`SilentProxy`] listens on a loopback port and forwards every connection
//! to a target, byte for byte, both ways. [`SilentProxy::black_hole`] makes
//! it stop forwarding in both directions while keeping every connection
//! open on both sides: the peers see a silent network (their writes are
//! accepted by the proxy's kernel, nothing comes back, no reset, no FIN),
//! as with a partition that drops packets. [`SilentProxy::restore`]
//! forwards again; bytes held back meanwhile are then delivered, as TCP
//! would retransmit them after a partition heals.
//!
//! [`SilentProxy::with_delay`] also holds every chunk for a fixed time in
//! each direction before passing it on: network latency made in userspace,
//! because this kind of machine's kernel has no `netem` qdisc
//! (`tc qdisc … netem` answers "Specified qdisc kind is unknown"). Chunks
//! keep their order and the delay does not cap throughput: a chunk read
//! while earlier ones wait is timed from its own arrival.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// Whether bytes flow; pumps wait on the condvar while they do not.
struct Switch {
    silent: Mutex<bool>,
    changed: Condvar,
    /// The delay of each chunk, in microseconds (delaying pumps only).
    delay_us: AtomicU64,
}

impl Switch {
    /// Blocks while the proxy is a black hole.
    fn wait_open(&self) {
        let mut silent = self.silent.lock().unwrap_or_else(|e| e.into_inner());
        while *silent {
            silent = self.changed.wait(silent).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A TCP proxy to one target, with a switch that silences it.
pub struct SilentProxy {
    ip: std::net::IpAddr,
    port: u16,
    switch: Arc<Switch>,
    stop: Arc<AtomicBool>,
    /// Both ends of every connection, closed when the proxy is dropped.
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl SilentProxy {
    /// Forwards `127.0.0.1:<port>` to `target` (`HOST:PORT`).
    pub fn start(target: &str) -> std::io::Result<SilentProxy> {
        Self::with_delay("127.0.0.1", target, Duration::ZERO)
    }

    /// Forwards `<ip>:<port>` to `target`, each chunk `delay` late in each
    /// direction (a round trip gains twice `delay`).
    pub fn with_delay(ip: &str, target: &str, delay: Duration) -> std::io::Result<SilentProxy> {
        Self::open(ip, target, delay, !delay.is_zero())
    }

    /// Forwards `<ip>:<port>` to `target` with no delay until
    /// [`SilentProxy::set_delay`] adds one (to connections already open
    /// too): latency that comes and goes.
    pub fn adjustable(ip: &str, target: &str) -> std::io::Result<SilentProxy> {
        Self::open(ip, target, Duration::ZERO, true)
    }

    /// Holds each chunk `delay` in each direction from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.switch
            .delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }

    fn open(
        ip: &str,
        target: &str,
        delay: Duration,
        delaying: bool,
    ) -> std::io::Result<SilentProxy> {
        let listener = TcpListener::bind((ip, 0))?;
        let ip = listener.local_addr()?.ip();
        let port = listener.local_addr()?.port();
        let switch = Arc::new(Switch {
            silent: Mutex::new(false),
            changed: Condvar::new(),
            delay_us: AtomicU64::new(delay.as_micros() as u64),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let streams = Arc::new(Mutex::new(Vec::new()));
        let (sw, st, all, target) = (
            switch.clone(),
            stop.clone(),
            streams.clone(),
            target.to_string(),
        );
        thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                {
                    let mut all = all.lock().unwrap_or_else(|e| e.into_inner());
                    for s in [&client, &server] {
                        if let Ok(s) = s.try_clone() {
                            all.push(s);
                        }
                    }
                }
                for (from, to) in [(&client, &server), (&server, &client)] {
                    let (Ok(from), Ok(to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    let sw = sw.clone();
                    if delaying {
                        thread::spawn(move || pump_delayed(from, to, sw));
                    } else {
                        thread::spawn(move || pump(from, to, &sw));
                    }
                }
            }
        });
        Ok(SilentProxy {
            ip,
            port,
            switch,
            stop,
            streams,
        })
    }

    /// The port it listens on (loopback).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on, `IP:PORT`.
    pub fn addr(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }

    /// Stops forwarding in both directions; every connection stays open.
    pub fn black_hole(&self) {
        *self.switch.silent.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.switch.changed.notify_all();
    }

    /// Forwards again, delivering what was held back.
    pub fn restore(&self) {
        *self.switch.silent.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.switch.changed.notify_all();
    }
}

/// Copies `from` to `to` while the switch is open; a chunk read just as
/// the switch closes is held until it opens again. Ends when either side
/// closes, closing the other.
fn pump(mut from: TcpStream, mut to: TcpStream, switch: &Switch) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        switch.wait_open();
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        switch.wait_open();
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// [`pump`] with each chunk passed on the switch's delay after it was read:
/// a reader stamps chunks, a writer sends each at its time, in order.
fn pump_delayed(mut from: TcpStream, to: TcpStream, switch: Arc<Switch>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let (mut w_to, w_from) = (to.try_clone(), from.try_clone());
    let sw = switch.clone();
    let writer = thread::spawn(move || {
        let Ok(to) = w_to.as_mut() else { return };
        for (due, chunk) in rx {
            thread::sleep(due.saturating_duration_since(Instant::now()));
            sw.wait_open();
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        if let Ok(f) = w_from {
            let _ = f.shutdown(Shutdown::Both);
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        switch.wait_open();
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if tx
            .send((
                Instant::now() + Duration::from_micros(switch.delay_us.load(Ordering::SeqCst)),
                buf[..n].to_vec(),
            ))
            .is_err()
        {
            break;
        }
    }
    // What was read goes out before the close does.
    drop(tx);
    let _ = writer.join();
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for SilentProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the stop.
        let _ = TcpStream::connect((self.ip, self.port));
        for s in self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn forwards_goes_silent_and_forwards_again() {
        // An echo server.
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let target = echo.local_addr().unwrap().to_string();
        thread::spawn(move || {
            for s in echo.incoming().flatten() {
                thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let mut w = s;
                    let _ = std::io::copy(&mut r, &mut w);
                });
            }
        });
        let proxy = SilentProxy::start(&target).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 5];
        c.write_all(b"hello").unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");

        proxy.black_hole();
        c.write_all(b"quiet").unwrap();
        let err = c.read(&mut buf).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "silence, not a close: {err}"
        );

        proxy.restore();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"quiet", "held bytes arrive once restored");
    }
}
