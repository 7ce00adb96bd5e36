//! Listing a whole prefix at once (`coorfs manifest`), and the warnings of what a listing
//! left out.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectMeta, ObjectStore};

use super::LIST_PARALLEL;
use super::errors::listing_error;
use super::tree::Skipped;

/// Lists every object beneath `prefix`: the first levels one at a time with a delimiter
/// until there are enough prefixes to list in parallel, then each of those in full.
pub(super) async fn list_all(
    store: Arc<dyn ObjectStore>,
    prefix: &str,
    name: &Path,
) -> io::Result<Vec<ObjectMeta>> {
    let fail = |e: object_store::Error| io::Error::other(listing_error(name, &e));
    let counted = Arc::new(AtomicU64::new(0));
    let progress = {
        let (counted, name) = (counted.clone(), name.to_path_buf());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(2));
            every.tick().await;
            loop {
                every.tick().await;
                let n = counted.load(Ordering::Relaxed);
                tracing::info!("{}: listed {n} objects so far", name.display());
            }
        })
    };
    let mut objects = Vec::new();
    let root = if prefix.is_empty() {
        None
    } else {
        Some(Key::parse(prefix).map_err(|e| fail(e.into()))?)
    };
    let mut frontier = vec![root];
    for _ in 0..3 {
        if frontier.len() >= LIST_PARALLEL {
            break;
        }
        let mut next = Vec::new();
        for p in &frontier {
            let l = store.list_with_delimiter(p.as_ref()).await.map_err(fail)?;
            counted.fetch_add(l.objects.len() as u64, Ordering::Relaxed);
            objects.extend(l.objects);
            next.extend(l.common_prefixes.into_iter().map(Some));
        }
        frontier = next;
        if frontier.is_empty() {
            break;
        }
    }
    let lists = futures::stream::iter(frontier.into_iter().map(|p| {
        let (store, counted) = (store.clone(), counted.clone());
        async move {
            let mut found = Vec::new();
            let mut s = store.list(p.as_ref());
            while let Some(o) = s.next().await {
                found.push(o?);
                counted.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, object_store::Error>(found)
        }
    }))
    .buffer_unordered(LIST_PARALLEL);
    futures::pin_mut!(lists);
    while let Some(found) = lists.next().await {
        objects.extend(found.map_err(fail)?);
    }
    progress.abort();
    Ok(objects)
}

/// The log's warnings of what a listing of `name` left out, one line for each kind, naming
/// the first key of it.
pub(super) fn warn_skipped(name: &Path, skipped: &Skipped) {
    let name = name.display();
    let more = |n: usize| match n {
        0 | 1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    if skipped.unsafe_keys > 0 {
        tracing::warn!(
            "{name}: left out {} key(s) that are no safe path (an empty, '.' or '..' component)",
            skipped.unsafe_keys
        );
    }
    if let Some(first) = skipped.shadowed.first() {
        tracing::warn!(
            "{name}: left out the object {} whose name is also a directory's (the directory wins){}",
            first.display(),
            more(skipped.shadowed.len())
        );
    }
    if let Some(first) = skipped.markers.first() {
        tracing::warn!(
            "{name}: left out the folder marker {0}/ (an empty key ending in '/') beside the object {0}, which is the file{1}",
            first.display(),
            more(skipped.markers.len())
        );
    }
}
