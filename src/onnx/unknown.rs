//! Finds fields our schema does not define, before prost silently drops them.
//!
//! The walk follows the wire format guided by the descriptor set that
//! `build.rs` compiled from `proto/onnx.proto`: every field number of every
//! message, at any depth, must be one the schema knows. Length-delimited
//! payloads that are not messages (tensor data among them) are skipped
//! without being read, so the walk costs little even on large models.
//! Packed and unpacked encodings of a repeated scalar are both fine: prost
//! reads either.

use std::collections::HashMap;
use std::sync::OnceLock;

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};

static DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/onnx_descriptor.bin"));

/// A field the schema does not define, with where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownField {
    /// The message type that holds it, e.g. `onnx.NodeProto`.
    pub message: String,
    pub number: u32,
    /// The path of known fields leading to it, e.g. `graph.node[3]`.
    pub path: String,
}

impl std::fmt::Display for UnknownField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "field number {} of {} at {}", self.number, self.message, self.path)
    }
}

/// One field of the schema: its name, its message type if it is one, and
/// whether it repeats (paths index only repeated fields).
struct Field {
    name: String,
    message: Option<String>,
    repeated: bool,
}

type Schema = HashMap<String, HashMap<u32, Field>>;

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let set = FileDescriptorSet::decode(DESCRIPTOR).expect("descriptor set compiled by build.rs");
        let mut schema = Schema::new();
        for file in &set.file {
            let package = file.package();
            for message in &file.message_type {
                collect(&mut schema, &format!(".{package}"), message);
            }
        }
        schema
    })
}

fn collect(schema: &mut Schema, scope: &str, message: &DescriptorProto) {
    let full = format!("{scope}.{}", message.name());
    let fields = message
        .field
        .iter()
        .map(|f| {
            let field = Field {
                name: f.name().to_string(),
                message: (f.r#type() == Type::Message).then(|| f.type_name().to_string()),
                repeated: f.label() == Label::Repeated,
            };
            (f.number() as u32, field)
        })
        .collect();
    for nested in &message.nested_type {
        collect(schema, &full, nested);
    }
    schema.insert(full, fields);
}

/// Bytes the walk reads: a slice, or a file read in windows
/// (`io::framing`, which never touches the map).
pub trait Source {
    fn len(&self) -> usize;
    fn byte(&self, at: usize) -> Option<u8>;
}

impl Source for [u8] {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }

    fn byte(&self, at: usize) -> Option<u8> {
        self.get(at).copied()
    }
}

/// The first field in `bytes` (a serialized `ModelProto`) that the schema
/// does not define, if any. Err when the bytes are not valid protobuf.
pub fn find_unknown_field(bytes: &[u8]) -> Result<Option<UnknownField>, String> {
    find_unknown_field_in(bytes)
}

/// `find_unknown_field` over any source of the bytes.
pub fn find_unknown_field_in(bytes: &(impl Source + ?Sized)) -> Result<Option<UnknownField>, String> {
    walk(schema(), ".onnx.ModelProto", bytes, 0, bytes.len(), &mut String::new(), 0)
}

/// Messages nest at most this deep: prost's own decoding limit, so a model
/// this walk accepts is one prost can decode (and no input overflows the
/// stack here).
pub const MAX_DEPTH: usize = 100;

/// The message `message` in `bytes[at..end]`.
fn walk(
    schema: &Schema,
    message: &str,
    bytes: &(impl Source + ?Sized),
    mut at: usize,
    end: usize,
    path: &mut String,
    depth: usize,
) -> Result<Option<UnknownField>, String> {
    if depth >= MAX_DEPTH {
        return Err(format!(
            "messages nest more than {MAX_DEPTH} deep (subgraphs inside subgraphs), more than onnx-fuse reads"
        ));
    }
    let fields = &schema[message];
    let mut counts: HashMap<u32, usize> = HashMap::new();
    while at < end {
        let key = varint(bytes, &mut at, end)?;
        let number = (key >> 3) as u32;
        let wire = key & 7;
        let Some(field) = fields.get(&number) else {
            return Ok(Some(UnknownField {
                message: message.trim_start_matches('.').to_string(),
                number,
                path: if path.is_empty() { "top level".into() } else { path.clone() },
            }));
        };
        let skip = |at: &mut usize, n: usize, what: &str| -> Result<(), String> {
            *at = at.checked_add(n).filter(|&a| a <= end).ok_or_else(|| format!("truncated {what}"))?;
            Ok(())
        };
        match wire {
            0 => {
                varint(bytes, &mut at, end)?;
            }
            1 => skip(&mut at, 8, "fixed64")?,
            5 => skip(&mut at, 4, "fixed32")?,
            2 => {
                let len = usize::try_from(varint(bytes, &mut at, end)?).map_err(|_| "length overflow")?;
                let payload = at;
                skip(&mut at, len, "length-delimited field")?;
                if let Some(nested) = &field.message {
                    let index = counts.entry(number).or_default();
                    let mark = path.len();
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(&field.name);
                    if field.repeated {
                        path.push_str(&format!("[{index}]"));
                    }
                    *index += 1;
                    if let Some(found) = walk(schema, nested, bytes, payload, at, path, depth + 1)? {
                        return Ok(Some(found));
                    }
                    path.truncate(mark);
                }
            }
            other => return Err(format!("unsupported wire type {other} in {message}")),
        }
    }
    Ok(None)
}

fn varint(bytes: &(impl Source + ?Sized), at: &mut usize, end: usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = if *at < end { bytes.byte(*at) } else { None }.ok_or("truncated varint")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}
