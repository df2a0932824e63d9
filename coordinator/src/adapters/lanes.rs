//! Two lanes for the coordinator's connections, so that reads never wait
//! behind the fleet's writes.
//!
//! Under a full fleet the runtime's threads have thousands of worker calls
//! (leases, results) ready to run, and every connection task queues behind
//! them: at 1,000 workers a `tessera status` took 250-400 ms although its
//! handler ran in 3-18 ms. So clients get a lane of their own: one thread
//! with a runtime of its own, which the operating system schedules beside
//! the fleet's threads rather than behind their queue.
//!
//! The clients' lane accepts every connection to both ports. The HTTP port
//! (dashboard, JSON API, metrics) is served there whole. A gRPC connection
//! is sorted by its first request, read from the bytes it sends first: one
//! that opens with a call to the `Farm` service (`tessera status`, `jobs`,
//! `watch`, the add-on) stays in the clients' lane; any other (a worker's
//! `Register` or `Lease`, an upload) is handed to the main runtime, which
//! serves the fleet. The bytes read to sort it are replayed to the server
//! ([`Rewound`]), so sorting changes nothing a connection sees.
//!
//! With `--tls` the lane makes the TLS handshake and reads the first
//! request decrypted. A connection handed to the fleet keeps its TLS
//! session and moves its socket to the main runtime's reactor ([`Homed`]),
//! so the fleet's I/O never waits on the lane's thread.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::adapters::connections::H2_PREFACE as PREFACE;

/// Bytes read at most to find a connection's first request: a client's
/// preface, settings and first headers take about 200.
const SORT_LIMIT: usize = 16 << 10;

/// The `:path` prefix of the `Farm` service's calls.
const FARM_PATH: &[u8] = b"/tessera.v1.Farm/";

/// [`FARM_PATH`] as HPACK's Huffman code writes it (RFC 7541, appendix B),
/// up to its last whole byte, as gRPC clients send it. A test derives it
/// from a real client's first request for every `Farm` call.
const FARM_PATH_HUFFMAN: &[u8] = &[
    0x61, 0x25, 0x42, 0x0b, 0x60, 0xd7, 0xee, 0x15, 0xf0, 0x8e, 0xca, 0x58,
];

/// Where a gRPC connection is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The clients' lane: a connection that opened with a `Farm` call.
    Clients,
    /// The main runtime: workers, uploads, and anything not recognised.
    Fleet,
}

/// The lane for a connection that sent `head` first; `None` while the
/// first request's headers are not all in `head` yet.
pub(crate) fn lane_of(head: &[u8]) -> Option<Lane> {
    let n = head.len().min(PREFACE.len());
    if head[..n] != PREFACE[..n] {
        // Not HTTP/2 with prior knowledge: the main server answers it.
        return Some(Lane::Fleet);
    }
    let mut at = PREFACE.len();
    loop {
        let frame = head.get(at..at + 9)?;
        let len =
            (usize::from(frame[0]) << 16) | (usize::from(frame[1]) << 8) | usize::from(frame[2]);
        let payload = head.get(at + 9..at + 9 + len)?;
        const HEADERS: u8 = 0x1;
        if frame[3] == HEADERS {
            let farm =
                header_block(payload, frame[4])
                    .and_then(path)
                    .is_some_and(|(huffman, p)| {
                        if huffman {
                            p.starts_with(FARM_PATH_HUFFMAN)
                        } else {
                            p.starts_with(FARM_PATH)
                        }
                    });
            return Some(if farm { Lane::Clients } else { Lane::Fleet });
        }
        at += 9 + len;
    }
}

/// A HEADERS frame's header block, without its padding and priority.
fn header_block(payload: &[u8], flags: u8) -> Option<&[u8]> {
    const PADDED: u8 = 0x8;
    const PRIORITY: u8 = 0x20;
    let mut block = payload;
    if flags & PADDED != 0 {
        let (&pad, rest) = block.split_first()?;
        block = rest.get(..rest.len().checked_sub(usize::from(pad))?)?;
    }
    if flags & PRIORITY != 0 {
        block = block.get(5..)?;
    }
    Some(block)
}

/// The `:path` of a connection's first header block, and whether it is
/// Huffman-coded. The dynamic table is empty on a new connection, so only
/// the static table's `:path` (index 4) can name it.
fn path(mut block: &[u8]) -> Option<(bool, &[u8])> {
    const PATH: u64 = 4;
    while let Some(&first) = block.first() {
        if first & 0x80 != 0 {
            // An indexed field: index 4 is the static `:path: /`.
            let (index, rest) = integer(block, 7)?;
            if index == PATH {
                return Some((false, b"/"));
            }
            block = rest;
            continue;
        }
        if first & 0xe0 == 0x20 {
            // A dynamic table size update.
            block = integer(block, 5)?.1;
            continue;
        }
        // A literal: with indexing (01), or without / never indexed (0000, 0001).
        let prefix = if first & 0xc0 == 0x40 { 6 } else { 4 };
        let (name, rest) = integer(block, prefix)?;
        block = rest;
        if name == 0 {
            block = string(block)?.2;
        }
        let (huffman, value, rest) = string(block)?;
        if name == PATH {
            return Some((huffman, value));
        }
        block = rest;
    }
    None
}

/// An HPACK integer with a `prefix`-bit prefix, and the bytes after it.
fn integer(bytes: &[u8], prefix: u32) -> Option<(u64, &[u8])> {
    let (&first, mut rest) = bytes.split_first()?;
    let max = (1u64 << prefix) - 1;
    let mut value = u64::from(first) & max;
    if value < max {
        return Some((value, rest));
    }
    let mut shift = 0;
    loop {
        let (&b, tail) = rest.split_first()?;
        rest = tail;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        if b & 0x80 == 0 {
            return Some((value, rest));
        }
        shift += 7;
        if shift > 28 {
            return None;
        }
    }
}

/// An HPACK string: whether Huffman-coded, its bytes, and the bytes after it.
fn string(bytes: &[u8]) -> Option<(bool, &[u8], &[u8])> {
    let huffman = bytes.first()? & 0x80 != 0;
    let (len, rest) = integer(bytes, 7)?;
    let len = usize::try_from(len).ok()?;
    Some((huffman, rest.get(..len)?, rest.get(len..)?))
}

/// A connection whose first bytes were read to sort it, replayed before
/// the rest.
pub struct Rewound<IO> {
    head: Vec<u8>,
    replayed: usize,
    io: IO,
}

impl<IO> Rewound<IO> {
    /// `io`, which already gave `head`.
    pub(crate) fn new(head: Vec<u8>, io: IO) -> Self {
        Self {
            head,
            replayed: 0,
            io,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewound<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.replayed < this.head.len() {
            let rest = &this.head[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            if this.replayed == this.head.len() {
                this.head = Vec::new();
                this.replayed = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewound<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Rewound<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// How long a connection's first request may take after its preface to be
/// sorted. A gRPC client of this project sends it at once; clients that
/// wait for the server's settings first (grpc-go, gRPC C-core) are served
/// on the fleet's runtime after this wait, once per connection.
const FIRST_REQUEST_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Reads from `stream` until its first request says its lane or the limit
/// is reached: the lane (the fleet's when unsure) and the bytes read. A
/// connection whose preface is not in by `deadline` is refused with
/// `TimedOut`; one whose first request is not in [`FIRST_REQUEST_WAIT`]
/// after its preface goes to the fleet. One that fails or closes first is
/// an error.
pub(crate) async fn sort<S: AsyncRead + Unpin>(
    stream: &mut S,
    deadline: tokio::time::Instant,
) -> io::Result<(Lane, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = Vec::with_capacity(512);
    let mut deadline = deadline;
    let mut preface_in = false;
    loop {
        if let Some(lane) = lane_of(&head) {
            return Ok((lane, head));
        }
        if head.len() >= SORT_LIMIT {
            return Ok((Lane::Fleet, head));
        }
        if !preface_in && head.len() >= PREFACE.len() {
            preface_in = true;
            deadline = deadline.min(tokio::time::Instant::now() + FIRST_REQUEST_WAIT);
        }
        let mut chunk = [0u8; 4096];
        let want = chunk.len().min(SORT_LIMIT - head.len());
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut chunk[..want])).await {
            Ok(n) => n?,
            Err(_) if preface_in => return Ok((Lane::Fleet, head)),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        };
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&chunk[..n]);
    }
}

/// A connection's socket that can move from the runtime that accepted it to
/// another, under a TLS session: the socket leaves its reactor
/// ([`Homed::leave`]) and joins the reactor of the runtime it is then
/// served on ([`Homed::settle`]), while the TLS session above it stays.
pub struct Homed {
    state: Home,
    local: Option<std::net::SocketAddr>,
    remote: Option<std::net::SocketAddr>,
}

enum Home {
    Here(tokio::net::TcpStream),
    Moving(std::net::TcpStream),
    Gone,
}

impl Homed {
    /// `stream`, at home in the runtime it was made in.
    pub(crate) fn new(stream: tokio::net::TcpStream) -> Self {
        Self {
            local: stream.local_addr().ok(),
            remote: stream.peer_addr().ok(),
            state: Home::Here(stream),
        }
    }

    /// Leaves this runtime's reactor, to [`settle`](Self::settle) in another.
    pub(crate) fn leave(&mut self) -> io::Result<()> {
        if let Home::Here(s) = std::mem::replace(&mut self.state, Home::Gone) {
            self.state = Home::Moving(s.into_std()?);
        }
        Ok(())
    }

    /// Joins the reactor of the runtime this is called in.
    pub(crate) fn settle(&mut self) -> io::Result<()> {
        if let Home::Moving(s) = std::mem::replace(&mut self.state, Home::Gone) {
            self.state = Home::Here(tokio::net::TcpStream::from_std(s)?);
        }
        Ok(())
    }

    fn here(&mut self) -> io::Result<Pin<&mut tokio::net::TcpStream>> {
        match &mut self.state {
            Home::Here(s) => Ok(Pin::new(s)),
            _ => Err(io::Error::other("the connection is between runtimes")),
        }
    }
}

impl AsyncRead for Homed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.here() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Homed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.here() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.here() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.here() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl tonic::transport::server::Connected for Homed {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

/// A gRPC connection, plain or under TLS, whose socket can move between
/// runtimes ([`Homed`]).
pub enum Conn {
    /// Plain HTTP/2.
    Plain(Homed),
    /// HTTP/2 under TLS; the session made in the clients' lane.
    Tls(Box<tokio_rustls::server::TlsStream<Homed>>),
}

impl Conn {
    /// The socket under the connection.
    pub(crate) fn homed(&mut self) -> &mut Homed {
        match self {
            Conn::Plain(h) => h,
            Conn::Tls(t) => t.get_mut().0,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(h) => Pin::new(h).poll_read(cx, buf),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(h) => Pin::new(h).poll_write(cx, buf),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(h) => Pin::new(h).poll_flush(cx),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(h) => Pin::new(h).poll_shutdown(cx),
            Conn::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match self {
            Conn::Plain(h) => h.connect_info(),
            Conn::Tls(t) => t.get_ref().0.connect_info(),
        }
    }
}

/// The clients' lane: a thread running a runtime of its own, until stopped.
pub(crate) struct ClientsLane {
    stop: tokio::sync::watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Resolves once the lane is asked to stop.
#[derive(Clone)]
pub(crate) struct Stopped(tokio::sync::watch::Receiver<bool>);

impl Stopped {
    /// Waits for the stop.
    pub(crate) async fn wait(mut self) {
        let _ = self.0.wait_for(|stop| *stop).await;
    }
}

/// How long the lane's servers may take to finish their calls once
/// stopped; streams still open then (a `watch`) are dropped.
const LANE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl ClientsLane {
    /// Starts the lane's thread, which runs the future `work` makes (inside
    /// the lane's runtime, so sockets made there are the lane's) until it
    /// ends, or [`LANE_GRACE`] after the stop.
    pub(crate) fn start<F>(work: impl FnOnce(Stopped) -> F + Send + 'static) -> io::Result<Self>
    where
        F: std::future::Future<Output = ()>,
    {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("tessera-clients".into())
            .spawn(move || {
                rt.block_on(async move {
                    let stopped = Stopped(stopped);
                    let late = {
                        let stopped = stopped.clone();
                        async move {
                            stopped.wait().await;
                            tokio::time::sleep(LANE_GRACE).await;
                        }
                    };
                    tokio::select! {
                        () = work(stopped) => {}
                        () = late => tracing::debug!("the clients' lane stopped with calls open"),
                    }
                });
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the lane and waits for its thread.
    pub(crate) async fn finish(mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

impl Drop for ClientsLane {
    fn drop(&mut self) {
        // Dropped without `finish` (the server's future was dropped): the
        // thread stops on its own.
        let _ = self.stop.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_decode_with_their_prefix() {
        // RFC 7541 C.1: 10 in a 5-bit prefix, 1337 in a 5-bit prefix.
        assert_eq!(integer(&[0x0a], 5), Some((10, &[][..])));
        assert_eq!(
            integer(&[0x1f, 0x9a, 0x0a, 0xff], 5),
            Some((1337, &[0xff][..]))
        );
        assert_eq!(integer(&[0x1f, 0x9a], 5), None);
    }

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_plain_farm_path_after_settings_sorts_to_the_clients_lane() {
        let mut head = PREFACE.to_vec();
        head.extend(frame(0x4, 0, &[0, 4, 0, 0, 0x10, 0]));
        // :method POST (indexed 3), :path literal without indexing, plain.
        let full = {
            let mut b = vec![0x83, 0x04, 23];
            b.extend_from_slice(b"/tessera.v1.Farm/GetJob");
            b
        };
        let mut with_headers = head.clone();
        with_headers.extend(frame(0x1, 0x4, &full));
        assert_eq!(lane_of(&with_headers), Some(Lane::Clients));
        // Every prefix short of the whole frame waits for more.
        for cut in 0..with_headers.len() {
            assert_eq!(lane_of(&with_headers[..cut]), None, "cut at {cut}");
        }
        // Padded and with a priority: the same block.
        let mut padded = vec![3, 0, 0, 0, 0, 16];
        padded.extend_from_slice(&full);
        padded.extend_from_slice(&[0, 0, 0]);
        head.extend(frame(0x1, 0x4 | 0x8 | 0x20, &padded));
        assert_eq!(lane_of(&head), Some(Lane::Clients));
    }

    #[test]
    fn other_paths_and_other_protocols_go_to_the_fleet() {
        let mut head = PREFACE.to_vec();
        let mut block = vec![0x83, 0x44, 22];
        block.extend_from_slice(b"/tessera.v1.Work/Lease");
        head.extend(frame(0x1, 0x4, &block));
        assert_eq!(lane_of(&head), Some(Lane::Fleet));
        assert_eq!(lane_of(b"GET / HTTP/1.1\r\n"), Some(Lane::Fleet));
        // Garbage where the header block should be.
        let mut bad = PREFACE.to_vec();
        bad.extend(frame(0x1, 0x4, &[0x7f, 0xff, 0xff]));
        assert_eq!(lane_of(&bad), Some(Lane::Fleet));
    }

    /// A real gRPC client's first request, sorted as the server sorts it.
    async fn first_request_lane(call: &'static str) -> Lane {
        use tessera_proto as pb;
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let client = tokio::spawn(async move {
            let ch = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect_lazy();
            let mut farm = pb::farm_client::FarmClient::new(ch.clone());
            let mut work = pb::work_client::WorkClient::new(ch.clone());
            let mut blobs = pb::blobs_client::BlobsClient::new(ch);
            let job = pb::JobRef::default;
            let _ = match call {
                "GetJob" => farm.get_job(job()).await.map(drop),
                "ListJobs" => farm
                    .list_jobs(pb::ListJobsRequest::default())
                    .await
                    .map(drop),
                "SubmitJob" => farm.submit_job(pb::JobSpec::default()).await.map(drop),
                "WatchJob" => farm.watch_job(job()).await.map(drop),
                "CancelJob" => farm.cancel_job(job()).await.map(drop),
                "ArchiveJob" => farm.archive_job(job()).await.map(drop),
                "DeleteJob" => farm.delete_job(job()).await.map(drop),
                "PauseJob" => farm.pause_job(job()).await.map(drop),
                "ResumeJob" => farm.resume_job(job()).await.map(drop),
                "RetryJob" => farm.retry_job(job()).await.map(drop),
                "MakePreview" => farm.make_preview(job()).await.map(drop),
                "ListWorkers" => farm
                    .list_workers(pb::ListWorkersRequest::default())
                    .await
                    .map(drop),
                "Register" => work.register(pb::WorkerInfo::default()).await.map(drop),
                "Lease" => work.lease(pb::LeaseRequest::default()).await.map(drop),
                "MissingBlobs" => blobs
                    .missing_blobs(pb::MissingBlobsRequest::default())
                    .await
                    .map(drop),
                other => panic!("no call {other}"),
            };
        });
        let (mut stream, _) = listener.accept().await.unwrap();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut head = Vec::new();
        // The client sends its first request without waiting for the
        // server's settings (which come only once the connection is
        // sorted): read it whole, as `sort` would.
        while lane_of(&head).is_none() {
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout_at(deadline, stream.read(&mut chunk))
                .await
                .expect("the client waited for the server's settings")
                .unwrap();
            assert!(n > 0, "the client closed");
            head.extend_from_slice(&chunk[..n]);
        }
        let lane = lane_of(&head).unwrap();
        assert!(head.starts_with(PREFACE));
        client.abort();
        lane
    }

    #[tokio::test]
    async fn a_real_clients_farm_calls_sort_to_the_clients_lane_and_the_rest_to_the_fleet() {
        for call in [
            "GetJob",
            "ListJobs",
            "SubmitJob",
            "WatchJob",
            "CancelJob",
            "ArchiveJob",
            "DeleteJob",
            "PauseJob",
            "ResumeJob",
            "RetryJob",
            "MakePreview",
            "ListWorkers",
        ] {
            assert_eq!(first_request_lane(call).await, Lane::Clients, "{call}");
        }
        for call in ["Register", "Lease", "MissingBlobs"] {
            assert_eq!(first_request_lane(call).await, Lane::Fleet, "{call}");
        }
    }

    #[tokio::test]
    async fn a_client_silent_after_its_preface_goes_to_the_fleet_and_a_silent_one_is_refused() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Preface and settings, then waiting for the server's settings.
        let mut waiting = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut opening = PREFACE.to_vec();
        opening.extend(frame(0x4, 0, &[]));
        waiting.write_all(&opening).await.unwrap();
        let (mut s, _) = listener.accept().await.unwrap();
        let started = std::time::Instant::now();
        let far = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let (lane, head) = sort(&mut s, far).await.unwrap();
        assert_eq!((lane, head), (Lane::Fleet, opening));
        let waited = started.elapsed();
        assert!(
            waited >= FIRST_REQUEST_WAIT && waited < std::time::Duration::from_secs(5),
            "{waited:?}"
        );
        // Nothing at all: refused at the deadline.
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut s, _) = listener.accept().await.unwrap();
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(200);
        let e = sort(&mut s, soon).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn rewound_replays_its_head_then_reads_on() {
        use tokio::io::AsyncReadExt;
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b"world")
            .await
            .unwrap();
        drop(a);
        let mut r = Rewound::new(b"hello ".to_vec(), b);
        let mut s = String::new();
        r.read_to_string(&mut s).await.unwrap();
        assert_eq!(s, "hello world");
    }
}
