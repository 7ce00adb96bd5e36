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
            Ok(r) => {
                let status = r.status();
                if status.as_u16() == 503 || status.as_u16() == 429 {
                    c.throttled.fetch_add(1, Ordering::Relaxed);
                }
                if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
                    c.retried.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(_) => {
                c.retried.fetch_add(1, Ordering::Relaxed);
            }
        }
        answer
    }
}
