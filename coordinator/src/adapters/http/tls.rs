//! Serving the HTTP port over TLS with the coordinator's `--tls-cert` and
//! `--tls-key` (the same files as gRPC), because the Blender add-on talks
//! to it from artists' machines. rustls through tokio-rustls, which tonic
//! already uses, so no new TLS stack is built in.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::adapters::connections::Watched;
use crate::adapters::http::GatedListener;
use crate::error::Error;

/// How long a client may take over its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// A TLS acceptor for this certificate chain and key (PEM), for the HTTP port.
pub fn acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsAcceptor, Error> {
    acceptor_for(cert_pem, key_pem, b"http/1.1", "--http")
}

/// A TLS acceptor for the gRPC port (HTTP/2, as gRPC clients ask by ALPN).
pub fn grpc_acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsAcceptor, Error> {
    acceptor_for(cert_pem, key_pem, b"h2", "gRPC")
}

/// A TLS acceptor for this certificate chain and key (PEM), offering the
/// protocol `alpn`; `port` names the port in errors.
fn acceptor_for(
    cert_pem: &[u8],
    key_pem: &[u8],
    alpn: &[u8],
    port: &str,
) -> Result<TlsAcceptor, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, e: &dyn std::fmt::Display| {
        Error::invalid(format!(
            "bad TLS {what} for {port}: {e}; give the PEM files of --tls-cert and --tls-key"
        ))
    };
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad("certificate", &e))?;
    if certs.is_empty() {
        return Err(bad("certificate", &"no certificate in the file"));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| bad("key", &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("setup", &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("certificate or key", &e))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener that hands out connections once their TLS handshake is done;
/// handshakes run side by side, so a slow client holds up no one.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<Watched<TcpStream>>, SocketAddr)>,
    addr: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Accepts TLS connections on `listener`.
    pub(crate) fn new(mut listener: GatedListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let addr = axum::serve::Listener::local_addr(&listener)?;
        let (tx, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = listener.accept_watched().await;
                let acceptor = acceptor.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            addr,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Watched<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task is gone: serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bad_pem_is_a_clear_error_naming_the_flags() {
        let e = super::acceptor(b"not a certificate", b"not a key")
            .err()
            .expect("refused");
        let msg = e.to_string();
        assert!(
            msg.contains("--tls-cert") && msg.contains("--http"),
            "{msg}"
        );
    }
}
