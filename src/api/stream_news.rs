//! News of streams for requests that wait on one: held build status requests, and creates,
//! resumes and pauses of launched sandboxes. One LISTEN connection per API process, fanned out
//! to the requests that wait on a stream.
//!
//! Two channels carry news: the event store's (`strata_events`, whose payload names the streams
//! a burst of appends touched, so a change wakes only its stream's waiters) and the log
//! writer's (`strata_build_logs`, the build's id: news of its build stream). A notification that
//! may concern any stream (an overflowing burst, a reconnect that may have lost some) wakes
//! every waiter; a waiter only ever reads again on waking, so a spurious wake-up costs one read,
//! and a lost one costs the request its hold time, never an answer. While the process cannot
//! listen, nobody is held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgNotification};
use sqlx::PgPool;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::domain::ids::{self, BuildId};
use crate::events::EVENTS_CHANNEL;
use crate::projections::build_logs::LOGS_CHANNEL;

/// How long a listener that failed waits before it connects again.
const RECONNECT_AFTER: Duration = Duration::from_secs(5);

/// Shared by every handler of one process; cheap to clone.
#[derive(Clone)]
pub struct StreamNews {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    /// One sender per stream somebody waits on; removed with its last waiter.
    waiters: Mutex<HashMap<String, watch::Sender<()>>>,
    /// True while the LISTEN connection is up: only then can a waiter count on being woken.
    listening: AtomicBool,
    started: Once,
    held: Arc<Semaphore>,
    /// Stops the listener when the last handle is dropped.
    _stop: DropGuard,
    stop: CancellationToken,
}

impl StreamNews {
    /// News for at most `max_held` requests held at once. Starts listening at once when made
    /// inside a runtime, else on the first [`watch`](Self::watch).
    pub fn new(pool: PgPool, max_held: usize) -> Self {
        let stop = CancellationToken::new();
        let news = Self {
            inner: Arc::new(Inner {
                pool,
                waiters: Mutex::default(),
                listening: AtomicBool::new(false),
                started: Once::new(),
                held: Arc::new(Semaphore::new(max_held)),
                _stop: stop.clone().drop_guard(),
                stop,
            }),
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            news.start();
        }
        news
    }

    fn start(&self) {
        self.inner.started.call_once(|| {
            tokio::spawn(listen(
                Arc::downgrade(&self.inner),
                self.inner.pool.clone(),
                self.inner.stop.clone(),
            ));
        });
    }

    /// Whether requests can be held now (the LISTEN connection is up).
    pub fn is_listening(&self) -> bool {
        self.inner.listening.load(Ordering::Acquire)
    }

    /// A watch on `build`'s news (its stream and its log lines), taken before reading its state
    /// so that nothing written after the read is missed; `None` while this process is not
    /// listening (answer at once).
    pub fn watch(&self, build: BuildId) -> Option<StreamWatch> {
        self.watch_stream(ids::stream::build(&build))
    }

    /// A watch on the news of the stream named `stream`, as [`watch`](Self::watch).
    pub fn watch_stream(&self, stream: String) -> Option<StreamWatch> {
        self.start();
        if !self.is_listening() {
            return None;
        }
        let rx = self
            .inner
            .waiters
            .lock()
            .expect("build news lock")
            .entry(stream.clone())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        Some(StreamWatch {
            rx: Some(rx),
            stream,
            inner: self.inner.clone(),
        })
    }
}

/// One request's watch on one stream.
pub struct StreamWatch {
    rx: Option<watch::Receiver<()>>,
    stream: String,
    inner: Arc<Inner>,
}

impl StreamWatch {
    /// A place among the held requests; `None` when all are taken (answer at once).
    pub fn hold(&self) -> Option<OwnedSemaphorePermit> {
        self.inner.held.clone().try_acquire_owned().ok()
    }

    /// Resolves on the next news of the stream (or of any stream) since the watch was taken or
    /// since the last call.
    pub async fn news(&mut self) {
        let rx = self
            .rx
            .as_mut()
            .expect("a watch's receiver lives as long as it");
        if rx.changed().await.is_err() {
            // The sender is removed only with its last receiver, so this cannot happen; never
            // spin if it does.
            std::future::pending::<()>().await;
        }
    }
}

impl StreamWatch {
    /// Whether the stream (or any stream) had news since the watch was taken; what a reader
    /// that keeps an answer checks before using it again.
    pub fn has_changed(&self) -> bool {
        self.rx
            .as_ref()
            .is_none_or(|rx| rx.has_changed().unwrap_or(true))
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut waiters = self.inner.waiters.lock().expect("build news lock");
        if waiters
            .get(&self.stream)
            .is_some_and(|tx| tx.receiver_count() == 0)
        {
            waiters.remove(&self.stream);
        }
    }
}

impl Inner {
    fn wake(&self, stream: &str) {
        if let Some(tx) = self.waiters.lock().expect("build news lock").get(stream) {
            tx.send_replace(());
        }
    }

    fn wake_all(&self) {
        for tx in self.waiters.lock().expect("build news lock").values() {
            tx.send_replace(());
        }
    }

    fn dispatch(&self, notification: &PgNotification) {
        let payload = notification.payload();
        match notification.channel() {
            LOGS_CHANNEL => match BuildId::parse(payload) {
                Ok(build) => self.wake(&ids::stream::build(&build)),
                Err(_) => self.wake_all(),
            },
            _ => match crate::events::streams_of(payload) {
                Some(streams) => {
                    for stream in streams {
                        self.wake(stream);
                    }
                }
                None => self.wake_all(),
            },
        }
    }
}

/// Listens until `stop`, reconnecting after failures; ends when the last handle is gone.
async fn listen(inner: Weak<Inner>, pool: PgPool, stop: CancellationToken) {
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen_all([EVENTS_CHANNEL, LOGS_CHANNEL]).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let failure = match stop.run_until_cancelled(connected).await {
            None => return,
            Some(Ok(mut listener)) => {
                let Some(live) = inner.upgrade() else { return };
                live.listening.store(true, Ordering::Release);
                drop(live);
                loop {
                    let received = match stop.run_until_cancelled(listener.try_recv()).await {
                        None => return,
                        Some(received) => received,
                    };
                    let Some(live) = inner.upgrade() else { return };
                    match received {
                        Ok(Some(notification)) => live.dispatch(&notification),
                        // The connection dropped and the next receive reconnects: whatever was
                        // sent meanwhile is lost, so every waiter reads again.
                        Ok(None) => live.wake_all(),
                        Err(err) => break err,
                    }
                }
            }
            Some(Err(err)) => err,
        };
        if let Some(inner) = inner.upgrade() {
            inner.listening.store(false, Ordering::Release);
            inner.wake_all();
        }
        tracing::warn!(error = %failure, "cannot LISTEN for build news; status requests answer at once until it reconnects");
        if stop
            .run_until_cancelled(tokio::time::sleep(RECONNECT_AFTER))
            .await
            .is_none()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_watch_wakes_on_its_own_stream_and_on_news_of_any_and_not_on_others() {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .unwrap();
        let news = StreamNews::new(pool, 4);
        news.inner.listening.store(true, Ordering::Release);
        let build = BuildId::parse("0b7e4a52-3a5e-4c52-9a4e-1c1d0f5e8a11").unwrap();
        let mut of_build = news.watch(build).unwrap();
        let mut of_sandbox = news.watch_stream("sandbox-iabc".into()).unwrap();
        let woke = |w: &mut StreamWatch| {
            use std::future::Future;
            let mut fut = std::pin::pin!(w.news());
            let waker = futures::task::noop_waker();
            let mut cx = std::task::Context::from_waker(&waker);
            fut.as_mut().poll(&mut cx).is_ready()
        };
        assert!(!of_sandbox.has_changed());
        news.inner.wake("sandbox-iabc");
        assert!(of_sandbox.has_changed() && !of_build.has_changed());
        assert!(woke(&mut of_sandbox) && !woke(&mut of_build));
        news.inner.wake(&ids::stream::build(&build));
        assert!(woke(&mut of_build) && !woke(&mut of_sandbox));
        news.inner.wake("template-other");
        assert!(!woke(&mut of_build) && !woke(&mut of_sandbox));
        news.inner.wake_all();
        assert!(woke(&mut of_build) && woke(&mut of_sandbox));
        drop(of_sandbox);
        assert!(!news
            .inner
            .waiters
            .lock()
            .unwrap()
            .contains_key("sandbox-iabc"));
    }
}
