//! A bounded, sharded LRU map whose inserts can be refused by a generation counter.
//!
//! Coherence scheme (why a reader can never put a stale value back after a mutation):
//!
//! * The map has one generation counter, `epoch`. A reader takes a [`Ticket`] (the epoch)
//!   BEFORE it reads the database, and offers its result with that ticket afterwards.
//! * A mutation commits first, then calls [`Lru::remove`] / [`Lru::clear`], which bump the
//!   epoch and only then take the shard lock and remove the entry.
//! * [`Lru::insert`] compares the ticket with the epoch while holding the shard lock and drops
//!   the value if they differ.
//! * A mutation whose effect on a value can be applied to any copy, whether that copy saw the
//!   mutation or not, may call [`Lru::update`] instead of [`Lru::remove`]: it bumps the epoch
//!   the same way and edits the held value in place under the shard lock.
//!
//! Take a mutation M on key k and a reader R of k that read the database before M committed.
//! R's ticket predates M's bump. Either R's insert runs (under the shard lock) before M's
//! bump — then M's removal, which comes after the bump and takes the same lock, removes it — or
//! after the bump, and the ticket no longer matches, so it is dropped. A reader whose ticket
//! already carries M's bump started its database read after M committed and saw M. One counter
//! per map (not per key) keeps the ticket a single atomic load; the price is that any mutation
//! refuses the inserts of every reader in flight at that moment, which only costs a later miss.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

use lru::LruCache;
use parking_lot::Mutex;

/// The generation a reader saw before it read the database.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u64);

struct Shard<K: Hash + Eq, V> {
    map: LruCache<K, (V, usize)>,
    /// Sum of the weights of the values in `map`.
    weight: usize,
}

/// A sharded LRU map bounded by total weight (entries count 1 unless the caller says more).
pub struct Lru<K: Hash + Eq, V> {
    shards: Box<[Mutex<Shard<K, V>>]>,
    /// Weight each shard may hold.
    cap: usize,
    epoch: AtomicU64,
    hasher: std::hash::RandomState,
}

impl<K: Hash + Eq, V: Clone> Lru<K, V> {
    /// A map of at most `cap` total weight over `shards` locks; `None` when `cap` is 0.
    pub fn new(cap: usize, shards: usize) -> Option<Self> {
        if cap == 0 {
            return None;
        }
        let shards = shards.clamp(1, cap);
        Some(Self {
            shards: (0..shards)
                .map(|_| {
                    Mutex::new(Shard {
                        map: LruCache::unbounded(),
                        weight: 0,
                    })
                })
                .collect(),
            cap: cap.div_ceil(shards),
            epoch: AtomicU64::new(0),
            hasher: std::hash::RandomState::new(),
        })
    }

    fn shard<Q: Hash + ?Sized>(&self, k: &Q) -> &Mutex<Shard<K, V>> {
        let i = self.hasher.hash_one(k) as usize % self.shards.len();
        &self.shards[i]
    }

    /// The current generation; take it before reading what will be inserted.
    pub fn ticket(&self) -> Ticket {
        Ticket(self.epoch.load(Ordering::SeqCst))
    }

    /// The value of `k`, marked most recently used.
    pub fn get<Q>(&self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shard(k).lock().map.get(k).map(|(v, _)| v.clone())
    }

    /// Insert `v` unless something was invalidated since `t` was taken, or it alone weighs
    /// more than a shard may hold. Evicts least recently used entries to stay within the cap.
    pub fn insert(&self, t: Ticket, k: K, v: V, weight: usize) {
        if weight > self.cap {
            return;
        }
        let mut s = self.shard(&k).lock();
        if self.epoch.load(Ordering::SeqCst) != t.0 {
            return;
        }
        if let Some((_, (_, w))) = s.map.push(k, (v, weight)) {
            s.weight -= w;
        }
        s.weight += weight;
        while s.weight > self.cap {
            match s.map.pop_lru() {
                Some((_, (_, w))) => s.weight -= w,
                None => break,
            }
        }
    }

    /// Drop `k` (after the change that made it stale has committed).
    pub fn remove<Q>(&self, k: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let mut s = self.shard(k).lock();
        if let Some((_, w)) = s.map.pop(k) {
            s.weight -= w;
        }
    }

    /// Bring `k`'s value up to date with a change that has committed: `f` edits it in place
    /// and returns its weight now, or None when it cannot and the value is dropped. Readers in
    /// flight are refused as by [`Lru::remove`], so `f` must give the value as of the change
    /// whether or not the cached one already saw it. A value grown past what a shard may hold
    /// is dropped; others make room as an insert does.
    pub fn update<Q>(&self, k: &Q, f: impl FnOnce(&mut V) -> Option<usize>)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        let mut s = self.shard(k).lock();
        let Some((v, w)) = s.map.peek_mut(k) else {
            return;
        };
        let (was, now) = match f(v) {
            Some(n) if n <= self.cap => {
                let was = std::mem::replace(w, n);
                (was, Some(n))
            }
            _ => (*w, None),
        };
        s.weight -= was;
        match now {
            Some(n) => s.weight += n,
            None => {
                s.map.pop(k);
            }
        }
        while s.weight > self.cap {
            match s.map.pop_lru() {
                Some((_, (_, w))) => s.weight -= w,
                None => break,
            }
        }
    }

    /// Drop everything.
    pub fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        for s in self.shards.iter() {
            let mut s = s.lock();
            s.map.clear();
            s.weight = 0;
        }
    }

    /// A copy of every entry (for comparing what was cached with the database).
    pub fn entries(&self) -> Vec<(K, V)>
    where
        K: Clone,
    {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let s = s.lock();
            out.extend(s.map.iter().map(|(k, (v, _))| (k.clone(), v.clone())));
        }
        out
    }

    /// Total weight held.
    pub fn weight(&self) -> usize {
        self.shards.iter().map(|s| s.lock().weight).sum()
    }

    /// Evict least recently used entries until every shard holds at most `1/divisor` of its
    /// capacity. Evicting never makes a value stale, so no generation is bumped.
    pub fn shrink(&self, divisor: usize) {
        let keep = self.cap / divisor.max(1);
        for s in self.shards.iter() {
            let mut s = s.lock();
            while s.weight > keep {
                match s.map.pop_lru() {
                    Some((_, (_, w))) => s.weight -= w,
                    None => break,
                }
            }
            // Resizing to what it holds frees the table's spare capacity; the map is then made
            // unbounded again (the weight is its bound).
            let len =
                std::num::NonZeroUsize::new(s.map.len()).unwrap_or(std::num::NonZeroUsize::MIN);
            s.map.resize(len);
            s.map.resize(std::num::NonZeroUsize::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_after_invalidation_is_refused() {
        let m: Lru<u64, u64> = Lru::new(16, 2).unwrap();
        let t = m.ticket();
        m.remove(&7);
        m.insert(t, 7, 1, 1);
        assert_eq!(m.get(&7), None, "a reader's stale value must not land");
        let t = m.ticket();
        m.insert(t, 7, 2, 1);
        assert_eq!(m.get(&7), Some(2));
        let t = m.ticket();
        m.clear();
        m.insert(t, 8, 3, 1);
        assert_eq!(m.get(&7), None);
        assert_eq!(m.get(&8), None);
    }

    #[test]
    fn weight_is_bounded_and_lru_goes_first() {
        let m: Lru<u64, u64> = Lru::new(4, 1).unwrap();
        for k in 0..4 {
            m.insert(m.ticket(), k, k, 1);
        }
        assert_eq!(m.get(&0), Some(0));
        m.insert(m.ticket(), 9, 9, 2);
        assert_eq!(m.weight(), 4);
        assert_eq!(m.get(&0), Some(0), "recently used survives");
        assert_eq!(m.get(&1), None);
        assert_eq!(m.get(&2), None);
        m.insert(m.ticket(), 10, 10, 5);
        assert_eq!(m.get(&10), None, "heavier than the cap: not cached");
        m.update(&9, |v| {
            *v = 19;
            Some(3)
        });
        assert_eq!(
            (m.get(&9), m.weight()),
            (Some(19), 4),
            "grown in place, the oldest out"
        );
        assert_eq!(m.get(&3), None);
        m.update(&9, |_| Some(5));
        assert_eq!(
            (m.get(&9), m.weight()),
            (None, 1),
            "grown past the cap: dropped"
        );
        assert!(Lru::<u64, u64>::new(0, 4).is_none());
    }
}
