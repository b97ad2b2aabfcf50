//! Atomic writes that leave nothing behind.
//!
//! A file is written unnamed (`O_TMPFILE`) in its target's directory where
//! the filesystem offers that, so a crash or `SIGKILL` mid-write leaves no
//! trace; it gets a name only when it is complete and synced, for the
//! moment it takes to rename it over its target. Where unnamed files are not
//! offered, it is written under a hidden temporary name instead. Every name
//! a temporary file has is registered here, so that `SIGINT` and `SIGTERM`
//! remove it (`cleanup_on_signals`) before the process exits.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::parent;

/// Temporary files that exist under a name right now.
static NAMED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn register(path: &Path) {
    NAMED.lock().unwrap_or_else(|e| e.into_inner()).push(path.to_path_buf());
}

fn unregister(path: &Path) {
    NAMED.lock().unwrap_or_else(|e| e.into_inner()).retain(|p| p != path);
}

/// From now on SIGINT, SIGTERM and SIGHUP remove every registered temporary
/// file and end the process with 128 + the signal's number. Call it first
/// thing in `main`, before any thread starts: the signals are blocked in
/// every thread and taken by one thread of their own, so the clean-up runs
/// as ordinary code rather than in a signal handler.
pub fn cleanup_on_signals() {
    // SAFETY: plain libc calls on a local signal set; this runs before any
    // other thread exists, so the mask is inherited by all of them.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        let set = SigSet(set);
        std::thread::spawn(move || {
            let set = set;
            let mut sig: libc::c_int = 0;
            if libc::sigwait(&set.0, &mut sig) == 0 {
                for path in NAMED.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    let _ = std::fs::remove_file(path);
                }
                std::process::exit(128 + sig);
            }
        });
    }
}

struct SigSet(libc::sigset_t);
// SAFETY: a sigset_t is plain data.
unsafe impl Send for SigSet {}

/// The mode new files get: 0666 less the process's umask.
fn default_mode() -> u32 {
    // SAFETY: umask only swaps an integer; it is set back at once.
    let mask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    };
    0o666 & !(mask as u32)
}

/// A complete file waiting to be renamed over its target.
pub struct Staged {
    file: Option<File>,
    /// Where the file is now: None while it has no name.
    name: Option<PathBuf>,
    target: PathBuf,
}

impl Staged {
    /// Writes a new file for `target` (in its directory) with `write`. It
    /// keeps the mode of the file it will replace, or gets the umask's.
    pub fn write(target: &Path, write: impl FnOnce(&mut File) -> std::io::Result<()>) -> std::io::Result<Staged> {
        let dir = parent(target);
        let mode =
            std::fs::metadata(target).map(|m| m.permissions().mode() & 0o7777).unwrap_or_else(|_| default_mode());
        let mut staged = match unnamed_in(&dir) {
            Some(file) => Staged { file: Some(file), name: None, target: target.to_path_buf() },
            None => {
                let (file, path) = named_in(&dir)?;
                Staged { file: Some(file), name: Some(path), target: target.to_path_buf() }
            }
        };
        let file = staged.file.as_mut().expect("open until committed");
        write(file)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        Ok(staged)
    }

    /// A hard link to `source`, to be renamed over `target`.
    pub fn link(source: &Path, target: &Path) -> std::io::Result<Staged> {
        let dir = parent(target);
        for attempt in 0.. {
            let path = dir.join(temp_name(attempt));
            register(&path);
            match std::fs::hard_link(source, &path) {
                Ok(()) => return Ok(Staged { file: None, name: Some(path), target: target.to_path_buf() }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => unregister(&path),
                Err(e) => {
                    unregister(&path);
                    return Err(e);
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// Syncs the data to disk and renames the file over its target.
    pub fn commit(mut self) -> std::io::Result<()> {
        if let Some(file) = &self.file {
            file.sync_all()?;
        }
        let name = match self.name.take() {
            Some(name) => name,
            None => self.link_unnamed()?,
        };
        let renamed = std::fs::rename(&name, &self.target);
        if renamed.is_err() {
            let _ = std::fs::remove_file(&name);
        }
        unregister(&name);
        renamed
    }

    /// Gives the unnamed file a temporary name beside its target.
    fn link_unnamed(&self) -> std::io::Result<PathBuf> {
        let file = self.file.as_ref().expect("an unnamed file is open");
        let proc = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("no NUL");
        let dir = parent(&self.target);
        for attempt in 0..100 {
            let path = dir.join(temp_name(attempt));
            let c = CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
            register(&path);
            // SAFETY: both paths are NUL-terminated C strings that outlive the call.
            let r = unsafe {
                libc::linkat(libc::AT_FDCWD, proc.as_ptr(), libc::AT_FDCWD, c.as_ptr(), libc::AT_SYMLINK_FOLLOW)
            };
            if r == 0 {
                return Ok(path);
            }
            unregister(&path);
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e);
            }
        }
        Err(std::io::Error::other("no free temporary name"))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Not committed: a named temporary goes; an unnamed one vanishes
        // with its descriptor.
        if let Some(name) = self.name.take() {
            let _ = std::fs::remove_file(&name);
            unregister(&name);
        }
    }
}

fn temp_name(attempt: u32) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    format!(".onnx-fuse-{}-{nanos:08x}-{attempt}.tmp", std::process::id())
}

/// An unnamed file in `dir`, where the filesystem offers `O_TMPFILE`.
fn unnamed_in(dir: &Path) -> Option<File> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; the descriptor is owned by the File.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
    // SAFETY: a descriptor open() just returned, owned by nothing else.
    (fd >= 0).then(|| unsafe { File::from_raw_fd(fd) })
}

/// A new file under a temporary name in `dir`, registered for clean-up.
fn named_in(dir: &Path) -> std::io::Result<(File, PathBuf)> {
    for attempt in 0..100 {
        let path = dir.join(temp_name(attempt));
        register(&path);
        match std::fs::OpenOptions::new().write(true).read(true).create_new(true).open(&path) {
            Ok(file) => return Ok((file, path)),
            Err(e) => {
                unregister(&path);
                if e.kind() != std::io::ErrorKind::AlreadyExists {
                    return Err(e);
                }
            }
        }
    }
    Err(std::io::Error::other("no free temporary name"))
}

/// A scratch file for a reader that needs a path: unnamed (`O_TMPFILE`) in
/// the system's temporary folder and reached through `/proc/self/fd`, so
/// it takes no room beside the user's model and no kill can leave it
/// behind. `None` where the system offers no such file; the caller then
/// works from memory.
pub struct Scratch {
    pub file: File,
    pub path: PathBuf,
}

impl Scratch {
    pub fn unnamed() -> Option<Scratch> {
        let file = unnamed_in(&std::env::temp_dir())?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        path.exists().then_some(Scratch { file, path })
    }
}
