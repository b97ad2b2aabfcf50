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

/// The first field in `bytes` (a serialized `ModelProto`) that the schema
/// does not define, if any. Err when the bytes are not valid protobuf.
pub fn find_unknown_field(bytes: &[u8]) -> Result<Option<UnknownField>, String> {
    walk(schema(), ".onnx.ModelProto", bytes, &mut String::new(), 0)
}

/// Messages nest at most this deep: prost's own decoding limit, so a model
/// this walk accepts is one prost can decode (and no input overflows the
/// stack here).
pub const MAX_DEPTH: usize = 100;

fn walk(
    schema: &Schema,
    message: &str,
    mut buf: &[u8],
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
    while !buf.is_empty() {
        let key = varint(&mut buf)?;
        let number = (key >> 3) as u32;
        let wire = key & 7;
        let Some(field) = fields.get(&number) else {
            return Ok(Some(UnknownField {
                message: message.trim_start_matches('.').to_string(),
                number,
                path: if path.is_empty() { "top level".into() } else { path.clone() },
            }));
        };
        match wire {
            0 => {
                varint(&mut buf)?;
            }
            1 => buf = buf.get(8..).ok_or("truncated fixed64")?,
            5 => buf = buf.get(4..).ok_or("truncated fixed32")?,
            2 => {
                let len = usize::try_from(varint(&mut buf)?).map_err(|_| "length overflow")?;
                let payload = buf.get(..len).ok_or("truncated length-delimited field")?;
                buf = &buf[len..];
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
                    if let Some(found) = walk(schema, nested, payload, path, depth + 1)? {
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

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first().ok_or("truncated varint")?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}
