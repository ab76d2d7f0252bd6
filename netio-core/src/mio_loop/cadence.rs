//! When a busy-polling loop reads the clock after its spin callbacks found
//! work.
//!
//! A turn whose spin callbacks found work may have run long (a handler is
//! called from inside the callback), so the loop reads the clock after it
//! and looks at the timers: a flood handed over turn after turn must not
//! hold a due timer back. But a clock read costs about as much as a short
//! turn's work (20–30 ns with a TSC, a system call without one), and in a
//! busy ping-pong every other turn finds a message, so reading it after
//! every such turn puts a clock read on every message's path.
//!
//! [`ClockCadence`] reads it after every turn that found work while those
//! turns are long, and after every second, fourth, … up to every
//! [`MAX_FOUND_TURNS_PER_READ`]th while they are short: each read sees how
//! long the turns since the last one took, doubles the interval when they
//! took less than [`SHORT_FOUND_TURNS`] together and goes back to every
//! turn when they took more. So a timer waits at most one read interval
//! beyond its deadline while turns are short (a few microseconds), and
//! one long turn more than before when they become long.

/// The most turns that found work between two clock reads.
pub(crate) const MAX_FOUND_TURNS_PER_READ: u32 = 16;
/// Turns that found work and took less than this together (nanoseconds,
/// from one clock read to the next) double the interval.
pub(crate) const SHORT_FOUND_TURNS: u64 = 50_000;

/// The read interval, in turns that found work (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct ClockCadence {
    /// Turns that found work since the clock was last read.
    found: u32,
    /// Read after this many (1 to [`MAX_FOUND_TURNS_PER_READ`]).
    every: u32,
}

impl Default for ClockCadence {
    fn default() -> Self {
        Self { found: 0, every: 1 }
    }
}

impl ClockCadence {
    /// A turn found work: `true` when the next turn is to read the clock.
    #[inline]
    pub(crate) fn found_work(&mut self) -> bool {
        self.found += 1;
        self.found >= self.every
    }

    /// The clock was read, `since` nanoseconds after the read before it
    /// (for whatever reason it was read: an idle turn's read restarts the
    /// count too).
    #[inline]
    pub(crate) fn read(&mut self, since: u64) {
        if self.found >= self.every {
            self.every = if since < SHORT_FOUND_TURNS {
                (self.every * 2).min(MAX_FOUND_TURNS_PER_READ)
            } else {
                1
            };
        } else if since >= SHORT_FOUND_TURNS {
            // Read for another reason, after a long stretch.
            self.every = 1;
        }
        self.found = 0;
    }

    #[cfg(test)]
    fn every(&self) -> u32 {
        self.every
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Turns that found work until one asks for the clock.
    fn turns_to_read(c: &mut ClockCadence) -> u32 {
        let mut n = 1;
        while !c.found_work() {
            n += 1;
            assert!(n <= MAX_FOUND_TURNS_PER_READ, "no read after {n} turns");
        }
        n
    }

    #[test]
    fn every_turn_that_found_work_reads_the_clock_at_first() {
        let mut c = ClockCadence::default();
        assert!(c.found_work());
    }

    #[test]
    fn short_turns_double_the_interval_up_to_the_most() {
        let mut c = ClockCadence::default();
        let mut seen = Vec::new();
        for _ in 0..8 {
            let n = turns_to_read(&mut c);
            seen.push(n);
            c.read(1_000);
        }
        assert_eq!(seen, [1, 2, 4, 8, 16, 16, 16, 16]);
    }

    #[test]
    fn long_turns_bring_the_read_back_to_every_turn() {
        let mut c = ClockCadence::default();
        for _ in 0..5 {
            turns_to_read(&mut c);
            c.read(1_000);
        }
        assert_eq!(c.every(), MAX_FOUND_TURNS_PER_READ);
        turns_to_read(&mut c);
        c.read(SHORT_FOUND_TURNS);
        assert_eq!(turns_to_read(&mut c), 1);
    }

    #[test]
    fn a_read_for_another_reason_restarts_the_count() {
        let mut c = ClockCadence::default();
        turns_to_read(&mut c);
        c.read(1_000);
        turns_to_read(&mut c);
        c.read(1_000);
        assert_eq!(c.every(), 4);
        // Three turns, then an idle turn's read: four more before the next.
        for _ in 0..3 {
            assert!(!c.found_work());
        }
        c.read(1_000);
        assert_eq!(turns_to_read(&mut c), 4);
    }

    #[test]
    fn a_long_stretch_seen_by_another_read_brings_the_read_back_to_every_turn() {
        let mut c = ClockCadence::default();
        for _ in 0..4 {
            turns_to_read(&mut c);
            c.read(1_000);
        }
        assert!(!c.found_work());
        c.read(10 * SHORT_FOUND_TURNS);
        assert_eq!(turns_to_read(&mut c), 1);
    }
}
