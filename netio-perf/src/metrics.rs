//! The figures a run produces, with their units.

use std::time::Duration;

use crate::proto::Report;
use crate::stats::percentile;

/// The unit of a figure, which also says how to print it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds of real time.
    Micros,
    /// Microseconds of the simulator's virtual time.
    VirtualMicros,
    /// Bytes per second of real time (printed as GB/s).
    BytesPerSec,
    /// Bytes per second of virtual time.
    VirtualBytesPerSec,
    /// Events per second of real time.
    PerSec,
    /// Events per second of virtual time.
    VirtualPerSec,
    /// Milliseconds of real time.
    Millis,
    /// Milliseconds of virtual time.
    VirtualMillis,
    /// Bytes.
    Bytes,
    /// A plain count.
    Count,
    /// Seconds of real time.
    Seconds,
}

impl Unit {
    /// The unit as written in JSON.
    pub fn json_name(self) -> &'static str {
        match self {
            Self::Micros => "us",
            Self::VirtualMicros => "virtual_us",
            Self::BytesPerSec => "bytes_per_s",
            Self::VirtualBytesPerSec => "virtual_bytes_per_s",
            Self::PerSec => "per_s",
            Self::VirtualPerSec => "per_virtual_s",
            Self::Millis => "ms",
            Self::VirtualMillis => "virtual_ms",
            Self::Bytes => "bytes",
            Self::Count => "count",
            Self::Seconds => "s",
        }
    }

    /// `value` with its unit, for the table.
    pub fn format(self, value: f64) -> String {
        if !value.is_finite() {
            return "n/a".into();
        }
        match self {
            Self::Micros => format!("{} µs", sig(value)),
            Self::VirtualMicros => format!("{} µs (virtual)", sig(value)),
            Self::BytesPerSec => format!("{} GB/s", sig(value / 1e9)),
            Self::VirtualBytesPerSec => format!("{} GB/s (virtual)", sig(value / 1e9)),
            Self::PerSec => format!("{}/s", count(value)),
            Self::VirtualPerSec => format!("{}/virtual s", count(value)),
            Self::Millis => format!("{} ms", sig(value)),
            Self::VirtualMillis => format!("{} ms (virtual)", sig(value)),
            Self::Count => sig(value),
            Self::Seconds => format!("{} s", sig(value)),
            Self::Bytes => {
                if value.abs() >= 1024.0 * 1024.0 {
                    format!("{} MiB", sig(value / 1048576.0))
                } else if value.abs() >= 1024.0 {
                    format!("{} KiB", sig(value / 1024.0))
                } else {
                    format!("{} B", sig(value))
                }
            }
        }
    }
}

/// Three significant digits (at least the integer part).
fn sig(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A rate with k/M suffix.
fn count(v: f64) -> String {
    if v >= 1e6 {
        format!("{} M", sig(v / 1e6))
    } else if v >= 1e3 {
        format!("{} k", sig(v / 1e3))
    } else {
        sig(v)
    }
}

/// Which way is better for a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Smaller is better (latency, memory).
    Lower,
    /// Larger is better (throughput).
    Higher,
    /// Neither: a fact about the run (its measured time), given without a
    /// ratio.
    Neither,
}

/// A figure's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    /// Key in JSON.
    pub key: &'static str,
    /// Label in the table.
    pub label: &'static str,
    /// Unit.
    pub unit: Unit,
    /// Which way is better.
    pub better: Better,
}

macro_rules! metric {
    ($name:ident, $key:literal, $label:literal, $unit:ident, $better:ident) => {
        #[doc = concat!("`", $key, "`: ", $label, ".")]
        pub const $name: Metric = Metric {
            key: $key,
            label: $label,
            unit: Unit::$unit,
            better: Better::$better,
        };
    };
}

metric!(MEAN, "mean_rtt", "mean round trip", Micros, Lower);
metric!(MEDIAN, "median_rtt", "median round trip", Micros, Lower);
metric!(P99, "p99_rtt", "p99 round trip", Micros, Lower);
metric!(P999, "p999_rtt", "p99.9 round trip", Micros, Lower);
metric!(MAX, "max_rtt", "max round trip", Micros, Lower);
metric!(
    ROUND_TRIPS,
    "round_trips_per_s",
    "round trips",
    PerSec,
    Higher
);
metric!(
    PP_THROUGHPUT,
    "pingpong_bytes_per_s",
    "bytes, both directions",
    BytesPerSec,
    Higher
);
metric!(
    V_MEAN,
    "virtual_mean_rtt",
    "mean round trip",
    VirtualMicros,
    Lower
);
metric!(
    V_MEDIAN,
    "virtual_median_rtt",
    "median round trip",
    VirtualMicros,
    Lower
);
metric!(
    V_P99,
    "virtual_p99_rtt",
    "p99 round trip",
    VirtualMicros,
    Lower
);
metric!(
    V_P999,
    "virtual_p999_rtt",
    "p99.9 round trip",
    VirtualMicros,
    Lower
);
metric!(
    MEASURED,
    "measured_s",
    "measured time per run",
    Seconds,
    Neither
);
metric!(BANDWIDTH, "bandwidth", "bandwidth", BytesPerSec, Higher);
metric!(MESSAGES, "messages_per_s", "messages", PerSec, Higher);
metric!(
    DELIVERIES,
    "messages_per_s",
    "deliveries per real second",
    PerSec,
    Higher
);
metric!(
    V_BANDWIDTH,
    "virtual_bandwidth",
    "bandwidth",
    VirtualBytesPerSec,
    Higher
);
metric!(
    V_MESSAGES,
    "virtual_messages_per_s",
    "messages",
    VirtualPerSec,
    Higher
);

metric!(
    SETUP,
    "setup_time",
    "set-up of all connections",
    Millis,
    Lower
);
metric!(
    V_SETUP,
    "virtual_setup_time",
    "set-up of all connections",
    VirtualMillis,
    Lower
);
metric!(
    RSS_PER_CONN,
    "rss_per_connection",
    "resident memory per connection",
    Bytes,
    Lower
);
metric!(
    RSS_FIRST_HALF,
    "rss_per_connection_first_half",
    "  first half of them",
    Bytes,
    Lower
);
metric!(
    RSS_SECOND_HALF,
    "rss_per_connection_second_half",
    "  second half of them",
    Bytes,
    Lower
);
metric!(
    FDS_PER_CONN,
    "descriptors_per_connection",
    "descriptors per connection",
    Count,
    Lower
);
metric!(
    BUFFERS_PER_CONN,
    "buffer_bytes_per_connection",
    "buffer memory per connection",
    Bytes,
    Lower
);

/// The figures of one run.
pub type Figures = Vec<(Metric, f64)>;

/// The mean of `samples` (ns) in µs.
fn mean_us(samples: &[u64]) -> f64 {
    let sum: u128 = samples.iter().map(|&x| u128::from(x)).sum();
    sum as f64 / samples.len() as f64 / 1e3
}

/// Figures of a ping-pong run: `samples` in ns (measured round trips),
/// `virtual_samples` likewise in virtual time (simulator), `elapsed` the
/// real time of the measured round trips. The mean round trip comes
/// first: it is the headline figure (a transport's stalls show in its
/// mean and tail, not in its median); then median, p99, p99.9 and max.
pub fn pingpong(samples: &mut [u64], virtual_samples: &mut [u64], elapsed: Duration) -> Figures {
    if samples.is_empty() {
        return Vec::new();
    }
    samples.sort_unstable();
    let us = |ns: u64| ns as f64 / 1e3;
    let mut f = vec![
        (MEAN, mean_us(samples)),
        (MEDIAN, us(percentile(samples, 500))),
        (P99, us(percentile(samples, 990))),
        (P999, us(percentile(samples, 999))),
        (MAX, us(*samples.last().unwrap())),
        (
            ROUND_TRIPS,
            samples.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        ),
    ];
    if !virtual_samples.is_empty() {
        virtual_samples.sort_unstable();
        f.push((V_MEAN, mean_us(virtual_samples)));
        f.push((V_MEDIAN, us(percentile(virtual_samples, 500))));
        f.push((V_P99, us(percentile(virtual_samples, 990))));
        f.push((V_P999, us(percentile(virtual_samples, 999))));
    }
    f.push((MEASURED, elapsed.as_secs_f64()));
    f
}

/// The figures of a ping-pong run (`figures`, from [`pingpong`]) that
/// compare with `fi_pingpong`'s, first: the mean round trip as
/// `fi_pingpong` takes it (the measured time over the round trips, which
/// includes the work between one round trip and the next, in place of the
/// mean of the samples) and the bytes of both directions per second; then
/// the others.
pub fn with_means(figures: Figures, size: usize) -> Figures {
    let Some(&(_, per_s)) = figures.iter().find(|(m, _)| *m == ROUND_TRIPS) else {
        return figures;
    };
    let mut f = vec![
        (MEAN, 1e6 / per_s),
        (ROUND_TRIPS, per_s),
        (PP_THROUGHPUT, 2.0 * size as f64 * per_s),
    ];
    f.extend(
        figures
            .into_iter()
            .filter(|(m, _)| *m != ROUND_TRIPS && *m != MEAN),
    );
    f
}

/// Figures of a one-way run (`bw` or `rate`) from the receiver's report;
/// `sim`: the report holds virtual time too.
pub fn one_way(bw: bool, r: &Report, sim: bool) -> Result<Figures, String> {
    if r.measured == 0 || r.elapsed_ns == 0 {
        return Err(format!(
            "the receiver measured nothing ({} messages received, at least 2 after the warm-up are needed)",
            r.received
        ));
    }
    let secs = r.elapsed_ns as f64 / 1e9;
    let mut f = Vec::new();
    if bw {
        f.push((BANDWIDTH, r.bytes as f64 / secs));
        f.push((MESSAGES, r.measured as f64 / secs));
    } else if sim {
        f.push((DELIVERIES, r.measured as f64 / secs));
    } else {
        f.push((MESSAGES, r.measured as f64 / secs));
    }
    if sim && r.virtual_ns > 0 {
        let vs = r.virtual_ns as f64 / 1e9;
        if bw {
            f.push((V_BANDWIDTH, r.bytes as f64 / vs));
        }
        f.push((V_MESSAGES, r.measured as f64 / vs));
    }
    f.push((MEASURED, secs));
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_carry_units() {
        assert_eq!(Unit::Micros.format(12.345), "12.3 µs");
        assert_eq!(Unit::BytesPerSec.format(1.5e9), "1.50 GB/s");
        assert_eq!(Unit::PerSec.format(2_500_000.0), "2.50 M/s");
        assert_eq!(Unit::Bytes.format(2048.0), "2.00 KiB");
        assert_eq!(Unit::Micros.format(f64::NAN), "n/a");
    }

    #[test]
    fn means_come_first_and_follow_from_the_rate() {
        let mut samples = vec![10_000u64; 100];
        let f = with_means(
            pingpong(&mut samples, &mut [], Duration::from_millis(2)),
            64,
        );
        let keys: Vec<_> = f.iter().map(|(m, _)| m.key).collect();
        assert_eq!(
            &keys[..4],
            [
                "mean_rtt",
                "round_trips_per_s",
                "pingpong_bytes_per_s",
                "median_rtt"
            ]
        );
        for once in ["round_trips_per_s", "mean_rtt"] {
            assert_eq!(keys.iter().filter(|k| **k == once).count(), 1);
        }
        // 100 round trips in 2 ms: 20 µs each, 50 k/s, 128 bytes each.
        assert!((f[0].1 - 20.0).abs() < 1e-9);
        assert!((f[1].1 - 50_000.0).abs() < 1e-6);
        assert!((f[2].1 - 6.4e6).abs() < 1e-3);
        assert!(with_means(Vec::new(), 64).is_empty());
    }

    #[test]
    fn pingpong_gives_mean_median_and_tails_mean_first() {
        // 1000 samples: 990 of 10 µs, 9 of 100 µs, 1 of 1000 µs.
        let mut s: Vec<u64> = std::iter::repeat_n(10_000, 990)
            .chain(std::iter::repeat_n(100_000, 9))
            .chain([1_000_000])
            .collect();
        let f = pingpong(&mut s, &mut [], Duration::from_secs(1));
        let get = |k: &str| f.iter().find(|(m, _)| m.key == k).unwrap().1;
        assert_eq!(f[0].0.key, "mean_rtt");
        assert!((get("mean_rtt") - 11.8).abs() < 1e-9, "{f:?}");
        assert_eq!(get("median_rtt"), 10.0);
        assert_eq!(get("p99_rtt"), 10.0);
        assert_eq!(get("p999_rtt"), 100.0);
        assert_eq!(get("max_rtt"), 1000.0);
        assert_eq!(get("measured_s"), 1.0);
    }
}
