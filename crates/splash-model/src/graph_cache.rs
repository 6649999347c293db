//! Captured CUDA graphs kept by what their pass reads (the target's passes, the draft's
//! blocks): a pass is captured the second time its key comes (a pass that runs once, such as
//! the last token of a prompt restored from the prefix cache, would pay the capture for
//! nothing), replayed while the key keeps coming, and dropped least recently used first.
//! Pure bookkeeping: the caller captures and replays.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::sync::Mutex;

/// What [`GraphCache::take`] found for a key.
pub(crate) enum Found<G> {
    /// The graph captured under the key, taken out: replay it, then [`GraphCache::keep`] it.
    Graph(G),
    /// The key came once before: capture it now (and `keep` it after its first replay).
    Capture,
    /// The key is new (now remembered): run the pass without a graph.
    FirstSighting,
}

/// Graphs `G` by key, most recently used first.
pub(crate) struct GraphCache<G> {
    graphs: Mutex<Vec<(Vec<u64>, G)>>,
    /// Hashes of the last keys met without a graph, most recent first.
    seen: Mutex<Vec<u64>>,
    capacity: usize,
}

impl<G> GraphCache<G> {
    /// Keeps up to `capacity` graphs, and remembers four times as many keys met once.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            graphs: Mutex::new(Vec::new()),
            seen: Mutex::new(Vec::new()),
            capacity,
        }
    }

    /// The graph of `key` (taken out of the cache), or what to do without one.
    pub(crate) fn take(&self, key: &[u64]) -> Found<G> {
        let mut graphs = self.graphs.lock().expect("graph cache lock");
        if let Some(i) = graphs.iter().position(|(k, _)| k == key) {
            return Found::Graph(graphs.remove(i).1);
        }
        let mut seen = self.seen.lock().expect("graph cache lock");
        let hash = key_hash(key);
        if seen.contains(&hash) {
            return Found::Capture;
        }
        seen.insert(0, hash);
        seen.truncate(4 * self.capacity);
        Found::FirstSighting
    }

    /// Puts `graph` back under `key` as the most recently used; the least recently used beyond
    /// the capacity are dropped.
    pub(crate) fn keep(&self, key: Vec<u64>, graph: G) {
        let mut graphs = self.graphs.lock().expect("graph cache lock");
        graphs.insert(0, (key, graph));
        graphs.truncate(self.capacity);
    }
}

/// A hash of a graph's key.
fn key_hash(key: &[u64]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `take` says for `key`, replaying (and keeping) a graph it gives or captures.
    fn step(cache: &GraphCache<u32>, key: &[u64], captures: &mut u32) -> &'static str {
        match cache.take(key) {
            Found::Graph(g) => {
                cache.keep(key.to_vec(), g);
                "replay"
            }
            Found::Capture => {
                *captures += 1;
                cache.keep(key.to_vec(), *captures);
                "capture"
            }
            Found::FirstSighting => "eager",
        }
    }

    /// A key runs eagerly once, is captured the second time and replayed after; the least
    /// recently used graph goes first when the cache is full, and comes back through a
    /// capture (its key is still remembered).
    #[test]
    fn captured_at_the_second_sighting_and_evicted_least_recently_used() {
        let cache = GraphCache::new(2);
        let mut captures = 0;
        let (a, b, c) = ([1, 2], [3], [4, 5, 6]);
        assert_eq!(step(&cache, &a, &mut captures), "eager");
        assert_eq!(step(&cache, &a, &mut captures), "capture");
        assert_eq!(step(&cache, &a, &mut captures), "replay");
        for want in ["eager", "capture", "replay"] {
            assert_eq!(step(&cache, &b, &mut captures), want);
        }
        // a is now the least recently used: c's capture evicts it.
        assert_eq!(step(&cache, &c, &mut captures), "eager");
        assert_eq!(step(&cache, &c, &mut captures), "capture");
        assert_eq!(step(&cache, &b, &mut captures), "replay");
        assert_eq!(step(&cache, &a, &mut captures), "capture");
        assert_eq!(captures, 4);
        // A key taken and not kept (its replay failed) is captured again.
        assert!(matches!(cache.take(&a), Found::Graph(_)));
        assert_eq!(step(&cache, &a, &mut captures), "capture");
    }
}
