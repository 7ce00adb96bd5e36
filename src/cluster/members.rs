//! Who is in the cluster now: the member set ownership is hashed over, fixed (`--peers`) or
//! kept up to date from etcd ([`super::etcd`]).
//!
//! A [`View`] is one member set; [`Membership`] holds the current one, which the peer tier,
//! the cache's ownership filter and the peer server read at each use. A member always counts itself in: if its own registration lapses (etcd
//! unreachable for longer than the lease), it goes on caching what it would own and the others
//! stop asking it, which costs reads of the source, never wrong bytes. Members that see
//! different sets for a moment (one joined, and the news has not reached every member yet)
//! disagree on the owners of the files that move, about 1/N of them: a read asks a member that
//! may not cache the file, which reads the source for it once, as it would for its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use super::owner::owner;
use super::wire::members_digest;

/// One member set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    /// The members' advertised addresses (`host:port`), which are their names for ownership:
    /// in the order of `--peers`, or sorted when they come from etcd.
    pub names: Vec<String>,
    /// This member's index in `names`.
    pub me: usize,
    /// [`members_digest`] of `names`.
    pub digest: u64,
}

impl View {
    fn new(names: Vec<String>, me: usize) -> View {
        View {
            digest: members_digest(&names),
            names,
            me,
        }
    }

    /// The index of the owner of `path` (relative to the dataset root).
    pub fn owner(&self, path: &[u8]) -> usize {
        owner(&self.names, path).expect("a view holds its own member")
    }

    /// This member's name.
    pub fn my_name(&self) -> &str {
        &self.names[self.me]
    }
}

/// See the module documentation.
pub struct Membership {
    view: RwLock<Arc<View>>,
    /// Fixed by `--peers`: every member lists the same members in the same order, which peer
    /// requests check ([`super::wire::BlockRequest::members`]).
    fixed: bool,
    /// Changes so far.
    changes: AtomicU64,
}

impl std::fmt::Debug for Membership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("view", &*self.view.read())
            .field("fixed", &self.fixed)
            .finish_non_exhaustive()
    }
}

impl Membership {
    /// The fixed set `names` (`--peers`), of which this member is number `me`.
    pub fn fixed(names: Vec<String>, me: usize) -> Membership {
        Membership::with(View::new(names, me), true)
    }

    /// A set that changes, which holds only `me` (this member's name) until it is told more.
    pub fn dynamic(me: String) -> Membership {
        Membership::with(View::new(vec![me], 0), false)
    }

    fn with(view: View, fixed: bool) -> Membership {
        Membership {
            view: RwLock::new(Arc::new(view)),
            fixed,
            changes: AtomicU64::new(0),
        }
    }

    /// The current view.
    pub fn view(&self) -> Arc<View> {
        self.view.read().clone()
    }

    /// True for a fixed set (`--peers`).
    pub fn is_fixed(&self) -> bool {
        self.fixed
    }

    /// Times the set changed since the mount.
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// True if this member owns the file at `path` (relative to the dataset root).
    pub fn owns(&self, path: &[u8]) -> bool {
        let view = self.view.read();
        view.owner(path) == view.me
    }

    /// From now on the members are `names` (and this member, listed or not). Returns true if
    /// that is a change. A fixed set never changes.
    pub fn set(&self, mut names: Vec<String>) -> bool {
        if self.fixed {
            return false;
        }
        let mut view = self.view.write();
        let me = view.my_name().to_string();
        if !names.contains(&me) {
            names.push(me.clone());
        }
        names.sort();
        names.dedup();
        if names == view.names {
            return false;
        }
        let at = names.iter().position(|n| *n == me).expect("pushed above");
        *view = Arc::new(View::new(names, at));
        self.changes.fetch_add(1, Ordering::Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_dynamic_set_is_sorted_always_holds_this_member_and_counts_only_changes() {
        let m = Membership::dynamic("b:1".into());
        assert_eq!(m.view().names, ["b:1"]);
        assert!(m.owns(b"any/path"), "alone, a member owns everything");
        assert!(m.set(names(&["c:1", "a:1"])));
        let v = m.view();
        assert_eq!(v.names, ["a:1", "b:1", "c:1"]);
        assert_eq!(v.me, 1);
        assert_eq!(v.digest, members_digest(&["a:1", "b:1", "c:1"]));
        assert!(!m.set(names(&["a:1", "c:1", "b:1"])), "the same set");
        assert!(m.set(names(&["a:1"])));
        assert_eq!(m.view().names, ["a:1", "b:1"]);
        assert_eq!(m.changes(), 2);
        // Ownership follows the view: of many paths, about half are b's now.
        let owned = (0..1000)
            .filter(|i| m.owns(format!("f{i}").as_bytes()))
            .count();
        assert!((400..=600).contains(&owned), "{owned}");
    }

    #[test]
    fn a_fixed_set_keeps_its_order_and_never_changes() {
        let m = Membership::fixed(names(&["z:1", "a:1"]), 0);
        assert!(!m.set(names(&["a:1"])));
        assert_eq!(m.view().names, ["z:1", "a:1"]);
        assert_eq!(m.view().my_name(), "z:1");
        assert!(m.is_fixed());
    }
}
