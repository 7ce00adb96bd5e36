//! Merges concurrent fetches of the same key into one (foyer's `inflight.rs` idea): the first
//! caller of a key starts the fetch, later callers wait for its result. The key stays in
//! flight until its waiters have run, and a caller that comes meanwhile gets the result
//! after them, without a fetch of its own: a waiter that puts the result somewhere (the
//! prefetcher's staging area) has done so before the key leaves flight, and before a later
//! caller that takes it from there (a reader that discards the staged copy of what it read).
//! A caller that looked there just before that and missed starts a fetch of its own, so the
//! fetcher looks there once more when a caller starts one (`landed` in
//! [`super::fetch::Fetcher::fetch`]).

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;

/// A caller waiting for a key's result.
pub type Waiter<V> = Box<dyn FnOnce(V) + Send>;

/// A fetch in flight: its waiters and whether a fetch reads it yet ([`Inflight::begin`]),
/// or its result while they run, with the callers that came meanwhile.
enum State<V> {
    Waiting(Vec<Waiter<V>>, bool),
    Done(V, Vec<Waiter<V>>),
}

/// Fetches in flight, by key.
pub struct Inflight<K, V> {
    waiting: Mutex<HashMap<K, State<V>>>,
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
            Some(State::Waiting(list, _)) => {
                list.push(waiter);
                false
            }
            Some(State::Done(_, late)) => {
                late.push(waiter);
                false
            }
            None => {
                waiting.insert(key.clone(), State::Waiting(vec![waiter], false));
                true
            }
        }
    }

    /// Claims `key` for a fetch with no waiter yet, if none is in flight: returns true if
    /// the caller must now fetch it and call [`Inflight::complete`] (the rest of a part, read
    /// with the block asked for).
    pub fn claim(&self, key: &K) -> bool {
        let mut waiting = self.waiting.lock();
        if waiting.contains_key(key) {
            return false;
        }
        waiting.insert(key.clone(), State::Waiting(Vec::new(), false));
        true
    }

    /// The fetch started for `key` begins to read it: true unless another fetch took `key`
    /// first ([`Inflight::take`]) and will complete it.
    pub fn begin(&self, key: &K) -> bool {
        match self.waiting.lock().get_mut(key) {
            Some(State::Waiting(_, begun)) => !std::mem::replace(begun, true),
            _ => false,
        }
    }

    /// Takes `key` into a fetch of another key (the rest of a part, read with the block asked
    /// for): true if no fetch of `key` was in flight, or one was started for it and has not
    /// begun to read ([`Inflight::begin`] then says false); the caller must then fetch it and
    /// call [`Inflight::complete`]. With `asked`, only a key whose fetch was started is taken.
    pub fn take(&self, key: &K, asked: bool) -> bool {
        let mut waiting = self.waiting.lock();
        match waiting.get_mut(key) {
            None if asked => false,
            None => {
                waiting.insert(key.clone(), State::Waiting(Vec::new(), true));
                true
            }
            Some(State::Waiting(_, begun)) => !std::mem::replace(begun, true),
            Some(State::Done(..)) => false,
        }
    }

    /// True if callers wait for `key`'s fetch.
    pub fn awaited(&self, key: &K) -> bool {
        match self.waiting.lock().get(key) {
            Some(State::Waiting(list, _)) => !list.is_empty(),
            Some(State::Done(..)) => true,
            None => false,
        }
    }

    /// True if a fetch of `key` is in flight.
    pub fn contains(&self, key: &K) -> bool {
        self.waiting.lock().contains_key(key)
    }

    /// Ends the fetch of `key`: every waiter receives `value` (outside the lock), then those
    /// that joined meanwhile, and then the key is no longer in flight.
    pub fn complete(&self, key: &K, value: V) {
        let mut waiters = match self
            .waiting
            .lock()
            .insert(key.clone(), State::Done(value.clone(), Vec::new()))
        {
            Some(State::Waiting(list, _)) => list,
            _ => Vec::new(),
        };
        loop {
            for w in waiters {
                w(value.clone());
            }
            let mut waiting = self.waiting.lock();
            match waiting.get_mut(key) {
                Some(State::Done(_, late)) if !late.is_empty() => {
                    waiters = std::mem::take(late);
                }
                _ => {
                    waiting.remove(key);
                    return;
                }
            }
        }
    }

    /// Fetches in flight.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.lock().len()
    }

    /// True if nothing is in flight.
    #[cfg(test)]
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

    #[test]
    fn a_caller_that_comes_while_the_waiters_run_gets_the_result_after_them() {
        let inflight: Arc<Inflight<u32, u32>> = Arc::new(Inflight::default());
        // got: the late caller's value; done: the first waiter finished.
        let (got, done) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (again, seen, first_done) = (inflight.clone(), got.clone(), done.clone());
        assert!(inflight.join(
            &7,
            Box::new(move |_| {
                // The first waiter runs: the key is still in flight, and a newcomer joins.
                assert!(again.contains(&7));
                let (seen, after) = (seen.clone(), first_done.clone());
                assert!(!again.join(
                    &7,
                    Box::new(move |v| {
                        assert_eq!(after.load(Ordering::Relaxed), 1, "after the first");
                        seen.store(v, Ordering::Relaxed);
                    })
                ));
                first_done.store(1, Ordering::Relaxed);
            }),
        ));
        inflight.complete(&7, 10);
        assert_eq!(got.load(Ordering::Relaxed), 10);
        assert!(inflight.is_empty());
    }

    #[test]
    fn a_fetch_not_begun_is_taken_by_another_and_one_begun_is_not() {
        let inflight: Inflight<u32, u32> = Inflight::default();
        let got = Arc::new(AtomicU32::new(0));
        let seen = got.clone();
        // Block 1's fetch was started for a reader but has not begun: a part's run takes it,
        // the reader gets the run's bytes, and the fetch, beginning, finds it taken.
        assert!(inflight.join(&1, Box::new(move |v| seen.store(v, Ordering::Relaxed))));
        assert!(inflight.take(&1, true));
        assert!(!inflight.begin(&1));
        // Block 2's fetch began first: no run takes it, and a second take is refused too.
        assert!(inflight.join(&2, Box::new(|_| {})));
        assert!(inflight.begin(&2));
        assert!(!inflight.take(&2, false));
        // Block 3 nobody fetched: a run takes it unless only blocks asked for are taken, and
        // once taken, nobody else may.
        assert!(!inflight.take(&3, true));
        assert!(inflight.take(&3, false));
        assert!(!inflight.take(&3, false));
        inflight.complete(&1, 11);
        assert_eq!(got.load(Ordering::Relaxed), 11);
        // A fetch claimed to be started (a part read ahead) has not begun: it may begin.
        assert!(inflight.claim(&4));
        assert!(inflight.begin(&4));
    }
}
