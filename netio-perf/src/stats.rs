//! Percentiles and medians.

/// The nearest-rank percentile of sorted `samples` at `per_mille`
/// thousandths (500: median, 999: p999): the smallest sample with at least
/// that share of samples at or below it.
pub fn percentile(sorted: &[u64], per_mille: usize) -> u64 {
    assert!(!sorted.is_empty());
    let n = sorted.len();
    let rank = (n * per_mille).div_ceil(1000);
    sorted[rank.clamp(1, n) - 1]
}

/// Median of `values` (mean of the two middle ones for an even count).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Smallest and largest of `values`.
pub fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        })
}

/// A ping-pong client's round-trip samples, taken with one clock read per
/// round trip, right after each ping is sent: the read overlaps the
/// ping's flight instead of lying between an echo's arrival and the next
/// ping, where it would add to every round trip (`fi_pingpong`, the
/// libfabric baseline, reads the clock only at the start and the end).
/// A round trip's sample is the time from its ping's send to the next
/// one's (to its echo's arrival for the last), so the samples add up to
/// the measured time: from the send of the first measured ping (the one
/// after the warm-up) to the last echo.
#[derive(Debug)]
pub struct RoundTrips {
    warmup: u64,
    samples: Vec<u64>,
    start: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
}

impl RoundTrips {
    /// Samples after `warmup` round trips, with room for `reserve`.
    pub fn new(warmup: u64, reserve: usize) -> Self {
        Self {
            warmup,
            samples: Vec::with_capacity(reserve),
            start: None,
            last: None,
        }
    }

    /// Ping `i` (counted from 0, warm-up included) was just sent.
    pub fn sent(&mut self, i: u64) {
        let now = std::time::Instant::now();
        if i == self.warmup {
            self.start = Some(now);
        }
        if let (true, Some(last)) = (i > self.warmup, self.last) {
            self.samples.push(nanos(now - last));
        }
        self.last = Some(now);
    }

    /// From the first measured ping's send to the last ping's (zero before
    /// it): what a run of a set duration checks, without a clock read.
    pub fn measured(&self) -> std::time::Duration {
        match (self.start, self.last) {
            (Some(s), Some(l)) => l - s,
            _ => std::time::Duration::ZERO,
        }
    }

    /// The echo of the last ping sent arrived, the run ends: the samples
    /// and the measured time.
    pub fn finish(mut self) -> (Vec<u64>, std::time::Duration) {
        let now = std::time::Instant::now();
        if let (Some(start), Some(last)) = (self.start, self.last) {
            self.samples.push(nanos(now - last));
            (self.samples, now - start)
        } else {
            (self.samples, std::time::Duration::ZERO)
        }
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_medians() {
        let s: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&s, 500), 500);
        assert_eq!(percentile(&s, 990), 990);
        assert_eq!(percentile(&s, 999), 999);
        assert_eq!(percentile(&s, 1000), 1000);
        assert_eq!(percentile(&[5], 999), 5);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(min_max(&[3.0, 1.0, 2.0]), (1.0, 3.0));
    }

    #[test]
    fn round_trip_samples_add_up_to_the_measured_time_one_per_measured_ping() {
        let mut rt = RoundTrips::new(2, 8);
        for i in 0..7 {
            rt.sent(i);
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        let before = rt.measured();
        let (samples, measured) = rt.finish();
        assert_eq!(samples.len(), 5, "pings 2 to 6 are measured");
        let sum: u64 = samples.iter().sum();
        assert_eq!(u128::from(sum), measured.as_nanos());
        assert!(samples.iter().all(|&s| s >= 50_000), "{samples:?}");
        assert!(before < measured && before >= std::time::Duration::from_micros(200));
    }

    #[test]
    fn no_measured_ping_gives_no_sample() {
        let mut rt = RoundTrips::new(3, 0);
        rt.sent(0);
        rt.sent(1);
        assert_eq!(rt.measured(), std::time::Duration::ZERO);
        let (samples, measured) = rt.finish();
        assert!(samples.is_empty());
        assert_eq!(measured, std::time::Duration::ZERO);
    }
}
