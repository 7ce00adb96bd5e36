//! Which member of a cluster owns a file: rendezvous (highest-random-weight) hashing of the
//! file's path, relative to the dataset root, over the live members.
//!
//! Every member weighs every (member, path) pair with the same hash and the heaviest member
//! owns the path: members that see the same member set agree on every owner with no
//! coordination and no table. When a member leaves, only the paths it owned move (each to the
//! member that weighed second for it); when one joins, only the paths it now weighs heaviest
//! for move, to it: about 1/N of them. Nothing else changes hands, so the other members' caches
//! stay valid (Thaler and Ravishankar, 1998).
//!
//! The weight is 64-bit xxh3 of the member's name, a zero byte and the path: the same on every
//! machine, build and Rust version (std's `DefaultHasher` promises none of that), and fast
//! (tens of nanoseconds for a path; a lookup costs one weight per member).

use xxhash_rust::xxh3::Xxh3;

/// The weight of `member` for `path` (higher wins).
pub fn weight(member: &str, path: &[u8]) -> u64 {
    let mut h = Xxh3::new();
    h.update(member.as_bytes());
    h.update(&[0]);
    h.update(path);
    h.digest()
}

/// The index in `members` of the owner of `path`: the member of highest weight, the greater
/// name of two equal weights (names are distinct; equal weights are a 2^-64 chance). None if
/// there are no members.
pub fn owner<S: AsRef<str>>(members: &[S], path: &[u8]) -> Option<usize> {
    members
        .iter()
        .enumerate()
        .max_by(|(_, a), (_, b)| {
            let (a, b) = (a.as_ref(), b.as_ref());
            (weight(a, path), a).cmp(&(weight(b, path), b))
        })
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("train/c{:03}/f{i:07}.jpg", i % 1000).into_bytes())
            .collect()
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn every_member_computes_the_same_owner_whatever_the_order_it_lists_members_in() {
        let members = names(5);
        let mut shuffled = members.clone();
        shuffled.reverse();
        shuffled.swap(0, 2);
        for p in paths(2000) {
            let a = &members[owner(&members, &p).unwrap()];
            let b = &shuffled[owner(&shuffled, &p).unwrap()];
            assert_eq!(a, b);
        }
        assert_eq!(owner::<String>(&[], b"x"), None);
        // The weights are fixed forever: a member built today and one built next year agree.
        assert_eq!(weight("node-0", b"a/b.jpg"), weight("node-0", b"a/b.jpg"));
        assert_ne!(weight("node-0", b"a/b.jpg"), weight("node-1", b"a/b.jpg"));
        assert_ne!(
            weight("node-0", b"ab"),
            weight("node-0a", b"b"),
            "name and path are apart"
        );
    }

    #[test]
    fn paths_spread_evenly_over_the_members() {
        let members = names(3);
        let mut count = [0usize; 3];
        let all = paths(30_000);
        for p in &all {
            count[owner(&members, p).unwrap()] += 1;
        }
        for c in count {
            // 10,000 expected; a binomial's standard deviation here is about 82.
            assert!((9_600..=10_400).contains(&c), "{count:?}");
        }
    }

    #[test]
    fn a_member_leaving_or_joining_moves_only_its_own_share() {
        let all = paths(30_000);
        let four = names(4);
        let three = &four[..3];
        let before: Vec<&String> = all
            .iter()
            .map(|p| &three[owner(three, p).unwrap()])
            .collect();
        // node-3 joins: a path moves only to it, and about a quarter move.
        let mut moved = 0;
        for (p, old) in all.iter().zip(&before) {
            let new = &four[owner(&four, p).unwrap()];
            if new != *old {
                assert_eq!(new, "node-3", "{}", String::from_utf8_lossy(p));
                moved += 1;
            }
        }
        assert!((7_100..=7_900).contains(&moved), "{moved} of 30,000 moved");
        // node-1 leaves the three: only its paths move, to the two others.
        let two = ["node-0".to_string(), "node-2".to_string()];
        for (p, old) in all.iter().zip(&before) {
            let new = &two[owner(&two, p).unwrap()];
            if *old != "node-1" {
                assert_eq!(new, *old);
            }
        }
    }
}
