//! A pass's launches as they ran (`SPLASH_TIMELINE`): the blocks' records of their waits
//! (`TimelineRecord` in kernels/common.cuh) paired with the launches the host queued, and the
//! time each launch held the stream.
//!
//! A launch's earliest return from its wait is when the launch before it completed, so the
//! difference between two consecutive launches' returns is the time the first one added to the
//! pass, whatever part of its work overlapped the launch before it.

use std::collections::HashMap;

/// One block's record of its launch (`TimelineRecord` in kernels/common.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockRecord {
    /// The launch's grid id (unique per launch).
    pub grid: u64,
    /// Global timer (ns) when the block arrived at its wait.
    pub arrived: u64,
    /// Global timer (ns) when its wait returned.
    pub released: u64,
    /// Blocks of the launch.
    pub blocks: u32,
    /// The SM the block ran on.
    pub sm: u32,
}

// The kernels write the C struct's 32 bytes: three u64 then two u32, no padding.
const _: () = assert!(std::mem::size_of::<BlockRecord>() == 32);
// SAFETY: repr(C) of integer fields only, with no padding (asserted above): every bit pattern
// is a valid value, and zero is one.
unsafe impl bytemuck::Zeroable for BlockRecord {}
// SAFETY: as above; the type is Copy and 'static.
unsafe impl bytemuck::Pod for BlockRecord {}

/// A launch as the host queued it: the kernel's name and its blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub name: String,
    pub blocks: u32,
}

/// A launch on the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub name: String,
    pub blocks: u32,
    /// Its first block's arrival (ns).
    pub arrived: u64,
    /// Its first return from the wait (ns): the launch before it had completed.
    pub released: u64,
    /// SMs its recorded blocks ran on.
    pub sms: usize,
}

/// The launches of `launches` (in queue order) on the timeline the blocks' `records` give: the
/// records grouped by launch, in the order their waits returned, paired with the last launches
/// queued. An error says where the pairing fails (a launch that recorded nothing, such as a
/// library kernel, or a ring that wrapped).
pub fn spans(records: &[BlockRecord], launches: &[Launch]) -> Result<Vec<Span>, String> {
    let mut grids: HashMap<u64, (Span, Vec<u32>)> = HashMap::new();
    for r in records {
        let (span, sms) = grids.entry(r.grid).or_insert_with(|| {
            let span = Span {
                name: String::new(),
                blocks: r.blocks,
                arrived: r.arrived,
                released: r.released,
                sms: 0,
            };
            (span, Vec::new())
        });
        span.arrived = span.arrived.min(r.arrived);
        span.released = span.released.min(r.released);
        sms.push(r.sm);
    }
    let mut order: Vec<(u64, Span)> = grids
        .into_iter()
        .map(|(grid, (mut span, mut sms))| {
            sms.sort_unstable();
            sms.dedup();
            span.sms = sms.len();
            (grid, span)
        })
        .collect();
    order.sort_by_key(|(grid, s)| (s.released, *grid));
    if order.len() != launches.len() {
        return Err(format!(
            "{} launches recorded against {} queued: a launch without GRID_PROLOGUE, another \
             module's kernels, or more records than the ring holds",
            order.len(),
            launches.len()
        ));
    }
    order
        .into_iter()
        .zip(launches)
        .enumerate()
        .map(|(i, ((_, mut span), launch))| {
            if span.blocks != launch.blocks {
                return Err(format!(
                    "launch {i} ({}) queued {} blocks, its place on the timeline holds a launch \
                     of {}",
                    launch.name, launch.blocks, span.blocks
                ));
            }
            span.name = launch.name.clone();
            Ok(span)
        })
        .collect()
}

/// `spans` as text: a line a launch (its start and the time it held the stream, from the first
/// launch's return), then the time by kernel, most first. The last launch's hold is unknown (no
/// launch after it) and left out of the sums.
pub fn timeline_text(spans: &[Span]) -> String {
    let Some(first) = spans.first() else {
        return "no launches\n".into();
    };
    let t0 = first.released;
    let us = |ns: u64| ns.saturating_sub(t0) as f64 / 1e3;
    let mut out = format!(
        "{:>4} {:<32} {:>6} {:>4} {:>9} {:>9} {:>8}\n",
        "#", "kernel", "blocks", "SMs", "start us", "wait us", "held us"
    );
    let mut by_kernel: Vec<(String, usize, f64)> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        let held = spans
            .get(i + 1)
            .map(|next| next.released.saturating_sub(s.released) as f64 / 1e3);
        out += &format!(
            "{i:>4} {:<32} {:>6} {:>4} {:>9.2} {:>9.2} {:>8}\n",
            s.name,
            s.blocks,
            s.sms,
            us(s.arrived),
            us(s.released),
            held.map_or("-".into(), |h| format!("{h:.2}"))
        );
        if let Some(h) = held {
            match by_kernel.iter_mut().find(|k| k.0 == s.name) {
                Some(k) => {
                    k.1 += 1;
                    k.2 += h;
                }
                None => by_kernel.push((s.name.clone(), 1, h)),
            }
        }
    }
    let total: f64 = by_kernel.iter().map(|k| k.2).sum();
    by_kernel.sort_by(|a, b| b.2.total_cmp(&a.2));
    out += &format!(
        "{:<32} {:>8} {:>10} {:>9} {:>6}\n",
        "kernel", "launches", "held us", "us each", "share"
    );
    for (name, n, held) in &by_kernel {
        out += &format!(
            "{name:<32} {n:>8} {held:>10.2} {:>9.2} {:>5.1}%\n",
            held / *n as f64,
            100.0 * held / total.max(f64::MIN_POSITIVE)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(grid: u64, arrived: u64, released: u64, blocks: u32, sm: u32) -> BlockRecord {
        BlockRecord {
            grid,
            arrived,
            released,
            blocks,
            sm,
        }
    }

    fn launch(name: &str, blocks: u32) -> Launch {
        Launch {
            name: name.into(),
            blocks,
        }
    }

    #[test]
    fn records_pair_with_the_queued_launches_in_the_order_their_waits_returned() {
        // Grid 9 (two blocks) started early but waited for grid 7; grid 8 came last.
        let records = [
            record(9, 1_200, 2_000, 2, 3),
            record(7, 1_000, 1_000, 1, 0),
            record(9, 1_100, 2_100, 2, 4),
            record(8, 2_500, 5_000, 1, 0),
        ];
        let queued = [launch("norm", 1), launch("gemv", 2), launch("route", 1)];
        let spans = spans(&records, &queued).unwrap();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["norm", "gemv", "route"]);
        assert_eq!(
            (spans[1].arrived, spans[1].released, spans[1].sms),
            (1_100, 2_000, 2)
        );
        let text = timeline_text(&spans);
        // norm held 1.00 us (its successor returned at 2,000 ns), gemv 3.00, route unknown.
        assert!(text.contains(" 1.00\n"), "{text}");
        assert!(text.contains(" 3.00\n"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("gemv") && l.contains("75.0%")),
            "{text}"
        );
    }

    #[test]
    fn a_launch_that_recorded_nothing_or_another_shape_is_an_error() {
        let records = [record(1, 0, 10, 1, 0), record(2, 5, 20, 4, 1)];
        let missing = spans(
            &records,
            &[launch("a", 1), launch("lib", 2), launch("b", 4)],
        );
        assert!(missing
            .unwrap_err()
            .contains("2 launches recorded against 3 queued"));
        let shape = spans(&records, &[launch("a", 1), launch("b", 8)]);
        assert!(shape.unwrap_err().contains("launch 1 (b) queued 8 blocks"));
    }
}
