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
}
