//! Which files a run reads and writes, compared by identity before
//! anything is written: no run may write a file it reads, write one file
//! twice, or replace a file that is not a regular file or not its own.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a path names: an existing file by device and inode (after following
/// links), a file still to be made by its canonical directory and name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    Inode(u64, u64),
    New(PathBuf),
}

fn identity(path: &Path) -> Option<Identity> {
    if let Ok(m) = std::fs::metadata(path) {
        return Some(Identity::Inode(m.dev(), m.ino()));
    }
    let dir = std::fs::canonicalize(super::parent(path)).ok()?;
    Some(Identity::New(dir.join(path.file_name()?)))
}

/// One file of a run, with what it is to the user ("the input", "-o", …).
#[derive(Clone)]
pub struct Role {
    pub path: PathBuf,
    pub what: String,
}

impl Role {
    pub fn new(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        Role { path: path.into(), what: what.into() }
    }
}

/// Refuses a run whose writes touch its reads or each other, or replace
/// anything but a regular file. The error names both paths.
pub fn check_run(reads: &[Role], writes: &[Role]) -> Result<(), String> {
    // Each path's identity once (a model can have hundreds of data files).
    let known: Vec<(Option<Identity>, &Role)> = reads.iter().chain(writes).map(|r| (identity(&r.path), r)).collect();
    for (i, w) in writes.iter().enumerate() {
        if let Ok(m) = std::fs::metadata(&w.path) {
            if !m.is_file() {
                return Err(format!(
                    "{} ({}) exists and is not a regular file; onnx-fuse only replaces regular files",
                    w.path.display(),
                    w.what
                ));
            }
        }
        let Some(id) = &known[reads.len() + i].0 else { continue };
        let earlier = &known[..reads.len() + i];
        let clash = earlier.iter().find(|(other, _)| other.as_ref() == Some(id)).map(|(_, r)| *r);
        if let Some(r) = clash {
            return Err(format!(
                "{} ({}) and {} ({}) are the same file; choose another path",
                w.path.display(),
                w.what,
                r.path.display(),
                r.what
            ));
        }
    }
    Ok(())
}

/// Refuses, before anything is written, a path whose folder is missing,
/// not a folder, or not writable (every write is a new file linked into
/// its folder, so the folder is what must allow it). The error names the
/// path once, and what it is.
pub fn check_writable(writes: &[Role]) -> Result<(), String> {
    for w in writes {
        let dir = super::parent(&w.path);
        let problem = match std::fs::metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
            Err(e) => format!("cannot be read ({e})"),
            Ok(m) if !m.is_dir() => "is not a folder".to_string(),
            Ok(_) => {
                let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()));
                // SAFETY: a valid C string; access(2) reads it only.
                let writable = c.is_ok_and(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0);
                if writable {
                    continue;
                }
                format!("is not writable ({})", std::io::Error::last_os_error())
            }
        };
        return Err(format!("{} ({}): cannot write: its folder {} {problem}", w.path.display(), w.what, dir.display()));
    }
    Ok(())
}

/// Where an external-data location of a model in `dir` resolves: inside the
/// model's directory, symlinks followed, and a regular file.
pub fn resolve_location(dir: &Path, location: &str) -> Result<PathBuf, String> {
    let path = Path::new(location);
    if location.is_empty() {
        return Err("is empty".into());
    }
    if path.is_absolute() {
        return Err("is absolute; onnx-fuse only follows locations inside the model's directory".into());
    }
    if path.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err("leaves the model's directory (`..`); refused".into());
    }
    let joined = dir.join(path);
    let real = std::fs::canonicalize(&joined).map_err(|_| format!("is missing (looked in {})", dir.display()))?;
    let root = std::fs::canonicalize(dir).map_err(|e| format!("cannot be resolved: {e}"))?;
    if !real.starts_with(&root) {
        return Err(format!("leads outside the model's directory (to {}); refused", real.display()));
    }
    if !std::fs::metadata(&real).is_ok_and(|m| m.is_file()) {
        return Err("is not a regular file".into());
    }
    Ok(joined)
}
