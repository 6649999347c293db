//! Token sequences in a radix tree: the stored sequences that are prefixes of a prompt, found
//! in one walk down the prompt, however many sequences are stored.

use std::collections::HashMap;

/// A radix tree over token ids: each edge carries a run of tokens, each node may hold the value
/// of the sequence that ends there. Nodes live in an arena; removed ones are reused.
pub(crate) struct TokenTrie<V> {
    nodes: Vec<Node<V>>,
    free: Vec<usize>,
}

struct Node<V> {
    /// The tokens on the edge from the parent (empty for the root).
    edge: Vec<u32>,
    parent: usize,
    /// Children by the first token of their edge.
    children: HashMap<u32, usize>,
    value: Option<V>,
}

impl<V> Default for Node<V> {
    fn default() -> Self {
        Self {
            edge: Vec::new(),
            parent: ROOT,
            children: HashMap::new(),
            value: None,
        }
    }
}

const ROOT: usize = 0;

impl<V: Copy> Default for TokenTrie<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V: Copy> TokenTrie<V> {
    pub fn new() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
        }
    }

    /// Stores `value` for `tokens` (replacing the one there).
    pub fn insert(&mut self, tokens: &[u32], value: V) {
        let mut node = ROOT;
        let mut rest = tokens;
        while let Some(&first) = rest.first() {
            let Some(&child) = self.nodes[node].children.get(&first) else {
                let leaf = self.alloc(rest.to_vec(), node);
                self.nodes[node].children.insert(first, leaf);
                node = leaf;
                break;
            };
            let edge = &self.nodes[child].edge;
            let common = edge.iter().zip(rest).take_while(|(a, b)| a == b).count();
            if common < edge.len() {
                // Split the edge: a new node for the common part, the child below it.
                let head = edge[..common].to_vec();
                let mid = self.alloc(head, node);
                let tail = self.nodes[child].edge.split_off(common);
                self.nodes[child].edge = tail;
                self.nodes[child].parent = mid;
                let child_first = self.nodes[child].edge[0];
                self.nodes[mid].children.insert(child_first, child);
                self.nodes[node].children.insert(first, mid);
                node = mid;
            } else {
                node = child;
            }
            rest = &rest[common..];
        }
        self.nodes[node].value = Some(value);
    }

    /// Removes the value of `tokens` and returns it; nodes left without a value or children go.
    pub fn remove(&mut self, tokens: &[u32]) -> Option<V> {
        let node = self.find(tokens)?;
        let value = self.nodes[node].value.take();
        self.prune(node);
        value
    }

    /// Every stored sequence that is a prefix of `prompt` (the empty one included), as
    /// (length, value), shortest first.
    pub fn prefixes(&self, prompt: &[u32]) -> Vec<(usize, V)> {
        let mut out = Vec::new();
        let (mut node, mut depth) = (ROOT, 0);
        loop {
            if let Some(v) = self.nodes[node].value {
                out.push((depth, v));
            }
            let Some(&child) = prompt
                .get(depth)
                .and_then(|t| self.nodes[node].children.get(t))
            else {
                return out;
            };
            let edge = &self.nodes[child].edge;
            if !prompt[depth..].starts_with(edge) {
                return out;
            }
            depth += edge.len();
            node = child;
        }
    }

    /// The value of exactly `tokens`.
    pub fn get(&self, tokens: &[u32]) -> Option<V> {
        self.find(tokens).and_then(|n| self.nodes[n].value)
    }

    /// Stored sequences.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.nodes.iter().filter(|n| n.value.is_some()).count()
    }

    /// The node where exactly `tokens` ends, if there is one.
    fn find(&self, tokens: &[u32]) -> Option<usize> {
        let (mut node, mut rest) = (ROOT, tokens);
        while let Some(first) = rest.first() {
            let child = *self.nodes[node].children.get(first)?;
            rest = rest.strip_prefix(self.nodes[child].edge.as_slice())?;
            node = child;
        }
        Some(node)
    }

    fn alloc(&mut self, edge: Vec<u32>, parent: usize) -> usize {
        let node = Node {
            edge,
            parent,
            ..Node::default()
        };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Frees `node` and its ancestors while they hold nothing, and merges a valueless node
    /// with its only child, so the tree stays as small as what it stores.
    fn prune(&mut self, mut node: usize) {
        while node != ROOT && self.nodes[node].value.is_none() {
            let children = self.nodes[node].children.len();
            if children > 1 {
                return;
            }
            let parent = self.nodes[node].parent;
            let first = self.nodes[node].edge[0];
            if children == 1 {
                // Merge: the child takes this node's edge in front of its own.
                let (_, &child) = self.nodes[node].children.iter().next().expect("one child");
                let mut edge = std::mem::take(&mut self.nodes[node].edge);
                edge.extend_from_slice(&self.nodes[child].edge);
                self.nodes[child].edge = edge;
                self.nodes[child].parent = parent;
                self.nodes[parent].children.insert(first, child);
                self.release(node);
                return;
            }
            self.nodes[parent].children.remove(&first);
            self.release(node);
            node = parent;
        }
    }

    fn release(&mut self, node: usize) {
        self.nodes[node] = Node::default();
        self.free.push(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random inserts and removes of sequences sharing prefixes, checked against a list: the
    /// prefixes found, and a tree that shrinks back when everything is removed.
    #[test]
    fn prefixes_match_a_plain_list() {
        let mut trie = TokenTrie::new();
        let mut stored: Vec<(Vec<u32>, usize)> = Vec::new();
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % m
        };
        // Sequences from a few stems, so that they share prefixes and split edges.
        let stems: Vec<Vec<u32>> = (0..4)
            .map(|i| (0..30).map(|j| (i * 3 + j % 5) as u32).collect())
            .collect();
        for round in 0..2000 {
            let stem = &stems[next(4) as usize];
            let mut seq = stem[..next(31) as usize].to_vec();
            seq.extend((0..next(4)).map(|_| next(6) as u32));
            if next(3) == 0 {
                let want = stored
                    .iter()
                    .position(|(t, _)| *t == seq)
                    .map(|i| stored.swap_remove(i).1);
                assert_eq!(trie.remove(&seq), want, "round {round}");
            } else {
                trie.insert(&seq, round);
                match stored.iter_mut().find(|(t, _)| *t == seq) {
                    Some(e) => e.1 = round,
                    None => stored.push((seq, round)),
                }
            }
            let mut prompt = stems[next(4) as usize].clone();
            prompt.extend((0..next(6)).map(|_| next(6) as u32));
            let mut want: Vec<(usize, usize)> = stored
                .iter()
                .filter(|(t, _)| prompt.starts_with(t))
                .map(|(t, v)| (t.len(), *v))
                .collect();
            want.sort_unstable();
            assert_eq!(trie.prefixes(&prompt), want, "round {round}");
            assert_eq!(trie.len(), stored.len());
        }
        for (t, v) in std::mem::take(&mut stored) {
            assert_eq!(trie.remove(&t), Some(v));
        }
        assert_eq!(
            trie.nodes.len() - trie.free.len(),
            1,
            "only the root is left"
        );
        assert!(trie.prefixes(&stems[0]).is_empty());
    }
}
