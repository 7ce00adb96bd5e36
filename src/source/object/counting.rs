//! Every request to the store counted on its way, and every answer that gets retried.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The store's counters, shared with the HTTP layer that counts every request.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub retried: AtomicU64,
    pub throttled: AtomicU64,
    /// GETs sent ahead of their readers, and of those, the ones dropped unread.
    pub ahead: AtomicU64,
    pub ahead_unused: AtomicU64,
}

impl Counters {
    /// Counts an answer of `status` as one that gets retried, if it does (5xx, 429, 408),
    /// and as throttling if it is 503 or 429.
    pub(super) fn answered(&self, status: u16) {
        if status == 503 || status == 429 {
            self.throttled.fetch_add(1, Ordering::Relaxed);
        }
        if (500..600).contains(&status) || status == 429 || status == 408 {
            self.retried.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The store's HTTP client, counting every request and every answer that gets retried.
#[derive(Debug)]
pub(super) struct CountingConnector(pub(super) Arc<Counters>);

impl object_store::client::HttpConnector for CountingConnector {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(Counting {
            inner,
            counters: self.0.clone(),
        }))
    }
}

/// See [`CountingConnector`].
#[derive(Debug)]
struct Counting {
    inner: object_store::client::HttpClient,
    counters: Arc<Counters>,
}

#[async_trait::async_trait]
impl object_store::client::HttpService for Counting {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        let c = &self.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        let answer = self.inner.execute(req).await;
        match &answer {
            Ok(r) => c.answered(r.status().as_u16()),
            Err(_) => {
                c.retried.fetch_add(1, Ordering::Relaxed);
            }
        }
        answer
    }
}
