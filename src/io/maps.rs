//! The memory maps of loaded models. A payload of the input that is written
//! out goes from the input file to the output file inside the kernel
//! (`copy_file_range`), found here by its address; where that cannot be
//! done, it is written from the map and its pages are given back after. A
//! multi-gigabyte model never needs its size in memory.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;

/// (start, end) addresses of the live maps, and the descriptor of each file.
static LIVE: Mutex<Vec<(usize, usize, RawFd)>> = Mutex::new(Vec::new());

/// A map known to this module for as long as it lives, with its file (kept
/// open: payloads are copied from its descriptor).
pub struct Registered {
    map: memmap2::Mmap,
    _file: File,
}

impl Registered {
    pub fn new(map: memmap2::Mmap, file: File) -> Self {
        // The fields read among the payloads would otherwise map whole huge
        // pages of payload with them (file THP): keep mappings page-sized.
        let _ = map.advise(memmap2::Advice::NoHugePage);
        let start = map.as_ptr() as usize;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).push((start, start + map.len(), file.as_raw_fd()));
        Registered { map, _file: file }
    }
}

/// The file and offset `data` lies at, when it lies inside a live map.
pub fn locate(data: &[u8]) -> Option<(RawFd, u64)> {
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.iter().find(|&&(s, e, _)| s <= start && end <= e).map(|&(s, _, fd)| (fd, (start - s) as u64))
}

impl AsRef<[u8]> for Registered {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let start = self.map.as_ptr() as usize;
        LIVE.lock().unwrap_or_else(|e| e.into_inner()).retain(|&(s, _, _)| s != start);
    }
}

/// Lets the kernel drop the whole pages `data` covers when it lies in a
/// live map (they are read again from the page cache if ever needed).
pub fn release(data: &[u8]) {
    const PAGE: usize = 4096;
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let inside = LIVE.lock().unwrap_or_else(|e| e.into_inner()).iter().any(|&(s, e, _)| s <= start && end <= e);
    let (first, last) = (start.div_ceil(PAGE) * PAGE, end / PAGE * PAGE);
    if inside && first < last {
        // SAFETY: the range is whole pages inside a live, read-only shared
        // file mapping; MADV_DONTNEED only drops them from this process,
        // and the next access reads them back from the file.
        unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_DONTNEED) };
    }
}

/// Copies `data` (a payload of a live map) to the current position of `out`
/// inside the kernel. False when the kernel declines (another filesystem, an
/// old kernel, …) before anything was copied: the caller then writes it.
pub fn copy_range(data: &[u8], out: &File) -> std::io::Result<bool> {
    let Some((fd, mut offset)) = locate(data) else { return Ok(false) };
    if std::env::var_os("ONNX_FUSE_NO_COPY_FILE_RANGE").is_some() {
        return Ok(false);
    }
    let mut left = data.len();
    while left > 0 {
        let mut off_in = offset as libc::loff_t;
        // SAFETY: both descriptors are open; off_in is a valid pointer; the
        // output offset is the file's own (null).
        let n = unsafe { libc::copy_file_range(fd, &mut off_in, out.as_raw_fd(), std::ptr::null_mut(), left, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            let declined = matches!(
                e.raw_os_error(),
                Some(libc::EXDEV | libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::EBADF | libc::EPERM)
            );
            if declined && left == data.len() {
                return Ok(false);
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the input file is shorter than its map",
            ));
        }
        left -= n as usize;
        offset += n as u64;
    }
    Ok(true)
}
