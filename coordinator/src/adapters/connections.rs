//! Connections end: every connection to the gRPC and HTTP ports is counted
//! against a per-address and a total cap, and closed when it stalls.
//!
//! Each connection holds a file descriptor; a client that opens many and
//! sends nothing (or trickles its headers or body) would otherwise use up
//! the coordinator's file limit and stop the farm for everyone. The rules:
//! - a connection beyond `--max-connections-per-address` or
//!   `--max-connections` is closed at once (the HTTP port first answers 503);
//! - no byte moved either way for `--idle-timeout`: closed (on gRPC, HTTP/2
//!   keep-alive pings keep a live peer's connection moving);
//! - a gRPC connection must send the HTTP/2 preface, and an HTTP request its
//!   whole head, within `--header-timeout`;
//! - each `--body-timeout` a request body spends waiting must bring at least
//!   [`MIN_BODY_PROGRESS`] bytes, or its end.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// Bytes a request body must bring in each `body_timeout` it waits: a
/// client that trickles slower is holding the connection, not uploading.
pub const MIN_BODY_PROGRESS: u64 = 1024;

/// The HTTP/2 connection preface a gRPC client sends first.
pub(crate) const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long connections may stall and how many there may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// An HTTP request's head (or a gRPC connection's preface) must arrive within this.
    pub header_timeout: Duration,
    /// A connection on which nothing moved for this long is closed.
    pub idle_timeout: Duration,
    /// Each wait of this long in a request body must bring [`MIN_BODY_PROGRESS`] bytes.
    pub body_timeout: Duration,
    /// Most connections from one IP address, both ports together.
    pub per_address: usize,
    /// Most connections in all, both ports together.
    pub total: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            body_timeout: Duration::from_secs(30),
            per_address: 256,
            total: 4096,
        }
    }
}

impl ConnectionLimits {
    /// How often the gRPC port pings an HTTP/2 peer: often enough that a
    /// live client's connection never reaches the idle timeout.
    pub(crate) fn keepalive(&self) -> Duration {
        (self.idle_timeout / 3).max(Duration::from_millis(500))
    }
}

/// Counts open connections by address; shared by the gRPC and HTTP ports,
/// because both draw on one file limit.
#[derive(Debug)]
pub(crate) struct Gate {
    limits: ConnectionLimits,
    open: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Its address holds `per_address` connections already.
    Address,
    /// The coordinator holds `total` connections already.
    Total,
}

impl Refusal {
    /// What the client is told (on the HTTP port) and the log says.
    pub(crate) fn message(self, limits: &ConnectionLimits) -> String {
        match self {
            Refusal::Address => format!(
                "too many connections from your address (at most {}); close idle ones and retry, or ask the farm's admin to raise --max-connections-per-address",
                limits.per_address
            ),
            Refusal::Total => format!(
                "the coordinator holds its most connections ({}); retry shortly, or ask the farm's admin to raise --max-connections",
                limits.total
            ),
        }
    }
}

/// One admitted connection's place in the count, given back on drop.
#[derive(Debug)]
pub(crate) struct Permit {
    gate: Arc<Gate>,
    address: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.gate.counts();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                open.by_address.remove(&self.address);
            }
        }
    }
}

impl Gate {
    /// A gate enforcing `limits`.
    pub(crate) fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: Mutex::new(Counts::default()),
        })
    }

    /// The limits this gate enforces.
    pub(crate) fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // A counter only: a panic elsewhere cannot leave it half-updated.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a connection from `address`, or says why it is refused.
    pub(crate) fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Permit, Refusal> {
        let mut open = self.counts();
        let from_address = open.by_address.get(&address).copied().unwrap_or(0);
        if from_address >= self.limits.per_address {
            return Err(Refusal::Address);
        }
        if open.total >= self.limits.total {
            return Err(Refusal::Total);
        }
        open.total += 1;
        *open.by_address.entry(address).or_insert(0) += 1;
        Ok(Permit {
            gate: self.clone(),
            address,
        })
    }

    /// Admits a gRPC connection, or logs why not, with Nagle's algorithm
    /// off: small replies (a lease, an ack) must not wait for it and the
    /// peer's delayed ACK (about 40 ms).
    pub(crate) fn admit_grpc(self: &Arc<Self>, s: &tokio::net::TcpStream) -> Option<Permit> {
        s.set_nodelay(true).ok()?;
        let peer = s.peer_addr().ok()?;
        self.admit_logged(peer.ip(), "gRPC")
    }

    /// Admits a connection from `address`, or logs why not.
    pub(crate) fn admit_logged(self: &Arc<Self>, address: IpAddr, port: &str) -> Option<Permit> {
        match self.admit(address) {
            Ok(p) => Some(p),
            Err(r) => {
                tracing::debug!(%address, port, "connection refused: {}", r.message(&self.limits));
                None
            }
        }
    }
}

/// A connection's stream that fails once it stalls: no byte moved for the
/// idle timeout, or its first `head` bytes not in by the header deadline.
pub struct Watched<IO> {
    io: IO,
    _permit: Permit,
    idle: Duration,
    last_moved: Instant,
    /// Bytes still to come before the header deadline, and the deadline.
    head: Option<(usize, Instant)>,
    timer: Pin<Box<Sleep>>,
}

impl<IO> Watched<IO> {
    /// Watches `io`, which must bring its first `head_bytes` bytes (0: none
    /// asked) within the header timeout.
    pub(crate) fn new(io: IO, permit: Permit, head_bytes: usize) -> Self {
        let limits = *permit.gate.limits();
        let now = Instant::now();
        let head = (head_bytes > 0).then(|| (head_bytes, now + limits.header_timeout));
        Self {
            io,
            _permit: permit,
            idle: limits.idle_timeout,
            last_moved: now,
            head,
            timer: Box::pin(tokio::time::sleep_until(now + limits.idle_timeout)),
        }
    }

    fn deadline(&self) -> Instant {
        let idle = self.last_moved + self.idle;
        match self.head {
            Some((_, d)) => idle.min(d),
            None => idle,
        }
    }

    /// On a pending read or write: an error once the deadline has passed.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let deadline = self.deadline();
        if self.timer.deadline() != deadline {
            self.timer.as_mut().reset(deadline);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                if self.head.is_some() {
                    "the client sent no request within --header-timeout"
                } else {
                    "the connection was idle past --idle-timeout"
                },
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    self.last_moved = Instant::now();
                    if let Some((left, _)) = &mut self.head {
                        *left = left.saturating_sub(n);
                        if *left == 0 {
                            self.head = None;
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.check(cx).map(Err),
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.last_moved = Instant::now();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            // A client that stops reading stalls the connection as surely
            // as one that stops writing.
            Poll::Pending => self.check(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Watched<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A request body that fails when it stalls: each `timeout` it spends
/// waiting for the client must bring [`MIN_BODY_PROGRESS`] bytes. Time the
/// server spends not reading (a slow disk) is not counted against it.
pub struct Paced<B> {
    inner: B,
    timeout: Duration,
    /// Time spent waiting in this window, and the bytes it brought.
    waited: Duration,
    bytes: u64,
    /// When the current wait began (the last poll that found nothing).
    waiting_since: Option<Instant>,
    timer: Pin<Box<Sleep>>,
}

impl<B> Paced<B> {
    /// Paces `inner`.
    pub fn new(inner: B, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            waited: Duration::ZERO,
            bytes: 0,
            waiting_since: None,
            timer: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

/// A request body that stalled past `--body-timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body brought under {MIN_BODY_PROGRESS} bytes in {0:?} of waiting (--body-timeout); send it faster or check the network")]
pub struct BodyStalled(Duration);

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let now = Instant::now();
        if let Some(since) = this.waiting_since.take() {
            this.waited += now - since;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.bytes += data.len() as u64;
                }
                if this.bytes >= MIN_BODY_PROGRESS {
                    this.waited = Duration::ZERO;
                    this.bytes = 0;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                if this.waited >= this.timeout {
                    return Poll::Ready(Some(Err(BodyStalled(this.timeout).into())));
                }
                this.waiting_since = Some(now);
                this.timer
                    .as_mut()
                    .reset(now + (this.timeout - this.waited));
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(BodyStalled(this.timeout).into()))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The gRPC servers' layer that paces every request body ([`Paced`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PaceBodies(pub(crate) Duration);

impl<S> tower::Layer<S> for PaceBodies {
    type Service = PacedBodies<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PacedBodies {
            inner,
            timeout: self.0,
        }
    }
}

/// A service whose request bodies are paced ([`PaceBodies`]).
#[derive(Debug, Clone)]
pub(crate) struct PacedBodies<S> {
    inner: S,
    timeout: Duration,
}

impl<S> tower::Service<axum::http::Request<tonic::body::Body>> for PacedBodies<S>
where
    S: tower::Service<axum::http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: axum::http::Request<tonic::body::Body>) -> Self::Future {
        let timeout = self.timeout;
        self.inner
            .call(req.map(|b| tonic::body::Body::new(Paced::new(b, timeout))))
    }
}

/// The gRPC port's connections: those `gate` admits, watched for stalls,
/// the HTTP/2 preface due within the header timeout. Refused ones are closed.
pub(crate) fn gated(
    listener: tokio::net::TcpListener,
    gate: Arc<Gate>,
) -> impl tokio_stream::Stream<Item = std::io::Result<Watched<tokio::net::TcpStream>>> {
    tokio_stream::StreamExt::filter_map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        move |s| {
            let s = match s {
                Ok(s) => s,
                Err(e) => return Some(Err(e)),
            };
            let permit = gate.admit_grpc(&s)?;
            Some(Ok(Watched::new(s, permit, H2_PREFACE.len())))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn limits(per_address: usize, total: usize) -> ConnectionLimits {
        ConnectionLimits {
            per_address,
            total,
            ..Default::default()
        }
    }

    #[test]
    fn the_gate_caps_each_address_and_the_total_and_frees_on_drop() {
        let gate = Gate::new(limits(2, 3));
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let a1 = gate.admit(a).unwrap();
        let _a2 = gate.admit(a).unwrap();
        assert_eq!(gate.admit(a).unwrap_err(), Refusal::Address);
        let _b1 = gate.admit(b).unwrap();
        assert_eq!(gate.admit(b).unwrap_err(), Refusal::Total);
        drop(a1);
        assert!(gate.admit(b).is_ok(), "a closed connection frees its place");
        assert!(Refusal::Total
            .message(gate.limits())
            .contains("--max-connections"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_fails_at_the_header_deadline_then_at_idle() {
        let gate = Gate::new(ConnectionLimits {
            header_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(5),
            ..Default::default()
        });
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (client, server) = tokio::io::duplex(64);
        let mut watched = Watched::new(server, gate.admit(ip).unwrap(), 4);
        let started = Instant::now();
        let mut buf = [0u8; 8];
        let e = tokio::io::AsyncReadExt::read(&mut watched, &mut buf)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(2));
        drop((client, watched));

        // Once its head is in, only the idle timeout applies.
        let (mut client, server) = tokio::io::duplex(64);
        let mut watched = Watched::new(server, gate.admit(ip).unwrap(), 4);
        tokio::io::AsyncWriteExt::write_all(&mut client, b"PRI ")
            .await
            .unwrap();
        let n = tokio::io::AsyncReadExt::read(&mut watched, &mut buf)
            .await
            .unwrap();
        assert_eq!(n, 4);
        let read_at = Instant::now();
        let e = tokio::io::AsyncReadExt::read(&mut watched, &mut buf)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(read_at.elapsed(), Duration::from_secs(5));
    }

    /// A body from a channel of chunks, for pacing tests.
    struct Chunks(tokio::sync::mpsc::Receiver<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0.poll_recv(cx).map(|c| c.map(|b| Ok(Frame::data(b))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_stalls_and_a_steady_one_does_not() {
        use http_body_util::BodyExt;
        let timeout = Duration::from_secs(3);
        // A byte a second: under 1 KiB in 3 s of waiting.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            while tx.send(Bytes::from_static(b"x")).await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = Instant::now();
        let e = Paced::new(Chunks(rx), timeout).collect().await.unwrap_err();
        assert!(e.to_string().contains("--body-timeout"), "{e}");
        assert!(
            started.elapsed() <= Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );

        // 2 KiB a second for 10 s, with the server's own pauses not counted.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            for _ in 0..10 {
                tx.send(Bytes::from(vec![0u8; 2048])).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let mut body = Paced::new(Chunks(rx), timeout);
        let mut got = 0;
        while let Some(frame) = body.frame().await {
            got += frame.unwrap().into_data().unwrap().len();
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        assert_eq!(got, 20 * 1024);
    }
}
