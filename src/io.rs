//! Loading and writing models without losing anything.
//!
//! Loading memory-maps the file into a `Bytes`, so tensor data stays in the
//! page cache and decoded `raw_data` fields are slices of the map, never
//! copies. Before decoding, the wire format is checked for fields our schema
//! does not define (prost would drop them). Writing streams the encoded
//! model into a temporary file in the target directory and renames it into
//! place, so a crash or a full disk never leaves a half-written model.
//! External data files are never read: they are referenced where they are,
//! or cloned beside the output.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{buf::UninitSlice, Buf, BufMut, Bytes};
use prost::Message;

use crate::onnx::{unknown, GraphProto, ModelProto, TensorProto};

/// A model as read from disk, with the bytes it was decoded from.
pub struct Loaded {
    pub path: PathBuf,
    pub bytes: Bytes,
    pub model: ModelProto,
}

#[derive(Default, Clone, Copy)]
pub struct LoadOptions {
    /// Decode even when the file has fields our schema does not define;
    /// they are lost on writing.
    pub allow_unknown_fields: bool,
}

pub fn load(path: &Path, options: LoadOptions) -> Result<Loaded> {
    let shown = path.display();
    let file = File::open(path).with_context(|| format!("{shown}: cannot open"))?;
    let len = file.metadata().with_context(|| format!("{shown}: cannot stat"))?.len();
    if len == 0 {
        bail!("{shown}: the file is empty, not an ONNX model");
    }
    // SAFETY: the map is read-only; onnx-fuse never writes the input, and a
    // file truncated by another process under us is outside what any reader
    // of a memory-mapped file can defend against.
    let map =
        unsafe { memmap2::MmapOptions::new().populate().map(&file) }.with_context(|| format!("{shown}: cannot map"))?;
    let bytes = Bytes::from_owner(map);
    match unknown::find_unknown_field(&bytes) {
        Err(why) => bail!("{shown}: not an ONNX model (invalid protobuf: {why})"),
        Ok(Some(field)) if !options.allow_unknown_fields => bail!(
            "{shown}: {field} is not in the ONNX schema onnx-fuse knows, and writing the model \
             would drop it (pass --allow-unknown-fields to accept that loss)"
        ),
        Ok(_) => {}
    }
    let model = ModelProto::decode(bytes.clone()).map_err(|e| anyhow!("{shown}: not an ONNX model ({e})"))?;
    if model.graph.is_none() {
        bail!("{shown}: not an ONNX model (it has no graph)");
    }
    let dir = parent(path);
    for location in external_locations(&model) {
        check_location(&location).map_err(|why| anyhow!("{shown}: external data location {location:?} {why}"))?;
        if !dir.join(&location).is_file() {
            bail!("{shown}: external data file {location:?} is missing (looked in {})", dir.display());
        }
    }
    Ok(Loaded { path: path.to_path_buf(), bytes, model })
}

/// How external data files reach an output in another directory.
#[derive(Default, Clone, Copy, PartialEq, Eq)]
pub enum ExternalData {
    /// A copy-on-write clone where the filesystem has one, else a copy made
    /// by the kernel. The output never shares blocks that a later in-place
    /// rewrite of the input's data could change.
    #[default]
    Copy,
    /// A hard link: instant, but the output then shares the input's file.
    HardLink,
}

/// Writes the (rewritten) model to `out`. When `unchanged`, the loaded bytes
/// are written as they are, so the output is byte-identical to the input.
pub fn save(loaded: &Loaded, unchanged: bool, out: &Path, external: ExternalData) -> Result<()> {
    let shown = out.display();
    if same_file(&loaded.path, out) {
        bail!("{shown}: the output would overwrite the input; choose another path");
    }
    let out_dir = parent(out);
    if !out_dir.is_dir() {
        bail!("{shown}: the directory {} does not exist", out_dir.display());
    }
    // Everything is written to temporary files first and renamed into place
    // last, data before the model that refers to it: a failure on the way
    // leaves the target directory as it was.
    let in_dir = parent(&loaded.path);
    let mut staged = Vec::new();
    if !same_file(&in_dir, &out_dir) {
        for location in external_locations(&loaded.model) {
            let (src, dst) = (in_dir.join(&location), out_dir.join(&location));
            if !same_file(&src, &dst) {
                staged.push(
                    stage_external(&src, &dst, external)
                        .with_context(|| format!("{shown}: cannot place external data {location:?}"))?,
                );
            }
        }
    }
    let model = stage(out, |file| {
        if unchanged {
            file.write_all(&loaded.bytes)
        } else {
            let mut sink = FileSink::new(file);
            loaded.model.encode(&mut sink).map_err(std::io::Error::other)?;
            sink.finish()
        }
    })
    .with_context(|| format!("{shown}: cannot write"))?;
    for file in staged {
        let target = file.target.clone();
        file.commit().with_context(|| format!("{}: cannot write", target.display()))?;
    }
    model.commit().with_context(|| format!("{shown}: cannot write"))
}

/// The directory a model's relative paths (external data) resolve against.
pub fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// A location must stay inside the model's directory.
fn check_location(location: &str) -> Result<(), &'static str> {
    let path = Path::new(location);
    if location.is_empty() {
        return Err("is empty");
    }
    if path.is_absolute() {
        return Err("is absolute; onnx-fuse only follows locations inside the model's directory");
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err("leaves the model's directory (`..`); refused");
    }
    Ok(())
}

/// Every distinct `location` of externally stored tensors, in all graphs.
pub fn external_locations(model: &ModelProto) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut visit = |t: &TensorProto| {
        if t.is_external() {
            if let Some(e) = t.external_data.iter().find(|e| e.key() == "location") {
                found.insert(e.value().to_string());
            }
        }
    };
    fn graph(g: &GraphProto, visit: &mut dyn FnMut(&TensorProto)) {
        g.initializer.iter().for_each(&mut *visit);
        for s in &g.sparse_initializer {
            s.values.iter().chain(s.indices.iter()).for_each(&mut *visit);
        }
        for node in &g.node {
            for a in &node.attribute {
                a.t.iter().chain(a.tensors.iter()).for_each(&mut *visit);
                a.g.iter().chain(a.graphs.iter()).for_each(|g| graph(g, visit));
            }
        }
    }
    if let Some(g) = &model.graph {
        graph(g, &mut visit);
    }
    for t in &model.training_info {
        t.initialization.iter().chain(t.algorithm.iter()).for_each(|g| graph(g, &mut visit));
    }
    found
}

fn stage_external(src: &Path, dst: &Path, how: ExternalData) -> std::io::Result<Staged> {
    let dir = parent(dst);
    std::fs::create_dir_all(&dir)?;
    match how {
        ExternalData::HardLink => {
            let tmp = tempfile::Builder::new().prefix(".onnx-fuse-").make_in(&dir, |p| std::fs::hard_link(src, p))?;
            Ok(Staged { tmp: Temp::Link(tmp), target: dst.to_path_buf() })
        }
        ExternalData::Copy => stage(dst, |out| {
            let mut input = File::open(src)?;
            if !clone_file(&input, out) {
                // std::io::copy between files uses copy_file_range on Linux:
                // the kernel copies, the data never enters this process.
                std::io::copy(&mut input, out)?;
            }
            Ok(())
        }),
    }
}

/// A copy-on-write clone (FICLONE), where the filesystem supports it.
fn clone_file(src: &File, dst: &File) -> bool {
    use std::os::fd::AsRawFd;
    const FICLONE: libc::c_ulong = 0x4004_9409;
    // SAFETY: both descriptors are open for the duration of the call.
    unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE as _, src.as_raw_fd()) == 0 }
}

/// A file written under a temporary name beside its target.
struct Staged {
    tmp: Temp,
    target: PathBuf,
}

enum Temp {
    File(tempfile::NamedTempFile),
    Link(tempfile::NamedTempFile<()>),
}

/// Writes a temporary file in the target's directory (removed again if
/// anything fails before `commit`).
fn stage(target: &Path, write: impl FnOnce(&mut File) -> std::io::Result<()>) -> std::io::Result<Staged> {
    use std::os::unix::fs::PermissionsExt;
    let mut tmp = tempfile::Builder::new().prefix(".onnx-fuse-").tempfile_in(parent(target))?;
    write(tmp.as_file_mut())?;
    let mode = std::fs::metadata(target).map(|m| m.permissions().mode()).unwrap_or(0o644);
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    Ok(Staged { tmp: Temp::File(tmp), target: target.to_path_buf() })
}

impl Staged {
    /// Syncs the data to disk and renames the file over its target.
    /// Staging every file before committing any lets the kernel write them
    /// back in parallel.
    fn commit(self) -> std::io::Result<()> {
        match self.tmp {
            Temp::File(tmp) => {
                tmp.as_file().sync_all()?;
                tmp.persist(&self.target).map_err(|e| e.error)?;
            }
            Temp::Link(tmp) => tmp.persist(&self.target).map_err(|e| e.error)?,
        }
        Ok(())
    }
}

/// A `BufMut` that streams prost's encoding into a file through a fixed
/// buffer; large byte fields (tensor data) go to the file directly from the
/// memory map, so encoding never holds a second copy of the model.
struct FileSink<'a> {
    file: &'a mut File,
    buf: Vec<u8>,
    error: Option<std::io::Error>,
}

const SINK_BUFFER: usize = 1 << 20;

impl<'a> FileSink<'a> {
    fn new(file: &'a mut File) -> Self {
        FileSink { file, buf: Vec::with_capacity(SINK_BUFFER), error: None }
    }

    fn write(&mut self, data: &[u8]) {
        if self.error.is_none() {
            if let Err(e) = self.file.write_all(data) {
                self.error = Some(e);
            }
        }
    }

    fn flush_buf(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        self.write(&buf);
        self.buf = buf;
        self.buf.clear();
    }

    fn finish(mut self) -> std::io::Result<()> {
        self.flush_buf();
        self.error.map_or(Ok(()), Err)
    }
}

// SAFETY: chunk_mut hands out the vector's spare capacity, and advance_mut
// only marks as initialized bytes the caller wrote into it.
unsafe impl BufMut for FileSink<'_> {
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        let len = self.buf.len() + cnt;
        assert!(len <= self.buf.capacity());
        self.buf.set_len(len);
        if self.buf.len() == self.buf.capacity() {
            self.flush_buf();
        }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.buf.len() == self.buf.capacity() {
            self.flush_buf();
        }
        UninitSlice::uninit(self.buf.spare_capacity_mut())
    }

    fn put_slice(&mut self, src: &[u8]) {
        if src.len() >= SINK_BUFFER / 4 {
            self.flush_buf();
            self.write(src);
        } else {
            if self.buf.len() + src.len() > self.buf.capacity() {
                self.flush_buf();
            }
            self.buf.extend_from_slice(src);
        }
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        while src.has_remaining() {
            let chunk = src.chunk();
            let n = chunk.len();
            self.put_slice(chunk);
            src.advance(n);
        }
    }
}
