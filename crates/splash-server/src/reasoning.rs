//! Splits generated text into reasoning and answer at the template's think markers, as it
//! streams: a marker split across two pieces is held back until it is complete.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// A piece of output, separated.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Streaming reasoning/content splitter.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    in_reasoning: bool,
    /// Text not yet released: it may be the start of a marker.
    held: String,
    /// Nothing of the current section was released yet (leading newlines are trimmed).
    section_start: bool,
}

impl ReasoningSplitter {
    /// `starts_in_reasoning`: the prompt ends inside an open `<think>` block.
    pub fn new(starts_in_reasoning: bool) -> Self {
        Self {
            in_reasoning: starts_in_reasoning,
            held: String::new(),
            section_start: true,
        }
    }

    /// True when the rendered prompt leaves a `<think>` block open for the model to continue.
    pub fn prompt_opens_reasoning(prompt: &str) -> bool {
        match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
            (Some(o), Some(c)) => o > c,
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// Feeds generated text; returns what can be released now.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            let marker = if self.in_reasoning { CLOSE } else { OPEN };
            if let Some(i) = self.held.find(marker) {
                let before = self.held[..i].to_string();
                self.release(&before, &mut out);
                self.held.drain(..i + marker.len());
                // The model may open a block itself only at the very start of its answer.
                let opens_at_start = out.content.is_empty() && self.section_start;
                if !self.in_reasoning && !opens_at_start {
                    // A literal "<think>" inside the answer: keep it as content.
                    self.release(marker, &mut out);
                    continue;
                }
                self.in_reasoning = !self.in_reasoning;
                self.section_start = true;
                continue;
            }
            // Keep back a tail that could start the marker.
            let keep = (1..marker.len())
                .rev()
                .find(|&n| self.held.ends_with(&marker[..n]))
                .unwrap_or(0);
            let cut = self.held.len() - keep;
            let now = self.held[..cut].to_string();
            self.held.drain(..cut);
            self.release(&now, &mut out);
            return out;
        }
    }

    /// Releases whatever is held at the end of generation.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let rest = std::mem::take(&mut self.held);
        self.release(&rest, &mut out);
        out
    }

    fn release(&mut self, text: &str, out: &mut Split) {
        let text = if self.section_start {
            text.trim_start_matches('\n')
        } else {
            text
        };
        if text.is_empty() {
            return;
        }
        self.section_start = false;
        if self.in_reasoning {
            out.reasoning.push_str(text);
        } else {
            out.content.push_str(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start: bool, pieces: &[&str]) -> Split {
        let mut s = ReasoningSplitter::new(start);
        let mut all = Split::default();
        for p in pieces {
            let o = s.push(p);
            all.reasoning += &o.reasoning;
            all.content += &o.content;
        }
        let o = s.finish();
        all.reasoning += &o.reasoning;
        all.content += &o.content;
        all
    }

    #[test]
    fn split_at_close_marker_across_pieces() {
        let r = run(
            true,
            &[
                "\nLet me think",
                ". Done.\n</th",
                "ink>\n\nThe answer",
                " is 4.",
            ],
        );
        assert_eq!(r.reasoning, "Let me think. Done.\n");
        assert_eq!(r.content, "The answer is 4.");
    }

    #[test]
    fn thinking_off_is_all_content_and_model_opened_block_is_split() {
        assert_eq!(run(false, &["Hello", " world"]).content, "Hello world");
        let r = run(false, &["<think>\nhmm\n</think>\n\nHi"]);
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("hmm\n", "Hi"));
        let r = run(false, &["Use <think> tags"]);
        assert_eq!(r.content, "Use <think> tags");
    }

    #[test]
    fn unfinished_reasoning_stays_reasoning() {
        let r = run(true, &["still thinking </thi"]);
        assert_eq!(r.reasoning, "still thinking </thi");
        assert!(r.content.is_empty());
    }

    #[test]
    fn prompt_detection() {
        assert!(ReasoningSplitter::prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!ReasoningSplitter::prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!ReasoningSplitter::prompt_opens_reasoning("plain"));
    }
}
