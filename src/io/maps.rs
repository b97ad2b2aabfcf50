//! The memory maps of loaded models, so that payloads written out can give
//! their pages back: a multi-gigabyte model then never needs its size in
//! memory, only the pages being copied.

use std::sync::Mutex;

/// (start, end) addresses of the live maps.
static LIVE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A map known to this module for as long as it lives.
pub struct Registered(memmap2::Mmap);

impl Registered {
    pub fn new(map: memmap2::Mmap) -> Self {
        let start = map.as_ptr() as usize;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((start, start + map.len()));
        Registered(map)
    }
}

impl AsRef<[u8]> for Registered {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let start = self.0.as_ptr() as usize;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|&(s, _)| s != start);
    }
}

/// Lets the kernel drop the whole pages `data` covers when it lies in a
/// live map (they are read again from the page cache if ever needed).
pub fn release(data: &[u8]) {
    const PAGE: usize = 4096;
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let inside = LIVE.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|&(s, e)| s <= start && end <= e);
    let (first, last) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
    if inside && first < last {
        // SAFETY: the range is whole pages inside a live, read-only shared
        // file mapping; MADV_DONTNEED only drops them from this process,
        // and the next access reads them back from the file.
        unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_DONTNEED) };
    }
}
