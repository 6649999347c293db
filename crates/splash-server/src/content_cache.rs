//! A cache keyed by the digest of what was sent (agents resend every image and document each
//! turn), the least recently used entry dropped first.

use std::collections::{HashMap, VecDeque};

/// Values by a 32-byte content digest, within a byte budget and an entry count.
pub struct ContentCache<V> {
    entries: HashMap<[u8; 32], (V, usize)>,
    order: VecDeque<[u8; 32]>,
    bytes: usize,
    max_bytes: usize,
    max_entries: usize,
}

impl<V: Clone> ContentCache<V> {
    /// An empty cache holding at most `max_bytes` (as sized on insert) in `max_entries`.
    pub fn new(max_bytes: usize, max_entries: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            bytes: 0,
            max_bytes,
            max_entries,
        }
    }

    /// The value of `digest`, now the most recently used.
    pub fn get(&mut self, digest: &[u8; 32]) -> Option<V> {
        let hit = self.entries.get(digest)?.0.clone();
        self.order.retain(|d| d != digest);
        self.order.push_back(*digest);
        Some(hit)
    }

    /// Keeps `value` of `size` bytes under `digest`, dropping the least recently used entries
    /// to make room; a value larger than the whole budget is not kept.
    pub fn insert(&mut self, digest: [u8; 32], value: V, size: usize) {
        if size > self.max_bytes || self.entries.contains_key(&digest) {
            return;
        }
        while self.bytes + size > self.max_bytes || self.entries.len() >= self.max_entries {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some((_, s)) = self.entries.remove(&old) {
                self.bytes -= s;
            }
        }
        self.bytes += size;
        self.order.push_back(digest);
        self.entries.insert(digest, (value, size));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_the_least_recently_used_past_either_bound() {
        let mut c = ContentCache::new(10, 3);
        c.insert([1; 32], 'a', 4);
        c.insert([2; 32], 'b', 4);
        assert_eq!(c.get(&[1; 32]), Some('a'));
        c.insert([3; 32], 'c', 4); // 12 bytes: b, the least recently used, goes
        assert_eq!(c.get(&[2; 32]), None);
        assert_eq!(c.get(&[1; 32]), Some('a'));
        c.insert([4; 32], 'd', 1);
        c.insert([5; 32], 'e', 1); // four entries: c goes
        assert_eq!(c.get(&[3; 32]), None);
        c.insert([6; 32], 'f', 11); // larger than the budget: not kept
        assert_eq!(c.get(&[6; 32]), None);
        assert_eq!(c.get(&[5; 32]), Some('e'));
    }
}
