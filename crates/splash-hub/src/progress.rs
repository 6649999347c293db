//! The download progress bar (stderr; hidden when quiet or not a terminal).

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A byte-count bar with speed and ETA over `total` bytes.
pub(crate) fn bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet || total == 0 || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    bar.set_style(style());
    bar
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template(
        "{bar:30.cyan/blue} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} ETA {eta} {wide_msg}",
    )
    .expect("valid progress template")
    .progress_chars("=> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn style_renders() {
        let bar = ProgressBar::with_draw_target(Some(100), ProgressDrawTarget::hidden());
        bar.set_style(style());
        bar.set_message("model.safetensors");
        bar.inc(50);
        assert_eq!(bar.position(), 50);
        assert!(super::bar(1, true).is_hidden());
    }
}
