//! Connection handles: [`ConnId`], and [`ConnTable`], the generational
//! table providers keep their connections in.

use std::fmt;

/// A handle to one connection of a backend: a small copyable value, handed
/// out when the connection is opened ([`Backend::open_active_endpoint`]) or
/// accepted (with `on_connection_established`), and taken by every
/// operation on the connection.
///
/// It is a slot index with a generation. Once the connection is closed its
/// handle is stale for good: operations with it fail with
/// `UnknownConnection`, even after the slot serves a new connection. Two
/// connections to the same remote address have different handles.
///
/// Handles are only meaningful to the backend that issued them.
///
/// [`Backend::open_active_endpoint`]: crate::Backend::open_active_endpoint
///
/// ```
/// use netio_core::ConnId;
/// let id = ConnId::new(3, 1);
/// assert_eq!((id.index(), id.generation()), (3, 1));
/// assert_eq!(ConnId::from_u64(id.to_u64()), id);
/// assert_eq!(id.to_string(), "conn#3.1");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    index: u32,
    generation: u32,
}

impl ConnId {
    /// A handle from its slot index and generation (for providers that keep
    /// their own tables).
    pub const fn new(index: u32, generation: u32) -> Self {
        Self { index, generation }
    }

    /// The slot index.
    pub const fn index(self) -> u32 {
        self.index
    }

    /// The generation of the slot this handle was issued for.
    pub const fn generation(self) -> u32 {
        self.generation
    }

    /// Both parts in one number (generation in the high half), e.g. to carry
    /// the handle through a `u64` token.
    pub const fn to_u64(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }

    /// The inverse of [`to_u64`](Self::to_u64).
    pub const fn from_u64(v: u64) -> Self {
        Self {
            index: v as u32,
            generation: (v >> 32) as u32,
        }
    }
}

impl fmt::Debug for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}.{}", self.index, self.generation)
    }
}

impl fmt::Display for ConnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

enum Slot<T> {
    Occupied { generation: u32, value: T },
    Vacant { generation: u32, next_free: u32 },
}

const NONE: u32 = u32::MAX;

/// A generational table of connections: insert gives a [`ConnId`], lookups
/// by handle are an index and a generation compare (no hashing), a removed
/// entry's handle never matches again.
///
/// Sans-IO: providers keep their per-connection state in it.
///
/// ```
/// use netio_core::ConnTable;
/// let mut t = ConnTable::new();
/// let a = t.insert("a");
/// assert_eq!(t.get(a), Some(&"a"));
/// assert_eq!(t.remove(a), Some("a"));
/// let b = t.insert("b"); // reuses the slot, with a new generation
/// assert_eq!(a.index(), b.index());
/// assert_eq!(t.get(a), None);
/// assert_eq!(t.get(b), Some(&"b"));
/// ```
pub struct ConnTable<T> {
    slots: Vec<Slot<T>>,
    free_head: u32,
    len: usize,
}

impl<T> Default for ConnTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for ConnTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<T> ConnTable<T> {
    /// An empty table.
    pub const fn new() -> Self {
        Self {
            slots: Vec::new(),
            free_head: NONE,
            len: 0,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The handle the next [`insert`](Self::insert) will return.
    pub fn next_id(&self) -> ConnId {
        if self.free_head != NONE {
            let i = self.free_head;
            match &self.slots[i as usize] {
                Slot::Vacant { generation, .. } => ConnId::new(i, *generation),
                Slot::Occupied { .. } => unreachable!("free list points at an occupied slot"),
            }
        } else {
            ConnId::new(self.slots.len() as u32, 0)
        }
    }

    /// Adds `value` and returns its handle.
    ///
    /// # Panics
    ///
    /// When the table already holds `u32::MAX - 1` entries.
    pub fn insert(&mut self, value: T) -> ConnId {
        self.insert_with(|_| value)
    }

    /// Adds the value `make` builds from its own handle.
    ///
    /// # Panics
    ///
    /// When the table already holds `u32::MAX - 1` entries.
    pub fn insert_with(&mut self, make: impl FnOnce(ConnId) -> T) -> ConnId {
        let id = self.next_id();
        let value = make(id);
        if id.index as usize == self.slots.len() {
            assert!(id.index < NONE, "connection table full");
            self.slots.push(Slot::Occupied {
                generation: id.generation,
                value,
            });
        } else {
            let slot = &mut self.slots[id.index as usize];
            let next = match slot {
                Slot::Vacant { next_free, .. } => *next_free,
                Slot::Occupied { .. } => unreachable!("free list points at an occupied slot"),
            };
            self.free_head = next;
            *slot = Slot::Occupied {
                generation: id.generation,
                value,
            };
        }
        self.len += 1;
        id
    }

    /// The entry of `id`, if it is still in the table.
    #[inline]
    pub fn get(&self, id: ConnId) -> Option<&T> {
        match self.slots.get(id.index as usize)? {
            Slot::Occupied { generation, value } if *generation == id.generation => Some(value),
            _ => None,
        }
    }

    /// The entry of `id`, mutable, if it is still in the table.
    #[inline]
    pub fn get_mut(&mut self, id: ConnId) -> Option<&mut T> {
        match self.slots.get_mut(id.index as usize)? {
            Slot::Occupied { generation, value } if *generation == id.generation => Some(value),
            _ => None,
        }
    }

    /// `true` when `id` names an entry of the table.
    pub fn contains(&self, id: ConnId) -> bool {
        self.get(id).is_some()
    }

    /// Removes and returns the entry of `id`; its handle never matches
    /// again.
    pub fn remove(&mut self, id: ConnId) -> Option<T> {
        let slot = self.slots.get_mut(id.index as usize)?;
        match slot {
            Slot::Occupied { generation, .. } if *generation == id.generation => {}
            _ => return None,
        }
        let old = std::mem::replace(
            slot,
            Slot::Vacant {
                generation: id.generation.wrapping_add(1),
                next_free: self.free_head,
            },
        );
        self.free_head = id.index;
        self.len -= 1;
        match old {
            Slot::Occupied { value, .. } => Some(value),
            Slot::Vacant { .. } => unreachable!("checked occupied above"),
        }
    }

    /// Every entry with its handle, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (ConnId, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Occupied { generation, value } => {
                Some((ConnId::new(i as u32, *generation), value))
            }
            Slot::Vacant { .. } => None,
        })
    }

    /// Every entry, mutable, with its handle, in slot order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ConnId, &mut T)> + '_ {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::Occupied { generation, value } => {
                    Some((ConnId::new(i as u32, *generation), value))
                }
                Slot::Vacant { .. } => None,
            })
    }

    /// The handles of every entry, in slot order.
    pub fn ids(&self) -> Vec<ConnId> {
        self.iter().map(|(id, _)| id).collect()
    }

    /// Removes every entry and returns them with their handles.
    pub fn drain(&mut self) -> Vec<(ConnId, T)> {
        let ids = self.ids();
        ids.into_iter()
            .filter_map(|id| self.remove(id).map(|v| (id, v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_handle_never_matches_the_slots_next_entry() {
        let mut t = ConnTable::new();
        let a = t.insert(1);
        t.remove(a);
        let b = t.insert(2);
        assert_eq!(a.index(), b.index());
        assert_ne!(a, b);
        assert_eq!(t.get(a), None);
        assert_eq!(t.get_mut(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(b), Some(&2));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn freed_slots_are_reused_and_the_table_does_not_grow() {
        let mut t = ConnTable::new();
        for i in 0..4 {
            t.insert(i);
        }
        for round in 0..100 {
            let id = t.insert(round);
            assert!(
                id.index() < 5,
                "slot {} beyond the high-water mark",
                id.index()
            );
            assert_eq!(t.remove(id), Some(round));
        }
        assert_eq!(t.slots.len(), 5);
        assert_eq!(t.len(), 4);
    }

    #[test]
    fn next_id_predicts_insert_and_insert_with_sees_its_handle() {
        let mut t = ConnTable::new();
        let a = t.insert(ConnId::new(0, 0));
        t.remove(a);
        let predicted = t.next_id();
        let got = t.insert_with(|id| id);
        assert_eq!(predicted, got);
        assert_eq!(t.get(got), Some(&got));
    }

    #[test]
    fn iter_and_drain_list_every_live_entry_once() {
        let mut t = ConnTable::new();
        let a = t.insert('a');
        let b = t.insert('b');
        let c = t.insert('c');
        t.remove(b);
        let seen: Vec<_> = t.iter().collect();
        assert_eq!(seen, vec![(a, &'a'), (c, &'c')]);
        for (_, v) in t.iter_mut() {
            *v = v.to_ascii_uppercase();
        }
        assert_eq!(t.drain(), vec![(a, 'A'), (c, 'C')]);
        assert!(t.is_empty());
        assert_eq!(t.get(a), None);
    }

    #[test]
    fn handles_round_trip_through_u64_and_unknown_indices_are_none() {
        let id = ConnId::new(u32::MAX - 1, 7);
        assert_eq!(ConnId::from_u64(id.to_u64()), id);
        let t: ConnTable<u8> = ConnTable::new();
        assert_eq!(t.get(id), None);
        assert!(!t.contains(ConnId::new(0, 0)));
    }
}
