//! The one seam between the synchronous store traits (`MetaStore`,
//! `BlobStore`) and the async clients behind them (tokio-postgres, the S3
//! client): each store on another machine runs its client on a small
//! runtime of its own, and a caller waits for an answer in the one way that
//! never stalls a tokio worker thread nor deadlocks, whatever thread it is
//! on. The farm never calls a store under its lock (see ARCHITECTURE.md),
//! so a wait here holds up only its own caller.

use std::future::Future;

use tokio::task::JoinHandle;

use crate::error::Error;

/// A runtime of a store's own that runs its client's requests.
#[derive(Debug)]
pub struct Bridge {
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl Bridge {
    /// Starts a runtime of two threads named `tessera-NAME` for the client
    /// of `what` (for messages: "the S3 client").
    pub fn new(name: &str, what: &str) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("tessera-{name}"))
            .enable_all()
            .build()
            .map_err(|e| Error::io(format!("cannot start the threads of {what}"), e))?;
        let handle = runtime.handle().clone();
        Ok(Self {
            runtime: Some(runtime),
            handle,
        })
    }

    /// Starts `fut` on the store's runtime.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(fut)
    }

    /// The runtime's handle (for clients that spawn on it themselves).
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Runs `fut` on the store's runtime and waits for it (see the module
    /// doc). `None` when the runtime is shutting down.
    pub fn run<F>(&self, fut: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        match Handle::try_current() {
            Ok(h) if h.id() == self.handle.id() => {
                // Waiting here would hold one of the threads the answer
                // needs. No store does it.
                tracing::error!("a store call was made from its client's own runtime");
                None
            }
            Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| rx.recv().ok())
            }
            // A blocking thread, a plain thread, or a current-thread runtime
            // (tests): waiting blocks only this thread; the answer comes
            // from the store's own runtime.
            _ => rx.recv().ok(),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which is not allowed on an async
        // thread (where the last `Arc` of a farm may well go).
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A request's answer, as the S3 client's runtime would give it.
    fn answer(io: &Bridge) -> Option<u32> {
        io.run(async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            7
        })
    }

    #[test]
    fn the_sync_seam_answers_on_a_plain_thread() {
        assert_eq!(
            answer(&Bridge::new("test", "a test client").unwrap()),
            Some(7)
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_sync_seam_answers_on_a_current_thread_runtime_and_drops_there() {
        let io = Bridge::new("test", "a test client").unwrap();
        assert_eq!(answer(&io), Some(7));
        // Dropped on an async thread: no "cannot drop a runtime" panic.
        drop(io);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_on_every_worker_thread_leave_the_runtime_running() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let io = Arc::new(Bridge::new("test", "a test client").unwrap());
        let (tx, rx) = tokio::sync::watch::channel(false);
        let tx = Arc::new(tx);
        let waiting = Arc::new(AtomicUsize::new(0));
        let (done, answers) = std::sync::mpsc::channel();
        // As many callers as the runtime has workers, each waiting for an
        // answer that needs a task of this runtime to run: without
        // block_in_place they would hold both workers and never get it.
        for _ in 0..2 {
            let (io, waiting, mut rx, done) =
                (io.clone(), waiting.clone(), rx.clone(), done.clone());
            tokio::spawn(async move {
                waiting.fetch_add(1, Ordering::SeqCst);
                let got = io.run(async move { rx.wait_for(|go| *go).await.is_ok() });
                let _ = done.send(got);
            });
        }
        while waiting.load(Ordering::SeqCst) < 2 {
            std::thread::yield_now();
        }
        let go = tx.clone();
        tokio::spawn(async move { go.send(true) });
        // Waited for here, on the test's own thread, which no caller holds.
        for _ in 0..2 {
            match answers.recv_timeout(Duration::from_secs(20)) {
                Ok(got) => assert_eq!(got, Some(true)),
                Err(_) => {
                    let _ = tx.send(true); // let the stuck callers finish
                    panic!("callers blocked the runtime's workers");
                }
            }
        }
        let blocking = io.clone();
        let from_blocking = tokio::task::spawn_blocking(move || answer(&blocking));
        assert_eq!(from_blocking.await.unwrap(), Some(7));
        drop(Arc::try_unwrap(io).unwrap());
    }

    #[test]
    fn a_call_from_the_stores_own_runtime_is_refused_not_deadlocked() {
        let io = Arc::new(Bridge::new("test", "a test client").unwrap());
        let inner = io.clone();
        let got = io
            .run(async move { answer(&inner) })
            .expect("the outer call answers");
        assert_eq!(got, None);
    }
}
