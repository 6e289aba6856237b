//! Values addressed by ids the slab hands out, kept in fixed-size chunks.
//!
//! The prefix store's entries live here rather than in a hash map: a map grows by moving
//! everything it holds (see `sharded_map`), a chunked slab by adding one chunk, and ids handed
//! out in order keep neighbouring entries in neighbouring memory. A freed slot is reused under a
//! new generation, so an id kept past its value's removal finds nothing rather than a stranger.
//! Chunks are never given back: a store whose small entries gave way to fewer large ones keeps
//! the slots of its peak count, a few percent of its bound.

/// Slots per chunk: 2 KiB of them, little for a small store to carry unused.
const CHUNK: usize = 64;

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// The slab; ids are `generation << 32 | index`.
pub(super) struct Slab<T> {
    chunks: Vec<Box<[Slot<T>]>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Slab<T> {
    /// An empty slab.
    pub(super) fn new() -> Self {
        Self {
            chunks: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    /// Stores `value` and returns its id.
    pub(super) fn insert(&mut self, value: T) -> u64 {
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = self.chunks.len() * CHUNK;
                self.chunks.push(
                    (0..CHUNK)
                        .map(|_| Slot {
                            generation: 0,
                            value: None,
                        })
                        .collect(),
                );
                self.free
                    .extend((index as u32 + 1..(index + CHUNK) as u32).rev());
                index as u32
            }
        };
        self.len += 1;
        let slot = self.slot_mut(index);
        slot.value = Some(value);
        u64::from(slot.generation) << 32 | u64::from(index)
    }

    /// The value of `id`, unless it was removed.
    pub(super) fn get(&self, id: u64) -> Option<&T> {
        let (generation, index) = split(id);
        let slot = &self.chunks.get(index as usize / CHUNK)?[index as usize % CHUNK];
        (slot.generation == generation)
            .then_some(slot.value.as_ref())
            .flatten()
    }

    /// [`Self::get`], to change the value.
    pub(super) fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        let (generation, index) = split(id);
        let slot = self.chunks.get_mut(index as usize / CHUNK)?;
        let slot = &mut slot[index as usize % CHUNK];
        (slot.generation == generation)
            .then_some(slot.value.as_mut())
            .flatten()
    }

    /// Takes the value of `id` out; its slot is reused under the next generation.
    pub(super) fn remove(&mut self, id: u64) -> Option<T> {
        let (generation, index) = split(id);
        let chunk = self.chunks.get_mut(index as usize / CHUNK)?;
        let slot = &mut chunk[index as usize % CHUNK];
        if slot.generation != generation {
            return None;
        }
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.len -= 1;
        Some(value)
    }

    /// Values held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    fn slot_mut(&mut self, index: u32) -> &mut Slot<T> {
        &mut self.chunks[index as usize / CHUNK][index as usize % CHUNK]
    }
}

fn split(id: u64) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_find_their_values_until_removed_and_slots_are_reused_safely() {
        let mut slab = Slab::new();
        let ids: Vec<u64> = (0..10_000).map(|i| slab.insert(i)).collect();
        assert_eq!(slab.len(), 10_000);
        assert_eq!(slab.chunks.len(), 10_000usize.div_ceil(CHUNK));

        for (i, id) in ids.iter().enumerate() {
            assert_eq!(slab.get_mut(*id).copied(), Some(i));
        }
        assert_eq!(slab.remove(ids[5]), Some(5));
        assert_eq!(slab.remove(ids[5]), None);
        assert_eq!(slab.get_mut(ids[5]), None);
        // The freed slot is reused; the old id does not reach the new value.
        let reused = slab.insert(99);
        assert_eq!(reused as u32, ids[5] as u32);
        assert_ne!(reused, ids[5]);
        assert_eq!(slab.get_mut(ids[5]), None);
        assert_eq!(slab.get_mut(reused).copied(), Some(99));
        assert_eq!(slab.len(), 10_000);
        // Ids from nowhere find nothing.
        assert_eq!(slab.get_mut(u64::from(u32::MAX)), None);
        assert_eq!(slab.remove(1 << 40), None);
    }
}
