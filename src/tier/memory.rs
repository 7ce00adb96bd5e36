//! The memory tier: the block cache ([`crate::cache::BlockCache`]) as the first tier of the
//! chain.
//!
//! A hit lends the cached bytes in place (a slice of the arena, or the block's own mapping)
//! for the length of the read: no copy, no reference count for the arena. What the cache is
//! offered follows its policy ([`crate::cache::policy::CachePolicy::admits_prefetch`]): every
//! block a reader fetched; a prefetched block when it arrives if the policy takes guesses,
//! else when its reader takes it from the staging area. In memory, nothing can fail.

use std::sync::Arc;

use super::{DataError, Found, Tier, Want, Why};
use crate::block::Block;
use crate::cache::BlockCache;

impl Tier for BlockCache {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn get(&self, want: &Want<'_>) -> Result<Option<Found<'_>>, DataError> {
        Ok(BlockCache::get(self, &want.key).map(Found::Lent))
    }

    fn admit(&self, want: &Want<'_>, data: &Arc<Block>) -> bool {
        let offered = match want.why {
            Why::Read | Why::Reread | Why::Peer => true,
            Why::Prefetch => self.admits_prefetch(),
            // A policy that took guesses was offered the block when it arrived.
            Why::Claimed => !self.admits_prefetch(),
        };
        offered && self.may_keep(want.rel) && self.insert(want.key, data)
    }

    fn remove(&self, want: &Want<'_>) {
        BlockCache::remove(self, &want.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{CacheConfig, PolicyKind};
    use crate::tier::tests::want;
    use std::num::NonZeroU64;

    fn cache(policy: PolicyKind) -> BlockCache {
        BlockCache::new(CacheConfig {
            policy,
            capacity: 1 << 20,
            ceiling: None,
            block_size: NonZeroU64::new(1 << 16).unwrap(),
        })
        .unwrap()
    }

    fn block(fill: u8) -> Arc<Block> {
        Arc::new(Block::copy_of(&[fill; 100]).unwrap())
    }

    fn held(c: &BlockCache, why: Why) -> Option<u8> {
        match Tier::get(c, &want(1, 100, 0, why)).unwrap()? {
            Found::Lent(bytes) => Some(bytes[0]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_are_admitted_and_guesses_as_the_policy_says() {
        // (policy, admits a prefetched block at arrival, when claimed from staging)
        for (policy, prefetch, claimed) in [
            (PolicyKind::MinIo, true, false),
            (PolicyKind::Lru, false, true),
            (PolicyKind::None, false, false),
        ] {
            for (why, want_kept) in [
                (Why::Read, policy.caches()),
                (Why::Prefetch, prefetch),
                (Why::Claimed, claimed),
            ] {
                let c = cache(policy);
                let kept = c.admit(&want(1, 100, 0, why), &block(7));
                assert_eq!(kept, want_kept, "{policy:?} {why:?}");
                assert_eq!(held(&c, Why::Read), want_kept.then_some(7));
            }
        }
    }

    #[test]
    fn a_removed_block_is_a_miss_and_an_evicting_policy_gets_its_memory_back() {
        // The arena only grows: MinIO still counts the slot; LRU's mapping is gone.
        for (policy, keeps_counting) in [(PolicyKind::MinIo, true), (PolicyKind::Lru, false)] {
            let c = cache(policy);
            let w = want(1, 100, 0, Why::Read);
            assert!(c.admit(&w, &block(1)));
            let used = c.used();
            Tier::remove(&c, &w);
            assert_eq!(held(&c, Why::Read), None, "{policy:?}");
            assert_eq!(c.cached_blocks(), 0);
            let want_used = if keeps_counting { used } else { 0 };
            assert_eq!(c.used(), want_used, "{policy:?}");
            Tier::remove(&c, &w);
        }
    }
}
