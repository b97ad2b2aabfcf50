//! Reading a model file's framing without touching its map. A byte read
//! through a file map faults in the page cache's whole folio around it, and
//! a kernel with large page-cache folios (6.18 here) maps up to megabytes of
//! tensor payload for every field read among the payloads: GPT-2 medium
//! (1.42 GB) peaked at 198 MB of mapped file for fields of a few kilobytes.
//! So tags, lengths and small fields are read with `pread` into a window,
//! and a large length-delimited field (a payload) is sliced out of the map
//! unread: the writer copies it file to file (`maps::locate`).

use std::os::unix::fs::FileExt;

use bytes::{Buf, Bytes};

/// A length-delimited field at least this long is sliced out of the map;
/// shorter ones are copied out of the window.
const LARGE: usize = 4096;
/// Bytes read at once.
const WINDOW: usize = 64 * 1024;

/// The file behind a map, read in windows.
pub struct Framing<'a> {
    map: &'a Bytes,
    file: &'a std::fs::File,
}

impl<'a> Framing<'a> {
    pub fn new(map: &'a Bytes, file: &'a std::fs::File) -> Self {
        Framing { map, file }
    }
}

/// Up to `WINDOW` bytes of the file, from `start`.
#[derive(Default)]
struct Window {
    start: usize,
    bytes: Vec<u8>,
}

impl Window {
    /// Moves the window to start at `at` unless it holds `at` already; read
    /// from the map only should `pread` fail (the same bytes, the slow way).
    fn hold(&mut self, framing: &Framing, at: usize) {
        if at >= self.start && at < self.start + self.bytes.len() {
            return;
        }
        let n = WINDOW.min(framing.map.len().saturating_sub(at));
        self.start = at;
        self.bytes.resize(n, 0);
        if framing.file.read_exact_at(&mut self.bytes, at as u64).is_err() {
            self.bytes.copy_from_slice(&framing.map[at..at + n]);
        }
    }
}

/// The model's bytes as prost decodes them (`Buf`): from the window, and
/// large fields as slices of the map.
pub struct FramingBuf<'a> {
    framing: Framing<'a>,
    pos: usize,
    window: Window,
}

impl<'a> FramingBuf<'a> {
    pub fn new(framing: Framing<'a>) -> Self {
        let mut window = Window::default();
        window.hold(&framing, 0);
        FramingBuf { framing, pos: 0, window }
    }
}

impl Buf for FramingBuf<'_> {
    fn remaining(&self) -> usize {
        self.framing.map.len() - self.pos
    }

    fn chunk(&self) -> &[u8] {
        // The window always holds `pos` while anything remains.
        let w = &self.window;
        &w.bytes[(self.pos - w.start).min(w.bytes.len())..]
    }

    fn advance(&mut self, n: usize) {
        assert!(n <= self.remaining(), "advance past the end");
        self.pos += n;
        self.window.hold(&self.framing, self.pos);
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.remaining(), "copy_to_bytes past the end");
        if len >= LARGE {
            let slice = self.framing.map.slice(self.pos..self.pos + len);
            self.advance(len);
            return slice;
        }
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let chunk = self.chunk();
            let take = chunk.len().min(len - out.len());
            out.extend_from_slice(&chunk[..take]);
            self.advance(take);
        }
        out.into()
    }
}

/// Bytes the unknown-field walk reads one at a time, at offsets that mostly
/// grow (it skips payloads by their length).
pub struct FramingBytes<'a> {
    framing: Framing<'a>,
    window: std::cell::RefCell<Window>,
}

impl<'a> FramingBytes<'a> {
    pub fn new(framing: Framing<'a>) -> Self {
        FramingBytes { framing, window: Default::default() }
    }
}

impl crate::onnx::unknown::Source for FramingBytes<'_> {
    fn len(&self) -> usize {
        self.framing.map.len()
    }

    fn byte(&self, at: usize) -> Option<u8> {
        if at >= self.framing.map.len() {
            return None;
        }
        let mut window = self.window.borrow_mut();
        window.hold(&self.framing, at);
        window.bytes.get(at - window.start).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::{GraphProto, ModelProto, NodeProto, TensorProto};
    use prost::Message;

    /// The file's bytes and the same bytes as a map-like `Bytes`.
    fn written(bytes: &[u8]) -> (tempfile_free::Temp, Bytes) {
        let temp = tempfile_free::Temp::with(bytes);
        (temp, Bytes::copy_from_slice(bytes))
    }

    /// A tiny stand-in for a temporary file (the crate's dev-dependencies
    /// are for the integration tests).
    mod tempfile_free {
        pub struct Temp(pub std::path::PathBuf, pub std::fs::File);
        impl Temp {
            pub fn with(bytes: &[u8]) -> Temp {
                use std::sync::atomic::{AtomicUsize, Ordering};
                static N: AtomicUsize = AtomicUsize::new(0);
                let path = std::env::temp_dir().join(format!(
                    "onnx-fuse-framing-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                std::fs::write(&path, bytes).unwrap();
                Temp(path.clone(), std::fs::File::open(path).unwrap())
            }
        }
        impl Drop for Temp {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
    }

    #[test]
    fn decoding_through_the_window_equals_decoding_the_bytes() {
        // Fields straddling the window's edge, small and large payloads.
        for pad in [0, 1, WINDOW - 40, WINDOW - 7, WINDOW - 1, WINDOW, WINDOW + 3, 3 * WINDOW - 11] {
            let tensor = |n: usize, name: &str| TensorProto {
                name: Some(name.into()),
                dims: vec![n as i64],
                data_type: Some(2),
                raw_data: Some(vec![7u8; n].into()),
                ..Default::default()
            };
            let nodes = (0..50)
                .map(|i| NodeProto {
                    op_type: Some("Relu".into()),
                    name: Some(format!("node_{i}_{}", "n".repeat(i * 37))),
                    input: vec![format!("v{i}")],
                    output: vec![format!("v{}", i + 1)],
                    ..Default::default()
                })
                .collect();
            let model = ModelProto {
                ir_version: Some(8),
                doc_string: Some("d".repeat(pad)),
                graph: Some(GraphProto {
                    node: nodes,
                    initializer: vec![tensor(3, "small"), tensor(LARGE, "edge"), tensor(WINDOW * 2 + 5, "large")],
                    ..Default::default()
                }),
                ..Default::default()
            };
            let encoded = model.encode_to_vec();
            let (temp, map) = written(&encoded);
            let through = ModelProto::decode(FramingBuf::new(Framing::new(&map, &temp.1))).unwrap();
            assert_eq!(through, model, "pad {pad}");
            // Large payloads are slices of the map, not copies.
            let large = &through.graph.as_ref().unwrap().initializer[2];
            let raw = large.raw_data.as_ref().unwrap();
            assert!(map.as_ptr_range().contains(&raw.as_ptr()), "pad {pad}");
            let walked = crate::onnx::unknown::find_unknown_field_in(&FramingBytes::new(Framing::new(&map, &temp.1)));
            assert_eq!(walked, crate::onnx::unknown::find_unknown_field(&encoded), "pad {pad}");
            // Truncated anywhere: an error, as from the bytes, never a panic.
            for cut in [1, encoded.len() / 2, encoded.len() - 1] {
                let (temp, map) = written(&encoded[..cut]);
                let from_bytes = ModelProto::decode(&encoded[..cut]).is_err();
                assert_eq!(ModelProto::decode(FramingBuf::new(Framing::new(&map, &temp.1))).is_err(), from_bytes);
            }
        }
    }
}
