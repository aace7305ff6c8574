//! Large byte buffers recycled instead of mapped afresh.
//!
//! glibc maps every allocation of 256 KiB and more on its own and unmaps it when freed
//! ([`crate::sys::memory::return_large_frees`], so that a burst does not stay resident). A
//! buffer mapped afresh costs a page fault and a zeroed page per 4 KiB when first written: a
//! 1 MiB READ reply or WRITE extent paid 256 of them, most of a worker's time in a sequential
//! read or write (kernel-notes/profiling.md). Buffers of that size are handed back here when
//! their bytes are no longer needed (a reply once the transport has copied it, pending WRITE
//! data once committed) and handed out again, up to a cap drawn from the budget's share for
//! WRITE data; the rest are freed as before, and an idle server empties the pool.

use parking_lot::Mutex;

/// Buffers smaller than this come from glibc's heap, which recycles them itself.
pub const MIN: usize = 256 * 1024;

struct Free {
    bufs: Vec<Vec<u8>>,
    /// Capacity of `bufs` together.
    bytes: usize,
}

/// The process's pool of large buffers.
pub struct Pool {
    free: Mutex<Free>,
    cap: usize,
}

impl Pool {
    /// A pool holding at most `cap` bytes of free buffers.
    pub const fn new(cap: usize) -> Pool {
        Pool {
            free: Mutex::new(Free {
                bufs: Vec::new(),
                bytes: 0,
            }),
            cap,
        }
    }

    /// A recycled buffer with room for `len` bytes, if one fits: the smallest, and never one
    /// more than twice as large (its pages stay resident while it holds `len` bytes, which is
    /// what the pending-byte cap counts).
    fn reuse(&self, len: usize) -> Option<Vec<u8>> {
        if len < MIN {
            return None;
        }
        let mut f = self.free.lock();
        let i = f
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        let b = f.bufs.swap_remove(i);
        f.bytes -= b.capacity();
        Some(b)
    }

    /// An empty buffer with room for `len` bytes: a recycled one when one fits.
    pub fn take(&self, len: usize) -> Vec<u8> {
        self.reuse(len).unwrap_or_else(|| Vec::with_capacity(len))
    }

    /// A buffer of `len` zero bytes. A new one comes zeroed from the allocator, its pages
    /// untouched until written (a read over a hole need not fault them all in).
    pub fn zeroed(&self, len: usize) -> Vec<u8> {
        match self.reuse(len) {
            Some(mut b) => {
                b.resize(len, 0);
                b
            }
            None => vec![0u8; len],
        }
    }

    /// Keep `buf` for a later [`Pool::take`] if it is large and the pool has room; free it
    /// otherwise. Its contents are dropped either way.
    pub fn give(&self, mut buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap < MIN {
            return;
        }
        let mut f = self.free.lock();
        if f.bytes + cap > self.cap {
            return;
        }
        buf.clear();
        f.bytes += cap;
        f.bufs.push(buf);
    }

    /// Free every buffer held (an idle server).
    pub fn clear(&self) {
        let bufs = {
            let mut f = self.free.lock();
            f.bytes = 0;
            std::mem::take(&mut f.bufs)
        };
        drop(bufs);
    }

    /// Bytes held by free buffers.
    pub fn bytes(&self) -> usize {
        self.free.lock().bytes
    }
}

/// The process's pool: a quarter of the budget's share for WRITE data.
pub fn buffers() -> &'static Pool {
    static POOL: std::sync::OnceLock<Pool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let share = super::Shares::from_knobs(crate::knobs::get()).batch;
        Pool::new(usize::try_from(share / 4).unwrap_or(usize::MAX))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_up_to_the_cap_and_small_ones_never() {
        let p = Pool::new(3 * MIN);
        let a = p.zeroed(MIN);
        let addr = a.as_ptr();
        p.give(a);
        assert_eq!(p.bytes(), MIN);
        let b = p.zeroed(MIN / 2 + MIN / 2);
        assert_eq!(b.as_ptr(), addr, "the freed buffer is handed out again");
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(p.bytes(), 0);
        // Too small to pool; a request larger than any free buffer gets a new one.
        p.give(vec![1u8; MIN - 1]);
        assert_eq!(p.bytes(), 0);
        p.give(b);
        let c = p.take(2 * MIN);
        assert!(c.capacity() >= 2 * MIN);
        assert_eq!(p.bytes(), MIN);
        // The cap: the third buffer does not fit beside the two.
        p.give(c);
        p.give(vec![0u8; MIN]);
        assert_eq!(p.bytes(), 3 * MIN);
        // The smallest that fits, never one more than twice the request.
        assert!(p.take(MIN / 2 * 3).capacity() == 2 * MIN);
        assert_eq!(p.bytes(), MIN);
        p.give(vec![0u8; 2 * MIN]);
        let small = p.take(MIN);
        assert_eq!(small.capacity(), MIN);
        assert_eq!(p.bytes(), 2 * MIN);
        p.clear();
        assert_eq!(p.bytes(), 0);
        p.give(Vec::with_capacity(3 * MIN));
        assert_eq!(
            p.take(MIN).capacity(),
            MIN,
            "three times the request is too large"
        );
        assert_eq!(p.bytes(), 3 * MIN);
        assert_eq!(p.take(MIN / 2 * 3).capacity(), 3 * MIN);
        assert_eq!(p.bytes(), 0);
    }
}
