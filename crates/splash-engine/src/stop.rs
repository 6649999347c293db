//! Stop strings over streamed text: text that may begin a stop string is held back until it
//! is known not to.

/// Watches streamed text for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// What to do with a piece of streamed text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopCheck {
    /// Text that can be shown now.
    pub emit: String,
    /// The stop string that ended the text, if one did.
    pub stopped: Option<String>,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Feeds text; returns what may be emitted and whether a stop string was hit (in which
    /// case the text from the stop string on is dropped).
    pub fn push(&mut self, text: &str) -> StopCheck {
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|i| (i, s)))
            .min_by_key(|(i, _)| *i);
        if let Some((i, s)) = first {
            let stop = s.clone();
            let emit = self.held[..i].to_string();
            self.held.clear();
            return StopCheck {
                emit,
                stopped: Some(stop),
            };
        }
        // Hold back the longest tail that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for (end, _) in s.char_indices().skip(1) {
                if end > hold && self.held.ends_with(&s[..end]) {
                    hold = end;
                }
            }
        }
        let cut = self.held.len() - hold;
        let emit = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopCheck {
            emit,
            stopped: None,
        }
    }

    /// Releases held-back text at the end of the stream.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_string_split_across_pieces() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("hello </e").emit, "hello ");
        let c = m.push("nd> more");
        assert_eq!(
            c,
            StopCheck {
                emit: String::new(),
                stopped: Some("</end>".into())
            }
        );
    }

    #[test]
    fn false_prefix_is_released() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        assert_eq!(m.push("ST").emit, "");
        assert_eq!(m.push("ART").emit, "START");
        assert_eq!(m.push("S").emit, "");
        assert_eq!(m.finish(), "S");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = StopMatcher::new(vec!["b".into(), "abc".into()]);
        let c = m.push("xabc");
        assert_eq!(c.emit, "x");
        assert_eq!(c.stopped.as_deref(), Some("abc"));
    }
}
