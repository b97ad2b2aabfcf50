//! `--external-data`: the output's weights in a file beside it.
//!
//! ONNX Runtime copies every tensor stored inside a model out of the parsed
//! file at load, and holds both for a while; tensors in external data whose
//! offset is page-aligned it maps instead. So a model written with its
//! weights apart loads with about its weights' size less peak memory
//! (docs/benchmarks.md). Every initializer of 1 KiB or more (as onnx's
//! `save_as_external_data` chooses) moves, in graph order, each at an offset
//! aligned to 64 KiB (the allocation granularity of every platform ONNX
//! Runtime maps on) or, below 64 KiB, to 4 KiB; the bytes between are zeros.

use std::fs::File;
use std::path::Path;

use bytes::Bytes;

use super::FileSink;
use crate::onnx::{proto::tensor_proto::DataLocation, GraphProto, ModelProto, StringStringEntryProto, TensorProto};

/// Tensors smaller than this stay inside the model.
const SMALLEST: usize = 1024;

/// The name of the file that holds `out`'s weights: `model.onnx.data` for
/// `model.onnx`, as torch names it.
pub fn file_name(out: &Path) -> String {
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}.data")
}

/// `model` with its weights referring to `location`, and the payloads at
/// their offsets there. Nothing moves where no tensor is large enough.
pub fn split(model: &ModelProto, location: &str) -> (ModelProto, Vec<(u64, Bytes)>) {
    let mut model = model.clone();
    let mut payloads = Vec::new();
    let mut end = 0u64;
    if let Some(g) = model.graph.as_mut() {
        graph(g, location, &mut end, &mut payloads);
    }
    (model, payloads)
}

fn graph(g: &mut GraphProto, location: &str, end: &mut u64, payloads: &mut Vec<(u64, Bytes)>) {
    for t in &mut g.initializer {
        moved(t, location, end, payloads);
    }
    for node in &mut g.node {
        for a in &mut node.attribute {
            for body in a.g.iter_mut().chain(a.graphs.iter_mut()) {
                graph(body, location, end, payloads);
            }
        }
    }
}

fn moved(t: &mut TensorProto, location: &str, end: &mut u64, payloads: &mut Vec<(u64, Bytes)>) {
    if t.is_external() {
        return;
    }
    let Some(data) = t.raw_data.take_if(|d| d.len() >= SMALLEST) else { return };
    let align: u64 = if data.len() >= 64 << 10 { 64 << 10 } else { 4 << 10 };
    let offset = end.div_ceil(align) * align;
    *end = offset + data.len() as u64;
    let entry = |key: &str, value: String| StringStringEntryProto { key: Some(key.into()), value: Some(value) };
    t.external_data = vec![
        entry("location", location.to_string()),
        entry("offset", offset.to_string()),
        entry("length", data.len().to_string()),
    ];
    t.data_location = Some(DataLocation::External as i32);
    payloads.push((offset, data));
}

/// Writes the payloads at their offsets (a payload of the input goes from
/// file to file in the kernel, as a model's do).
pub fn write(payloads: &[(u64, Bytes)], file: &mut File) -> std::io::Result<()> {
    let zeros = vec![0u8; 64 << 10];
    let mut sink = FileSink::new(file);
    let mut at = 0u64;
    for (offset, data) in payloads {
        // Below 64 KiB of padding each: one write.
        sink.write(&zeros[..(offset - at) as usize]);
        sink.write(data);
        at = offset + data.len() as u64;
    }
    sink.finish()
}
