//! Stored responses for `previous_response_id`, `GET` and `DELETE`: in memory, least recently
//! used evicted first once their total size passes a byte limit.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

/// A response and the whole conversation that led to it (chat messages, output included).
#[derive(Clone)]
pub struct Stored {
    pub response: Value,
    pub messages: Vec<Value>,
    bytes: usize,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Stored>,
    /// Least recently used first.
    order: VecDeque<String>,
    bytes: usize,
}

/// The in-memory response store.
pub struct ResponseStore {
    limit: usize,
    inner: Mutex<Inner>,
}

impl ResponseStore {
    /// A store holding at most `limit` bytes (as serialised JSON).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores a response, evicting the least recently used ones beyond the limit.
    pub fn put(&self, id: String, response: Value, messages: Vec<Value>) {
        let bytes = response.to_string().len()
            + messages.iter().map(|m| m.to_string().len()).sum::<usize>();
        let mut g = self.lock();
        if let Some(old) = g.map.remove(&id) {
            g.bytes -= old.bytes;
            g.order.retain(|k| k != &id);
        }
        g.bytes += bytes;
        g.order.push_back(id.clone());
        g.map.insert(
            id,
            Stored {
                response,
                messages,
                bytes,
            },
        );
        while g.bytes > self.limit && g.order.len() > 1 {
            let Some(oldest) = g.order.pop_front() else {
                break;
            };
            if let Some(s) = g.map.remove(&oldest) {
                g.bytes -= s.bytes;
            }
        }
    }

    /// A stored response (and marks it recently used).
    pub fn get(&self, id: &str) -> Option<Stored> {
        let mut g = self.lock();
        let s = g.map.get(id)?.clone();
        g.order.retain(|k| k != id);
        g.order.push_back(id.to_string());
        Some(s)
    }

    /// Removes a response; false if it was not stored.
    pub fn delete(&self, id: &str) -> bool {
        let mut g = self.lock();
        match g.map.remove(id) {
            Some(s) => {
                g.bytes -= s.bytes;
                g.order.retain(|k| k != id);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn least_recently_used_goes_first() {
        let store = ResponseStore::new(200);
        for id in ["a", "b", "c"] {
            store.put(id.into(), json!({"id": id, "pad": "x".repeat(40)}), vec![]);
        }
        assert!(store.get("a").is_some()); // a is now the most recent
        store.put(
            "d".into(),
            json!({"id": "d", "pad": "x".repeat(40)}),
            vec![],
        );
        assert!(store.get("b").is_none(), "b was the least recently used");
        assert!(store.get("a").is_some() && store.get("d").is_some());
        assert!(store.delete("a") && !store.delete("a"));
    }
}
