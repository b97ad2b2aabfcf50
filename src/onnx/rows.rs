//! A tensor payload made of other payloads' rows side by side (the weight
//! pack-matmul writes: row r of `[K, N₁ + N₂]` is row r of `[K, N₁]`, then
//! of `[K, N₂]`), described rather than copied. A rule builds it while it
//! matches, so it costs nothing there, also for a match the driver then
//! refuses: it holds its sources (slices of the input's map, shared) and
//! reserves address space for its length, which no page backs. Whoever
//! needs its bytes composes them from the sources: the writer row by row,
//! each copied file to file in the kernel (`io`), `TensorProto::values` in
//! memory.
//!
//! The reserved bytes read as zeros. A reader of a payload's bytes asks
//! `pieces` or `composed` first; the encoders of `io` do, and so does
//! `values`.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

/// The shortest payload described: a shorter one is composed at once (less
/// than a page; the input's payloads that short are copies already, read
/// out of its framing). So a writer asks only of payloads this long.
pub const DESCRIBED: usize = 4096;

/// `rows` rows of each source in turn.
struct Layout {
    rows: usize,
    sources: Vec<Bytes>,
}

impl Layout {
    /// Calls `f` with the slices of the sources that bytes `start..end` of
    /// the payload are, in order.
    fn pieces(&self, start: usize, end: usize, f: &mut dyn FnMut(&[u8])) {
        let widths: Vec<usize> = self.sources.iter().map(|s| s.len() / self.rows).collect();
        let row: usize = widths.iter().sum();
        let first = start / row;
        let mut at = first * row;
        for r in first..self.rows {
            for (source, &w) in self.sources.iter().zip(&widths) {
                let (lo, hi) = (at.max(start), (at + w).min(end));
                if lo < hi {
                    f(&source[r * w + lo - at..r * w + hi - at]);
                }
                at += w;
                if at >= end {
                    return;
                }
            }
        }
    }
}

/// The described payloads alive: where each one's reserved bytes start and
/// end, and what they are.
static LIVE: Mutex<Vec<(usize, usize, Arc<Layout>)>> = Mutex::new(Vec::new());

/// A described payload's reserved bytes, known to `LIVE` while they live.
struct Reserved {
    map: memmap2::Mmap,
}

impl AsRef<[u8]> for Reserved {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let start = self.map.as_ptr() as usize;
        let gone = {
            let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
            live.iter().position(|&(s, _, _)| s == start).map(|i| live.swap_remove(i))
        };
        // Let go of the sources outside the lock: one may be described in
        // turn, and forget itself.
        drop(gone);
    }
}

/// The payload whose row r is row r of each source in turn (`rows` rows
/// each), described. None where a source's length is not a whole number
/// of rows, or there is nothing to write.
pub fn side_by_side(rows: usize, sources: Vec<Bytes>) -> Option<Bytes> {
    let total: usize = sources.iter().map(Bytes::len).sum();
    if rows == 0 || total == 0 || sources.iter().any(|s| s.len() % rows != 0) {
        return None;
    }
    let layout = Arc::new(Layout { rows, sources });
    // Address space only: read-only, private and anonymous, no page is
    // given until one is read, and none is counted against swap.
    let reserved = (total >= DESCRIBED)
        .then(|| memmap2::MmapOptions::new().len(total).no_reserve_swap().map_anon().and_then(|m| m.make_read_only()))
        .and_then(Result::ok);
    let Some(map) = reserved else {
        // Short, or no address space to reserve: the same bytes, composed.
        let mut bytes = Vec::with_capacity(total);
        layout.pieces(0, total, &mut |p| compose(p, &mut bytes));
        return Some(bytes.into());
    };
    let start = map.as_ptr() as usize;
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((start, start + total, layout));
    Some(Bytes::from_owner(Reserved { map }))
}

/// The described payload `data` lies in: where it starts, and its layout.
fn inside(data: &[u8]) -> Option<(usize, Arc<Layout>)> {
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter().find(|&&(s, e, _)| s <= start && end <= e && s < e).map(|(s, _, layout)| (*s, layout.clone()))
}

/// Whether `data` lies inside a described payload.
pub fn described(data: &[u8]) -> bool {
    inside(data).is_some()
}

/// Where `data` lies inside a described payload: calls `f` with the slices
/// of its sources it is, in order, and says true; false (and no call) for
/// any other bytes.
pub fn pieces(data: &[u8], f: &mut dyn FnMut(&[u8])) -> bool {
    let Some((s, layout)) = inside(data) else { return false };
    let start = data.as_ptr() as usize - s;
    layout.pieces(start, start + data.len(), f);
    true
}

/// The bytes of `data` where it lies inside a described payload, composed
/// in memory (its sources may be described in turn); None for any other.
pub fn composed(data: &[u8]) -> Option<Vec<u8>> {
    let mut bytes = Vec::with_capacity(data.len());
    pieces(data, &mut |p| compose(p, &mut bytes)).then_some(bytes)
}

fn compose(data: &[u8], out: &mut Vec<u8>) {
    if !pieces(data, &mut |p| compose(p, out)) {
        out.extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rows` rows of `width` bytes, each byte its row times 16 plus `tag`.
    fn source(rows: usize, width: usize, tag: u8) -> Bytes {
        (0..rows).flat_map(|r| std::iter::repeat_n(r as u8 * 16 + tag, width)).collect::<Vec<u8>>().into()
    }

    fn expected(rows: usize, parts: &[(usize, u8)]) -> Vec<u8> {
        (0..rows).flat_map(|r| parts.iter().flat_map(move |&(w, t)| std::iter::repeat_n(r as u8 * 16 + t, w))).collect()
    }

    #[test]
    fn a_payload_is_its_sources_rows_in_turn_and_its_parts_theirs() {
        let parts = [(3000, 1), (1000, 2), (96, 3)];
        let sources = parts.iter().map(|&(w, t)| source(4, w, t)).collect();
        let packed = side_by_side(4, sources).unwrap();
        let want = expected(4, &parts);
        assert_eq!(packed.len(), want.len());
        assert_eq!(composed(&packed).unwrap(), want);
        // Any part of it: within one source's row, across rows and sources.
        for (a, b) in [(0, 1), (2999, 3001), (4090, 8200), (100, 16384), (16383, 16384)] {
            assert_eq!(composed(&packed[a..b]).unwrap(), want[a..b], "{a}..{b}");
        }
        let mut calls = 0;
        assert!(pieces(&packed[2990..4100], &mut |_| calls += 1));
        assert_eq!(calls, 4, "the end of the first's row 0, the second's and the third's, the first's row 1 begun");
        assert!(composed(&want).is_none(), "bytes of no described payload");
    }

    #[test]
    fn a_short_payload_is_composed_at_once_and_a_described_one_can_be_a_source() {
        let short = side_by_side(2, vec![source(2, 3, 1), source(2, 5, 2)]).unwrap();
        assert_eq!(&short[..], expected(2, &[(3, 1), (5, 2)]));
        assert!(composed(&short).is_none(), "short: its own bytes");
        let inner = side_by_side(2, vec![source(2, 3000, 1), source(2, 1000, 2)]).unwrap();
        let outer = side_by_side(2, vec![inner, source(2, 100, 3)]).unwrap();
        assert_eq!(composed(&outer).unwrap(), expected(2, &[(3000, 1), (1000, 2), (100, 3)]));
    }

    #[test]
    fn sources_of_no_whole_rows_describe_nothing() {
        assert!(side_by_side(3, vec![source(2, 4096, 1)]).is_none());
        assert!(side_by_side(0, vec![]).is_none());
    }
}
