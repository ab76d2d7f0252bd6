//! A hash map for keys a process makes itself (connection handles, send
//! keys, operation contexts' addresses, small integers): hashed with one
//! multiplication per integer, where the standard hasher's SipHash costs
//! more than the rest of a lookup on a per-message path.
//!
//! Not for keys a peer chooses: a peer that knows the multiplier can make
//! every key land in one bucket.
//!
//! ```
//! use netio_core::fast_map::FastMap;
//!
//! let mut m: FastMap<u64, &str> = FastMap::default();
//! m.insert(7, "seven");
//! assert_eq!(m.get(&7), Some(&"seven"));
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A [`HashMap`] hashed by [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// Integer keys multiplied by an odd constant, the high half folded into
/// the low (a table's bucket index), so that aligned addresses spread too.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        let x = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_and_small_integers_spread_over_the_low_bits() {
        let b = BuildHasherDefault::<FastHasher>::default();
        let buckets = |keys: &mut dyn Iterator<Item = u64>| {
            let mut seen = std::collections::HashSet::new();
            for k in keys {
                seen.insert(b.hash_one(k) & 1023);
            }
            seen.len()
        };
        // 1,024 keys into 1,024 buckets: a random function fills about
        // 647 (1 - 1/e of them); without the fold, keys 64 bytes apart
        // would share their low 6 bits and fill at most 16.
        assert!(buckets(&mut (0..1024u64).map(|i| 0x7f00_0000_0000 + i * 64)) > 500);
        assert!(buckets(&mut (0..1024u64).map(|i| 0x7f00_0000_0000 + i * 4096)) > 500);
        assert!(buckets(&mut (0..1024u64)) > 500);
    }
}
