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

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{buf::UninitSlice, Buf, BufMut, Bytes};
use prost::Message;

use crate::onnx::{rows, unknown, GraphProto, ModelProto, TensorProto};

mod maps;
mod paths;
mod staged;
mod weights;

pub use paths::{check_run, check_writable, Role};

mod framing;
use framing::{Framing, FramingBuf, FramingBytes};
pub use staged::cleanup_on_signals;
use staged::Staged;

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
    let meta = std::fs::metadata(path).with_context(|| format!("{shown}: cannot open"))?;
    if meta.is_dir() {
        bail!("{shown}: is a directory, not an ONNX model file");
    }
    if !meta.is_file() {
        bail!("{shown}: is not a regular file (a device, FIFO or socket), not an ONNX model file");
    }
    let file = File::open(path).with_context(|| format!("{shown}: cannot open"))?;
    let len = file.metadata().with_context(|| format!("{shown}: cannot stat"))?.len();
    if len == 0 {
        bail!("{shown}: the file is empty, not an ONNX model");
    }
    // SAFETY: the map is read-only; onnx-fuse never writes the input, and a
    // file truncated by another process under us is outside what any reader
    // of a memory-mapped file can defend against.
    let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("{shown}: cannot map"))?;
    // Decoding and the unknown-field walk never read tensor payloads, only
    // their positions; writing reads each once and lets it go again
    // (`FileSink`), so the map is not faulted in up front.
    // Both read the framing with pread, never through the map (`framing`).
    let reader = file.try_clone().with_context(|| format!("{shown}: cannot open"))?;
    let bytes = Bytes::from_owner(maps::Registered::new(map, file));
    let unknown = match unknown::find_unknown_field_in(&FramingBytes::new(Framing::new(&bytes, &reader))) {
        Err(why) => bail!("{shown}: not an ONNX model (invalid protobuf: {why})"),
        Ok(found) => found,
    };
    let model = ModelProto::decode(FramingBuf::new(Framing::new(&bytes, &reader)))
        .map_err(|e| anyhow!("{shown}: not an ONNX model ({e})"))?;
    // Bytes that happen to parse as protobuf are no model: a model has an
    // IR version and a graph.
    if model.graph.is_none() || model.ir_version.is_none() {
        let what = if model.graph.is_none() { "no graph" } else { "no IR version" };
        bail!("{shown}: not an ONNX model (it has {what})");
    }
    if let (Some(field), false) = (unknown, options.allow_unknown_fields) {
        bail!(
            "{shown}: {field} is not in the ONNX schema onnx-fuse knows, and writing the model \
             would drop it (pass --allow-unknown-fields to accept that loss)"
        );
    }
    let dir = parent(path);
    for location in external_locations(&model) {
        paths::resolve_location(&dir, &location)
            .map_err(|why| anyhow!("{shown}: external data location {location:?} {why}"))?;
    }
    let file_size = |location: &str| {
        let path = paths::resolve_location(&dir, location).ok()?;
        std::fs::metadata(path).ok().map(|m| m.len())
    };
    crate::validate::model_with_files(&model, &file_size).map_err(|why| anyhow!("{shown}: invalid model: {why}"))?;
    // Validation read small payloads through the map (constants); what is
    // read again later comes back from the page cache.
    maps::release(&bytes);
    Ok(Loaded { path: path.to_path_buf(), bytes, model })
}

/// The files a run that loaded `loaded` reads: the model and its external data.
pub fn reads(loaded: &Loaded) -> Vec<Role> {
    let dir = parent(&loaded.path);
    let data = external_locations(&loaded.model)
        .into_iter()
        .map(|l| Role::new(dir.join(&l), format!("external data of the input, {l:?}")));
    std::iter::once(Role::new(&loaded.path, "the input")).chain(data).collect()
}

/// The files `save` writes for `loaded` at `out`: the model, the external
/// data files when `out` is in another directory, and with `apart` the file
/// of its weights.
pub fn writes(loaded: &Loaded, out: &Path, apart: bool) -> Vec<Role> {
    let mut roles = vec![Role::new(out, "-o")];
    for location in output_locations(loaded, out, apart) {
        roles.push(Role::new(parent(out).join(&location), format!("external data of the output, {location:?}")));
    }
    roles
}

/// `--external-data`: the file beside `out` that takes the weights, where
/// the model keeps them inside. A model with external data of its own
/// keeps its files (their weights are mapped already).
pub fn weights_file(loaded: &Loaded, out: &Path, apart: bool) -> Option<PathBuf> {
    (apart && external_locations(&loaded.model).is_empty()).then(|| parent(out).join(weights::file_name(out)))
}

/// The external data files the output at `out` refers to that `save` writes.
fn output_locations(loaded: &Loaded, out: &Path, apart: bool) -> BTreeSet<String> {
    if weights_file(loaded, out, apart).is_some() {
        return BTreeSet::from([weights::file_name(out)]);
    }
    if same_file(&parent(&loaded.path), &parent(out)) {
        return BTreeSet::new();
    }
    external_locations(&loaded.model)
}

/// The external data files `save` would place beside `out` that already
/// exist and belong to no earlier output at `out`: replacing them could
/// destroy another model's weights.
pub fn foreign_data_files(loaded: &Loaded, out: &Path, apart: bool) -> Vec<PathBuf> {
    let locations = output_locations(loaded, out, apart);
    // A model with its data inside places no file beside it: the earlier
    // output at `out` need not be read.
    if locations.is_empty() {
        return vec![];
    }
    let out_dir = parent(out);
    let previous: BTreeSet<String> =
        load(out, LoadOptions { allow_unknown_fields: true }).map(|l| external_locations(&l.model)).unwrap_or_default();
    locations
        .into_iter()
        .filter(|l| !previous.contains(l))
        .map(|l| out_dir.join(l))
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect()
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
    /// Already beside the output (a folder run carries data files over
    /// first): only the model is written.
    InPlace,
}

/// Writes the (rewritten) model to `out`. When `unchanged`, the loaded bytes
/// are written as they are, so the output is byte-identical to the input.
/// With `apart` (`--external-data`), the weights of a model that keeps them
/// inside go to the file `weights_file` names; that file, where it was
/// written, is returned.
pub fn save(
    loaded: &Loaded,
    unchanged: bool,
    out: &Path,
    external: ExternalData,
    apart: bool,
) -> Result<Option<PathBuf>> {
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
    let split =
        weights_file(loaded, out, apart).map(|path| (path, weights::split(&loaded.model, &weights::file_name(out))));
    let (model, weights) = match &split {
        Some((path, (model, payloads))) if !payloads.is_empty() => {
            let file = Staged::write(path, |file| weights::write(payloads, file))
                .with_context(|| format!("{shown}: cannot write its weights to {}", path.display()))?;
            staged.push((file, weights::file_name(out)));
            (model, Some(path.clone()))
        }
        _ => (&loaded.model, None),
    };
    let unchanged = unchanged && std::ptr::eq(model, &loaded.model);
    if !same_file(&in_dir, &out_dir) && external != ExternalData::InPlace {
        for location in external_locations(&loaded.model) {
            let (src, dst) = (in_dir.join(&location), out_dir.join(&location));
            if !same_file(&src, &dst) {
                let file = stage_external(&src, &dst, external)
                    .with_context(|| format!("{shown}: cannot place external data {location:?}"))?;
                staged.push((file, location));
            }
        }
    }
    let model = Staged::write(out, |file| {
        if unchanged {
            // In pieces, each copied in the kernel (or written and let go).
            let mut sink = FileSink::new(file);
            loaded.bytes.chunks(64 << 20).for_each(|chunk| sink.write(chunk));
            sink.finish()
        } else {
            let mut sink = FileSink::new(file);
            model.encode(&mut sink).map_err(std::io::Error::other)?;
            sink.finish()
        }
    })
    .with_context(|| format!("{shown}: cannot write"))?;
    pause_for_tests();
    let mut dirs = BTreeSet::from([out_dir.clone()]);
    for (file, location) in staged {
        dirs.insert(parent(&out_dir.join(&location)));
        file.commit().with_context(|| format!("{shown}: cannot place external data {location:?}"))?;
    }
    model.commit().with_context(|| format!("{shown}: cannot write"))?;
    // The renames themselves reach the disk once per directory.
    for dir in dirs {
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
    }
    Ok(weights)
}

/// Encodes `model` into `file` (streamed: tensor payloads go from the input's
/// map to the file without another copy in memory).
pub fn encode_to(model: &ModelProto, file: &mut File) -> std::io::Result<()> {
    let mut sink = FileSink::new(file);
    model.encode(&mut sink).map_err(std::io::Error::other)?;
    sink.finish()
}

/// `model` encoded in memory, every described payload (`onnx::rows`)
/// composed: for a reader that takes bytes, not a file (verification,
/// where no scratch file can be written).
pub fn encode_to_vec(model: &ModelProto) -> Vec<u8> {
    fn composed(g: &mut GraphProto) {
        for t in &mut g.initializer {
            if let Some(bytes) = t.raw_data.as_deref().and_then(rows::composed) {
                t.raw_data = Some(bytes.into());
            }
        }
        for node in &mut g.node {
            node.subgraphs_mut().for_each(composed);
        }
    }
    let mut model = model.clone();
    if let Some(g) = model.graph.as_mut() {
        composed(g);
    }
    model.encode_to_vec()
}

/// An unnamed scratch file for a model to be read back by path
/// (verification streams ONNX Runtime a file rather than bytes in memory).
pub use staged::Scratch;

/// Writes `text` to `path` atomically (reports).
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let staged = Staged::write(path, |file| file.write_all(text.as_bytes()));
    staged.and_then(Staged::commit).with_context(|| format!("{}: cannot write", path.display()))?;
    if let Ok(d) = File::open(parent(path)) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Tests interrupt a run while its output is staged, not yet committed:
/// `ONNX_FUSE_TEST_PAUSE_MS` holds it there that long.
fn pause_for_tests() {
    if let Some(ms) = std::env::var("ONNX_FUSE_TEST_PAUSE_MS").ok().and_then(|v| v.parse().ok()) {
        eprintln!("onnx-fuse: paused before committing");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
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

/// Every distinct `location` of externally stored tensors, in all graphs.
pub fn external_locations(model: &ModelProto) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    each_tensor(model, &mut |t: &TensorProto| {
        if t.is_external() {
            if let Some(e) = t.external_data.iter().find(|e| e.key() == "location") {
                found.insert(e.value().to_string());
            }
        }
    });
    found
}

/// Calls `visit` with every tensor `model` holds: initializers, sparse
/// ones, attributes', in every graph and body.
fn each_tensor(model: &ModelProto, visit: &mut dyn FnMut(&TensorProto)) {
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
        graph(g, visit);
    }
    for t in &model.training_info {
        t.initialization.iter().chain(t.algorithm.iter()).for_each(|g| graph(g, visit));
    }
}

/// The largest tensor in external data whose values the passes' proofs
/// may read, and the most read in all (`external_reader`).
const SMALL_EXTERNAL: u64 = 64 << 10;
const SMALL_EXTERNAL_IN_ALL: u64 = 16 << 20;

/// Reads the values of a small tensor `loaded` keeps in external data (64
/// KiB at most, 16 MiB in all), each once, when a proof first asks for it
/// (a static export's rotary table beside the model: `graph::ExternalValues`);
/// None for any other tensor, and where its file cannot be read. Each data
/// file is opened once, without blocking on a FIFO, and read only where it
/// is a regular file in the model's folder. The payloads themselves stay
/// where they are.
pub fn external_reader(loaded: &Loaded) -> impl Fn(&TensorProto) -> Option<Vec<f64>> + Send + Sync + 'static {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    #[derive(Default)]
    struct Read {
        files: HashMap<String, Option<File>>,
        payloads: HashMap<[String; 3], Option<Bytes>>,
        bytes: u64,
    }
    let dir = parent(&loaded.path);
    let state = std::sync::Mutex::new(Read::default());
    move |t: &TensorProto| {
        let key = t.external_span().filter(|_| t.is_external())?;
        let (offset, length) = (key[1].parse::<u64>().ok()?, key[2].parse::<u64>().ok()?);
        let mut state = state.lock().ok()?;
        let Read { files, payloads, bytes } = &mut *state;
        let payload = match payloads.get(&key) {
            Some(payload) => payload.clone(),
            None if length > SMALL_EXTERNAL || *bytes + length > SMALL_EXTERNAL_IN_ALL => None,
            None => {
                let file = files.entry(key[0].clone()).or_insert_with(|| {
                    let path = paths::resolve_location(&dir, &key[0]).ok()?;
                    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path).ok()?;
                    file.metadata().is_ok_and(|m| m.is_file()).then_some(file)
                });
                let mut read = vec![0u8; length as usize];
                let payload =
                    file.as_ref().and_then(|f| f.read_exact_at(&mut read, offset).ok()).map(|_| Bytes::from(read));
                *bytes += length;
                payloads.insert(key, payload.clone());
                payload
            }
        };
        TensorProto { raw_data: Some(payload?), external_data: vec![], data_location: None, ..t.clone() }.values()
    }
}

/// Places a copy of `src` at `dst` atomically, as external data is placed
/// (a folder run's other files).
pub fn carry_over(src: &Path, dst: &Path, how: ExternalData) -> Result<()> {
    let staged = stage_external(src, dst, how)
        .with_context(|| format!("{}: cannot copy to {}", src.display(), dst.display()))?;
    staged.commit().with_context(|| format!("{}: cannot write", dst.display()))?;
    if let Ok(d) = File::open(parent(dst)) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn stage_external(src: &Path, dst: &Path, how: ExternalData) -> std::io::Result<Staged> {
    std::fs::create_dir_all(parent(dst))?;
    match how {
        // Across filesystems no link can be: the file is copied.
        ExternalData::HardLink => match Staged::link(src, dst) {
            Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => stage_external(src, dst, ExternalData::Copy),
            staged => staged,
        },
        ExternalData::Copy | ExternalData::InPlace => Staged::write(dst, |out| {
            let input = File::open(src)?;
            if !clone_file(&input, out) {
                // std::io::copy between files uses copy_file_range on Linux:
                // the kernel copies, the data never enters this process.
                let mut written = 0;
                loop {
                    let n = std::io::copy(&mut std::io::Read::take(&input, WRITEBACK_STEP), out)?;
                    if n == 0 {
                        break;
                    }
                    start_writeback(out, written, n);
                    written += n;
                }
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

/// A `BufMut` that streams prost's encoding into a file through a fixed
/// buffer; large byte fields (tensor data) go to the file directly from the
/// memory map, so encoding never holds a second copy of the model. A
/// described payload (`onnx::rows`) goes as the pieces of its sources it
/// is, each copied the same way.
struct FileSink<'a> {
    file: &'a mut File,
    buf: Vec<u8>,
    error: Option<std::io::Error>,
    /// Bytes written so far, and up to where writeback was started.
    written: u64,
    kicked: u64,
}

const SINK_BUFFER: usize = 1 << 20;

/// Writeback of the output starts every this many bytes, so the disk
/// writes while the copy goes on and the closing fsync waits for the tail
/// only.
const WRITEBACK_STEP: u64 = 64 << 20;

impl<'a> FileSink<'a> {
    fn new(file: &'a mut File) -> Self {
        FileSink { file, buf: Vec::with_capacity(SINK_BUFFER), error: None, written: 0, kicked: 0 }
    }

    fn write(&mut self, data: &[u8]) {
        if rows::pieces(data, &mut |piece| self.write(piece)) {
            return;
        }
        // Large payloads go in steps, each followed by its writeback.
        for piece in data.chunks(WRITEBACK_STEP as usize) {
            self.write_piece(piece);
        }
    }

    fn write_piece(&mut self, data: &[u8]) {
        if self.error.is_some() {
            return;
        }
        // A payload of the input goes from file to file in the kernel.
        let copied = match maps::copy_range(data, self.file) {
            Ok(copied) => copied,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        if !copied {
            if let Err(e) = self.file.write_all(data) {
                self.error = Some(e);
                return;
            }
            // A payload of the input, written: its pages need not stay.
            maps::release(data);
        }
        self.written += data.len() as u64;
        if self.written - self.kicked >= WRITEBACK_STEP {
            start_writeback(self.file, self.kicked, self.written - self.kicked);
            self.kicked = self.written;
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

/// Asks the kernel to start writing `len` bytes at `offset` to the disk,
/// without waiting (the fsync at commit still makes the file durable).
fn start_writeback(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor; the call only schedules writeback.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
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
        // A payload described is never short (`rows::DESCRIBED`): whether
        // it is one is asked of payloads only.
        if src.len() >= SINK_BUFFER / 4 || (src.len() >= rows::DESCRIBED && rows::described(src)) {
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
