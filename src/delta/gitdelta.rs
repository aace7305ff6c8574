//! git's binary delta encoder, reimplemented so that `diff --binary` picks the same form
//! (`delta` or `literal`) as git and writes the same bytes.
//!
//! The delta is a header (source and target sizes as little-endian base-128 varints) and a
//! list of instructions: insert up to 127 literal bytes, or copy a range of the source. Matches
//! are found through an index of the source: a Rabin fingerprint of every 16-byte block (the
//! lowest of a run of identical blocks kept, at most 64 per hash bucket, thinned evenly), looked
//! up with a rolling fingerprint of the target's last 16 bytes; the longest match wins, is
//! extended backwards over literal bytes just written, and is emitted in copies of at most
//! 64 KiB. The search stops early once a match of 4 KiB is found.

/// Bytes the fingerprint covers.
const WINDOW: usize = 16;
/// The fingerprint's top 8 bits (of 31) sit this far up.
const SHIFT: u32 = 23;
/// The most entries kept in one hash bucket.
const BUCKET_LIMIT: usize = 64;
/// A match this long ends the search.
const GOOD_ENOUGH: usize = 4096;
/// The largest copy instruction.
const MAX_COPY: usize = 0x10000;

/// The fingerprint's modulus: x^31 plus these low bits.
const POLY: u64 = 0x2b59_b4d1;

/// `t(x) * x^shift` reduced modulo the degree-31 polynomial, as a number below 2^31.
const fn reduce(t: u64, shift: u32) -> u32 {
    let mut v = (t as u128) << shift;
    let modulus = (POLY as u128) | (1 << 31);
    let mut bit = 127;
    while bit >= 31 {
        if (v >> bit) & 1 == 1 {
            v ^= modulus << (bit - 31);
        }
        bit -= 1;
    }
    v as u32
}

/// Appending a byte: the top byte shifted out is folded back in (with its low bit still
/// visible at bit 31 of the shifted value, which the entry cancels).
const fn push_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = reduce(i as u64, 31) ^ (((i as u32) & 1) << 31);
        i += 1;
    }
    t
}

/// Dropping the byte that entered `WINDOW` bytes ago: its contribution after 15 shifts.
const fn pop_table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = reduce(i as u64, 8 * (WINDOW as u32 - 1));
        i += 1;
    }
    t
}

const PUSH: [u32; 256] = push_table();
const POP: [u32; 256] = pop_table();

fn push(val: u32, byte: u8) -> u32 {
    ((val << 8) | u32::from(byte)) ^ PUSH[(val >> SHIFT) as usize]
}

/// One indexed source block: where the bytes after it start, and its fingerprint.
#[derive(Clone, Copy)]
struct Slot {
    at: usize,
    val: u32,
}

/// The source's blocks by fingerprint: bucket `i` is `slots[starts[i]..starts[i + 1]]`.
struct Index {
    mask: u32,
    starts: Vec<usize>,
    slots: Vec<Slot>,
}

impl Index {
    fn new(src: &[u8]) -> Index {
        let blocks = (src.len() - 1) / WINDOW;
        let wanted = blocks / 4;
        let mut bits = 4;
        while (1usize << bits) < wanted {
            bits += 1;
        }
        let size = 1usize << bits;
        let mask = (size - 1) as u32;
        // Each bucket in insertion order (its last entry is the list head).
        let mut buckets: Vec<Vec<Slot>> = vec![Vec::new(); size];
        let mut prev: Option<u32> = None;
        for b in (0..blocks).rev() {
            let start = b * WINDOW;
            let val = src[start + 1..=start + WINDOW]
                .iter()
                .fold(0, |v, &byte| push(v, byte));
            let bucket = &mut buckets[(val & mask) as usize];
            if prev == Some(val) {
                // The same block again just before: keep the lower one.
                if let Some(last) = bucket.last_mut() {
                    last.at = start + WINDOW;
                }
                continue;
            }
            prev = Some(val);
            bucket.push(Slot {
                at: start + WINDOW,
                val,
            });
        }
        let mut starts = Vec::with_capacity(size + 1);
        let mut slots = Vec::new();
        for mut bucket in buckets {
            bucket.reverse(); // list order: lowest position first
            starts.push(slots.len());
            slots.extend(thin(&bucket));
        }
        starts.push(slots.len());
        Index {
            mask,
            starts,
            slots,
        }
    }

    fn bucket(&self, val: u32) -> &[Slot] {
        let i = (val & self.mask) as usize;
        &self.slots[self.starts[i]..self.starts[i + 1]]
    }
}

/// A bucket cut to [`BUCKET_LIMIT`] entries, dropping runs spread evenly along it.
fn thin(list: &[Slot]) -> Vec<Slot> {
    let n = list.len();
    if n <= BUCKET_LIMIT {
        return list.to_vec();
    }
    let excess = (n - BUCKET_LIMIT) as isize;
    let mut keep = vec![true; n];
    let mut acc: isize = 0;
    let mut e = 0;
    while e < n {
        acc += excess;
        if acc > 0 {
            let kept = e;
            while acc > 0 {
                e += 1;
                acc -= BUCKET_LIMIT as isize;
            }
            for k in &mut keep[kept + 1..=e.min(n - 1)] {
                *k = false;
            }
        }
        e += 1;
    }
    list.iter()
        .zip(keep)
        .filter_map(|(s, k)| k.then_some(*s))
        .collect()
}

fn varint(mut n: usize, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

/// The delta turning `src` into `trg`, or nothing when either is empty or the delta would be
/// longer than `max` bytes.
pub fn delta(src: &[u8], trg: &[u8], max: usize) -> Option<Vec<u8>> {
    if src.is_empty() || trg.is_empty() || src.len() >= 0xffff_ffff {
        return None;
    }
    let index = Index::new(src);
    let mut out = Vec::with_capacity(8192);
    varint(src.len(), &mut out);
    varint(trg.len(), &mut out);
    // A pending insert's count byte is filled in when the insert ends.
    let mut at = 0;
    let mut val = 0;
    out.push(0);
    while at < WINDOW && at < trg.len() {
        out.push(trg[at]);
        val = push(val, trg[at]);
        at += 1;
    }
    let mut inscnt = at;
    let mut moff: usize = 0;
    let mut msize: usize = 0;
    while at < trg.len() {
        if msize < GOOD_ENOUGH {
            val ^= POP[trg[at - WINDOW] as usize];
            val = push(val, trg[at]);
            for slot in index.bucket(val) {
                if slot.val != val {
                    continue;
                }
                let limit = (src.len() - slot.at).min(trg.len() - at);
                if limit <= msize {
                    break;
                }
                let len = src[slot.at..slot.at + limit]
                    .iter()
                    .zip(&trg[at..at + limit])
                    .take_while(|(a, b)| a == b)
                    .count();
                if msize < len {
                    msize = len;
                    moff = slot.at;
                    if msize >= GOOD_ENOUGH {
                        break;
                    }
                }
            }
        }
        if msize < 4 {
            if inscnt == 0 {
                out.push(0);
            }
            out.push(trg[at]);
            at += 1;
            inscnt += 1;
            if inscnt == 0x7f {
                let slot = out.len() - inscnt - 1;
                out[slot] = inscnt as u8;
                inscnt = 0;
            }
            msize = 0;
        } else {
            if inscnt > 0 {
                // Take literal bytes just written into the copy when they match too.
                while moff > 0 && src[moff - 1] == trg[at - 1] {
                    msize += 1;
                    moff -= 1;
                    at -= 1;
                    out.pop();
                    inscnt -= 1;
                    if inscnt == 0 {
                        out.pop(); // the insert's count byte
                        break;
                    }
                }
                if inscnt > 0 {
                    let slot = out.len() - inscnt - 1;
                    out[slot] = inscnt as u8;
                }
                inscnt = 0;
            }
            let left = msize.saturating_sub(MAX_COPY);
            msize -= left;
            let op = out.len();
            out.push(0);
            let mut code = 0x80u8;
            for (k, shift) in [0, 8, 16, 24].into_iter().enumerate() {
                let byte = (moff >> shift) as u8;
                if byte != 0 {
                    out.push(byte);
                    code |= 1 << k;
                }
            }
            for (k, shift) in [0, 8].into_iter().enumerate() {
                let byte = (msize >> shift) as u8;
                if byte != 0 {
                    out.push(byte);
                    code |= 0x10 << k;
                }
            }
            out[op] = code;
            at += msize;
            moff += msize;
            msize = left;
            if moff > 0xffff_ffff {
                msize = 0;
            }
            if msize < GOOD_ENOUGH {
                val = trg[at - WINDOW..at].iter().fold(0, |v, &b| push(v, b));
            }
        }
        if out.len() > max {
            return None;
        }
    }
    if inscnt > 0 {
        let slot = out.len() - inscnt - 1;
        out[slot] = inscnt as u8;
    }
    (out.len() <= max).then_some(out)
}

/// Rebuild the target from `src` and a delta (for tests: what `git apply` does).
#[cfg(test)]
pub fn apply(src: &[u8], delta: &[u8]) -> Option<Vec<u8>> {
    let mut pos = 0;
    let mut read_varint = || {
        let (mut n, mut shift) = (0usize, 0);
        loop {
            let b = *delta.get(pos)?;
            pos += 1;
            n |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return Some(n);
            }
        }
    };
    let src_len = read_varint()?;
    let trg_len = read_varint()?;
    if src_len != src.len() {
        return None;
    }
    let mut out = Vec::with_capacity(trg_len);
    while pos < delta.len() {
        let op = delta[pos];
        pos += 1;
        if op & 0x80 != 0 {
            let mut field = |bits: std::ops::Range<u32>| -> Option<usize> {
                let mut n = 0;
                for (k, bit) in bits.enumerate() {
                    if op & (1 << bit) != 0 {
                        n |= usize::from(*delta.get(pos)?) << (8 * k);
                        pos += 1;
                    }
                }
                Some(n)
            };
            let off = field(0..4)?;
            let len = match field(4..7)? {
                0 => MAX_COPY,
                n => n,
            };
            out.extend_from_slice(src.get(off..off + len)?);
        } else {
            let n = usize::from(op);
            out.extend_from_slice(delta.get(pos..pos + n)?);
            pos += n;
        }
    }
    (out.len() == trg_len).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_match_gits_first_entries() {
        assert_eq!(PUSH[1], 0xab59_b4d1);
        assert_eq!(PUSH[255], 0xd1ee_e811);
        assert_eq!(POP[1], 0x7eb5_200d);
        assert_eq!(POP[255], 0x3bb8_646a);
    }

    #[test]
    fn deltas_rebuild_the_target() {
        let src: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut trg = src.clone();
        trg[100] ^= 1;
        trg.splice(20_000..20_010, *b"new bytes here!!");
        trg.extend_from_slice(&src[..300]);
        let d = delta(&src, &trg, usize::MAX).expect("a delta");
        assert!(d.len() < 200, "{}", d.len());
        assert_eq!(apply(&src, &d).as_deref(), Some(&trg[..]));
        assert!(delta(&src, &trg, 10).is_none());
        let small = delta(b"abc", b"xyz", usize::MAX).expect("a delta");
        assert_eq!(apply(b"abc", &small).as_deref(), Some(&b"xyz"[..]));
    }
}
