//! Merges concurrent fetches of the same key into one (foyer's `inflight.rs` idea): the first
//! caller of a key starts the fetch, later callers wait for its result.

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;

/// A caller waiting for a key's result.
pub type Waiter<V> = Box<dyn FnOnce(V) + Send>;

/// Fetches in flight, by key.
pub struct Inflight<K, V> {
    waiting: Mutex<HashMap<K, Vec<Waiter<V>>>>,
}

impl<K, V> std::fmt::Debug for Inflight<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflight")
            .field("keys", &self.waiting.lock().len())
            .finish()
    }
}

impl<K, V> Default for Inflight<K, V> {
    fn default() -> Self {
        Inflight {
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Inflight<K, V> {
    /// Adds `waiter` for `key`. Returns true if no fetch of `key` was in flight: the caller
    /// must now start one and call [`Inflight::complete`] when it ends.
    pub fn join(&self, key: &K, waiter: Waiter<V>) -> bool {
        let mut waiting = self.waiting.lock();
        match waiting.get_mut(key) {
            Some(list) => {
                list.push(waiter);
                false
            }
            None => {
                waiting.insert(key.clone(), vec![waiter]);
                true
            }
        }
    }

    /// True if a fetch of `key` is in flight.
    pub fn contains(&self, key: &K) -> bool {
        self.waiting.lock().contains_key(key)
    }

    /// Ends the fetch of `key`: every waiter receives `value` (outside the lock).
    pub fn complete(&self, key: &K, value: V) {
        let waiters = self.waiting.lock().remove(key).unwrap_or_default();
        for w in waiters {
            w(value.clone());
        }
    }

    /// Fetches in flight.
    pub fn len(&self) -> usize {
        self.waiting.lock().len()
    }

    /// True if nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn only_the_first_caller_fetches_and_all_get_the_result() {
        let inflight: Inflight<u32, u32> = Inflight::default();
        let sum = Arc::new(AtomicU32::new(0));
        let mut starters = 0;
        for _ in 0..5 {
            let sum = sum.clone();
            if inflight.join(
                &7,
                Box::new(move |v| {
                    sum.fetch_add(v, Ordering::Relaxed);
                }),
            ) {
                starters += 1;
            }
        }
        assert_eq!(starters, 1);
        assert!(inflight.contains(&7));
        inflight.complete(&7, 10);
        assert_eq!(sum.load(Ordering::Relaxed), 50);
        assert!(inflight.is_empty());
        // A new fetch after completion starts afresh.
        assert!(inflight.join(&7, Box::new(|_| {})));
    }
}
