//! The benchmark's messages, the same over a netio provider and over the
//! plain TCP baseline (where each is preceded by a 4-byte little-endian
//! length).
//!
//! The first byte of every message is a tag:
//!
//! - `DATA` (0): a measured message; ping-pong messages carry their number
//!   in bytes 1..9 when they are long enough.
//! - `SETUP` (1): the client's first message: what the server does with the
//!   connection (`[1, role, mode]`, padded to 8 bytes, then the number of
//!   warm-up messages as a little-endian u64).
//! - `END` (2): the client sent its last data message.
//! - `REPORT` (3): the receiver's measurement, answering `END`.

use std::time::Duration;

use crate::cli::SendMode;

/// Tag of a measured message.
pub const DATA: u8 = 0;
/// Tag of the set-up message.
pub const SETUP: u8 = 1;
/// Tag of the end message.
pub const END: u8 = 2;
/// Tag of the report message.
pub const REPORT: u8 = 3;

/// What the server does with a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Send every data message back (ping-pong).
    Echo,
    /// Count data messages, answer `END` with a report (bw, rate).
    Sink,
}

/// The set-up message.
pub fn setup(role: Role, mode: SendMode, warmup: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0] = SETUP;
    m[1] = match role {
        Role::Echo => 0,
        Role::Sink => 1,
    };
    m[2] = mode.code();
    m[8..].copy_from_slice(&warmup.to_le_bytes());
    m
}

/// Parses a set-up message.
pub fn parse_setup(m: &[u8]) -> Option<(Role, SendMode, u64)> {
    if m.len() != 16 || m[0] != SETUP {
        return None;
    }
    let role = match m[1] {
        0 => Role::Echo,
        1 => Role::Sink,
        _ => return None,
    };
    let warmup = u64::from_le_bytes(m[8..16].try_into().ok()?);
    Some((role, SendMode::from_code(m[2])?, warmup))
}

/// The end message.
pub fn end() -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0] = END;
    m
}

/// What a receiver measured: data messages and bytes received after the
/// first measured one, and the time from that one to the end message that
/// follows the last.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Data messages received in all (warm-up included).
    pub received: u64,
    /// Data messages received after the first measured one.
    pub measured: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Real time from the first measured message to the end message, in ns.
    pub elapsed_ns: u64,
    /// Virtual time for the same span (simulator), in ns; 0 otherwise.
    pub virtual_ns: u64,
}

impl Report {
    /// Encodes the report message.
    pub fn encode(&self) -> [u8; 48] {
        let mut m = [0u8; 48];
        m[0] = REPORT;
        for (i, v) in [
            self.received,
            self.measured,
            self.bytes,
            self.elapsed_ns,
            self.virtual_ns,
        ]
        .into_iter()
        .enumerate()
        {
            m[8 + i * 8..16 + i * 8].copy_from_slice(&v.to_le_bytes());
        }
        m
    }

    /// Decodes a report message.
    pub fn decode(m: &[u8]) -> Option<Self> {
        if m.len() != 48 || m[0] != REPORT {
            return None;
        }
        let f = |i: usize| u64::from_le_bytes(m[8 + i * 8..16 + i * 8].try_into().unwrap());
        Some(Self {
            received: f(0),
            measured: f(1),
            bytes: f(2),
            elapsed_ns: f(3),
            virtual_ns: f(4),
        })
    }
}

/// Counts data messages at a receiver and times the measured ones.
#[derive(Debug)]
pub struct SinkCounter {
    warmup: u64,
    report: Report,
    first: Option<std::time::Instant>,
    first_virtual: Option<Duration>,
}

impl SinkCounter {
    /// A counter that starts timing at data message number `warmup`
    /// (counting from 0).
    pub fn new(warmup: u64) -> Self {
        Self {
            warmup,
            report: Report::default(),
            first: None,
            first_virtual: None,
        }
    }

    /// Counts one data message of `len` bytes; `virtual_now` is the
    /// simulator's clock, when there is one. Only the first measured message
    /// reads the clocks.
    #[inline]
    pub fn data(&mut self, len: usize, virtual_now: impl FnOnce() -> Option<Duration>) {
        let n = self.report.received;
        self.report.received += 1;
        if n < self.warmup {
            return;
        }
        if self.first.is_none() {
            self.first = Some(std::time::Instant::now());
            self.first_virtual = virtual_now();
        } else {
            self.report.measured += 1;
            self.report.bytes += len as u64;
        }
    }

    /// Counts a data message of `len` bytes as [`data`](Self::data) does,
    /// unless it is the first measured one, which reads the clocks: then
    /// nothing is counted and the answer is `false` (call `data`).
    #[inline]
    pub fn count(&mut self, len: usize) -> bool {
        let n = self.report.received;
        if n >= self.warmup && self.first.is_none() {
            return false;
        }
        self.report.received = n + 1;
        if n >= self.warmup {
            self.report.measured += 1;
            self.report.bytes += len as u64;
        }
        true
    }

    /// The end message arrived (right behind the last data message): the
    /// measured span ends now.
    pub fn end(&mut self, virtual_now: impl FnOnce() -> Option<Duration>) {
        if let Some(t0) = self.first {
            self.report.elapsed_ns = t0.elapsed().as_nanos() as u64;
            if let (Some(v0), Some(v)) = (self.first_virtual, virtual_now()) {
                self.report.virtual_ns = (v - v0).as_nanos() as u64;
            }
        }
    }

    /// The measurement so far.
    pub fn report(&self) -> Report {
        self.report
    }
}

/// Fills `buf` with a data message of `size` bytes.
pub fn data_message(buf: &mut Vec<u8>, size: usize) {
    buf.clear();
    buf.extend((0..size).map(|j| (j as u8).wrapping_mul(31) | 1));
    buf[0] = DATA;
}

/// Writes the ping number `i` into a data message, where it fits.
#[inline]
pub fn set_seq(buf: &mut [u8], i: u64) {
    if buf.len() >= 9 {
        buf[1..9].copy_from_slice(&i.to_le_bytes());
    }
}

/// Whether `echo` answers ping `i` of `size` bytes (`check_seq`: the
/// number is compared too).
#[inline]
pub fn echo_matches(echo: &[u8], size: usize, i: u64, check_seq: bool) -> bool {
    if echo.len() != size || echo[0] != DATA {
        return false;
    }
    !check_seq || size < 9 || echo[1..9] == i.to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_a_message_in_line_gives_the_report_data_gives_and_leaves_it_the_first_measured_one()
    {
        let (mut a, mut b) = (SinkCounter::new(3), SinkCounter::new(3));
        let mut declined = Vec::new();
        for i in 0..10usize {
            a.data(10 + i, || None);
            if !b.count(10 + i) {
                declined.push(i);
                b.data(10 + i, || None);
            }
        }
        assert_eq!(
            declined,
            vec![3],
            "only the first measured one reads the clock"
        );
        let (ra, rb) = (a.report(), b.report());
        assert_eq!(
            (rb.received, rb.measured, rb.bytes),
            (ra.received, ra.measured, ra.bytes)
        );
        assert_eq!((rb.received, rb.measured), (10, 6));
        assert_eq!(rb.bytes, (14..20).sum::<usize>() as u64);
    }

    #[test]
    fn messages_round_trip() {
        for role in [Role::Echo, Role::Sink] {
            for mode in [SendMode::Buffered, SendMode::ZeroCopy, SendMode::Copy] {
                assert_eq!(parse_setup(&setup(role, mode, 9)), Some((role, mode, 9)));
            }
        }
        let r = Report {
            received: 1,
            measured: 2,
            bytes: 3,
            elapsed_ns: 4,
            virtual_ns: 5,
        };
        assert_eq!(Report::decode(&r.encode()), Some(r));
        assert_eq!(Report::decode(&end()), None);
    }

    #[test]
    fn sink_counts_after_warmup() {
        let mut c = SinkCounter::new(2);
        for _ in 0..5 {
            c.data(10, || None);
        }
        c.end(|| None);
        let r = c.report();
        assert_eq!((r.received, r.measured, r.bytes), (5, 2, 20));
    }

    #[test]
    fn echo_check() {
        let mut m = Vec::new();
        data_message(&mut m, 64);
        set_seq(&mut m, 7);
        assert!(echo_matches(&m, 64, 7, true));
        assert!(!echo_matches(&m, 64, 8, true));
        assert!(echo_matches(&m, 64, 8, false));
        assert!(!echo_matches(&m, 63, 7, true));
    }
}
