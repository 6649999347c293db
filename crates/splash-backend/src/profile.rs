//! Tables of per-kernel launch counts and seconds (`Gpu::profile_table` under
//! `SPLASH_GPU_PROFILE`) as text, and the part of one table that came after another.

/// A kernel's name, its launches and its seconds.
pub type ProfileRow = (String, u64, f64);

/// `rows` as text: a line per kernel, with its share of their time.
pub fn profile_text(rows: &[ProfileRow]) -> String {
    let total: f64 = rows.iter().map(|r| r.2).sum();
    let mut out = format!(
        "{:<28} {:>9} {:>10} {:>9} {:>6}\n",
        "kernel", "launches", "total ms", "us/launch", "share"
    );
    for (name, n, secs) in rows {
        out += &format!(
            "{name:<28} {n:>9} {:>10.2} {:>9.1} {:>5.1}%\n",
            secs * 1e3,
            secs * 1e6 / *n as f64,
            100.0 * secs / total
        );
    }
    out
}

/// The launches in `after` that `before` (an earlier table of the same run) did not hold, most
/// time first.
pub fn profile_since(before: &[ProfileRow], after: &[ProfileRow]) -> Vec<ProfileRow> {
    let mut rows: Vec<ProfileRow> = after
        .iter()
        .filter_map(|(name, n, secs)| {
            let (n0, s0) = before
                .iter()
                .find(|b| &b.0 == name)
                .map_or((0, 0.0), |b| (b.1, b.2));
            (*n > n0).then(|| (name.clone(), n - n0, secs - s0))
        })
        .collect();
    rows.sort_by(|a, b| b.2.total_cmp(&a.2));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launches_since_an_earlier_table() {
        let before = vec![("a".to_string(), 2, 0.5), ("b".to_string(), 1, 0.1)];
        let after = vec![
            ("a".to_string(), 5, 0.8),
            ("b".to_string(), 1, 0.1),
            ("c".to_string(), 1, 0.4),
        ];
        let since = profile_since(&before, &after);
        assert_eq!(since.len(), 2);
        assert_eq!((since[0].0.as_str(), since[0].1), ("c", 1));
        assert_eq!((since[1].0.as_str(), since[1].1), ("a", 3));
        assert!((since[1].2 - 0.3).abs() < 1e-12);
        let text = profile_text(&since);
        assert_eq!(text.lines().count(), 3, "{text}");
    }
}
