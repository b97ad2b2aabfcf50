//! The ONNX types generated from `proto/onnx.proto`, and the few accessors
//! every other module needs to read nodes, attributes and small tensors.

pub mod proto {
    #![allow(clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
pub mod rows;
pub mod unknown;

pub use proto::{
    attribute_proto::AttributeType, tensor_proto::DataType, AttributeProto, FunctionProto, GraphProto, ModelProto,
    NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto, TypeProto, ValueInfoProto,
};

/// The metadata key every replacement node carries (spec, ground rule 6).
pub const FUSED_KEY: &str = "transmuter.fused";

/// The metadata key of a fused guard (`If`): the op it runs where the guard
/// holds (`Attention`), the original ops elsewhere.
pub const RUNS_KEY: &str = "transmuter.runs";

/// The domain of onnx-fuse's own ops (`AttentionCore`), each with a
/// model-local function so every runtime can run it.
pub const TRANSMUTER_DOMAIN: &str = "transmuter";

/// ONNX Runtime's own operators' domain.
pub const MICROSOFT: &str = "com.microsoft";

impl NodeProto {
    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.attribute.iter().find(|a| a.name() == name)
    }

    pub fn attr_int(&self, name: &str) -> Option<i64> {
        self.attr(name).map(|a| a.i())
    }

    pub fn attr_float(&self, name: &str) -> Option<f32> {
        self.attr(name).map(|a| a.f())
    }

    pub fn attr_ints(&self, name: &str) -> Option<&[i64]> {
        self.attr(name).map(|a| a.ints.as_slice())
    }

    /// An `Einsum`'s equation as its input terms and output term, without
    /// whitespace; none without an explicit output (`->`).
    pub fn einsum_terms(&self) -> Option<(Vec<String>, String)> {
        let equation = std::str::from_utf8(self.attr("equation")?.s.as_deref()?).ok()?;
        let equation: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
        let (inputs, output) = equation.split_once("->")?;
        Some((inputs.split(',').map(str::to_string).collect(), output.to_string()))
    }

    /// True for an operator of the default ONNX domain with this op type.
    pub fn is(&self, op_type: &str) -> bool {
        self.op_type() == op_type && is_default_domain(self.domain())
    }

    pub fn metadata(&self, key: &str) -> Option<&str> {
        self.metadata_props.iter().find(|p| p.key() == key).map(|p| p.value())
    }

    /// Every graph held in this node's attributes (`If`, `Loop`, `Scan`
    /// bodies and any other graph-valued attribute).
    pub fn subgraphs(&self) -> impl Iterator<Item = &GraphProto> {
        self.attribute.iter().flat_map(|a| a.g.iter().chain(a.graphs.iter()))
    }

    pub fn subgraphs_mut(&mut self) -> impl Iterator<Item = &mut GraphProto> {
        self.attribute.iter_mut().flat_map(|a| a.g.iter_mut().chain(a.graphs.iter_mut()))
    }
}

/// A node's name, or `<first output>` for an unnamed node: how messages,
/// reports and provenance name a node.
pub fn display_name(node: &NodeProto) -> String {
    if node.name().is_empty() {
        format!("<{}>", node.output.first().map_or("", String::as_str))
    } else {
        node.name().to_string()
    }
}

pub fn is_default_domain(domain: &str) -> bool {
    domain.is_empty() || domain == "ai.onnx"
}

/// The opset ONNX Runtime (1.31.1, measured) reads the default domain at
/// when a model uses it without importing it: its newest.
pub const IMPLIED_DEFAULT_OPSET: i64 = 26;

/// Domains ONNX Runtime resolves for a model that uses them without
/// importing them (measured, 1.31.1); any other is refused.
pub fn is_implied_domain(domain: &str) -> bool {
    is_default_domain(domain) || domain == "ai.onnx.ml" || domain == "com.microsoft"
}

impl AttributeProto {
    pub fn int(name: &str, value: i64) -> Self {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Int as i32),
            i: Some(value),
            ..Default::default()
        }
    }

    pub fn string(name: &str, value: &str) -> Self {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::String as i32),
            s: Some(bytes::Bytes::copy_from_slice(value.as_bytes())),
            ..Default::default()
        }
    }

    pub fn tensor(name: &str, value: TensorProto) -> Self {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Tensor as i32),
            t: Some(value),
            ..Default::default()
        }
    }

    pub fn float(name: &str, value: f32) -> Self {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Float as i32),
            f: Some(value),
            ..Default::default()
        }
    }

    pub fn ints(name: &str, values: &[i64]) -> Self {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Ints as i32),
            ints: values.to_vec(),
            ..Default::default()
        }
    }

    pub fn graph(name: &str, body: GraphProto) -> Self {
        AttributeProto {
            name: Some(name.into()),
            r#type: Some(AttributeType::Graph as i32),
            g: Some(body),
            ..Default::default()
        }
    }
}

impl StringStringEntryProto {
    pub fn new(key: &str, value: String) -> Self {
        StringStringEntryProto { key: Some(key.into()), value: Some(value) }
    }
}

impl GraphProto {
    /// The inputs a run feeds: those no initializer gives a default (an
    /// initializer of an input's name is a default a feed may replace).
    pub fn fed_inputs(&self) -> impl Iterator<Item = &ValueInfoProto> + '_ {
        let defaults: std::collections::HashSet<&str> = self.initializer.iter().map(|t| t.name()).collect();
        self.input.iter().filter(move |i| !defaults.contains(i.name()))
    }
}

impl ModelProto {
    /// The opset version imported for the default domain (1 when absent, as
    /// the IR spec says for a model that imports none).
    /// The default domain's opset: as imported, or as ONNX Runtime resolves
    /// it for a model that uses the domain without importing it.
    pub fn default_opset(&self) -> i64 {
        self.imported_default_opset().unwrap_or(IMPLIED_DEFAULT_OPSET)
    }

    /// The default domain's opset, if the model imports it.
    pub fn imported_default_opset(&self) -> Option<i64> {
        self.opset_import.iter().find(|o| is_default_domain(o.domain())).map(|o| o.version())
    }
}

/// The floating-point element types onnx-fuse reasons about by name.
pub const FLOAT: i32 = DataType::Float as i32;
pub const FLOAT16: i32 = DataType::Float16 as i32;
pub const BFLOAT16: i32 = DataType::Bfloat16 as i32;
pub const DOUBLE: i32 = DataType::Double as i32;
pub const INT64: i32 = DataType::Int64 as i32;
pub const INT32: i32 = DataType::Int32 as i32;
pub const UINT32: i32 = DataType::Uint32 as i32;
pub const UINT64: i32 = DataType::Uint64 as i32;
pub const BOOL: i32 = DataType::Bool as i32;

/// Whether tensors of this element type hold the sizes of a shape,
/// where exports cast them to compute: exactly up to `exact_up_to`.
pub fn holds_sizes(elem_type: i32) -> bool {
    exact_up_to(elem_type).is_some()
}

/// The largest magnitude up to which this element type holds every whole
/// number exactly (a size past it wraps or rounds): 2^24 for float, 2^53
/// for double, 2^31 − 1 for int32; none where it holds no size.
pub fn exact_up_to(elem_type: i32) -> Option<i64> {
    use DataType::*;
    let bound = match DataType::try_from(elem_type).ok()? {
        Int64 | Uint64 => i64::MAX,
        Int32 => i64::from(i32::MAX),
        Uint32 => i64::from(u32::MAX),
        Float => 1 << 24,
        Double => 1 << 53,
        _ => return None,
    };
    Some(bound)
}

/// Whether tensors of this element type hold integers (division truncates).
pub fn is_integer(elem_type: i32) -> bool {
    use DataType::*;
    [Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64].iter().any(|&t| t as i32 == elem_type)
}

impl TensorProto {
    /// Number of elements the dims describe (1 for a scalar).
    pub fn numel(&self) -> Option<u64> {
        self.dims.iter().try_fold(1u64, |n, &d| u64::try_from(d).ok().and_then(|d| n.checked_mul(d)))
    }

    /// Where a tensor's bytes in external data are: its location, offset
    /// (0 where not given) and length; None where it gives no location or
    /// no length.
    pub fn external_span(&self) -> Option<[String; 3]> {
        let entry = |key: &str| self.external_data.iter().find(|e| e.key() == key).map(|e| e.value().to_string());
        Some([entry("location")?, entry("offset").unwrap_or_else(|| "0".into()), entry("length")?])
    }

    pub fn is_external(&self) -> bool {
        self.data_location == Some(proto::tensor_proto::DataLocation::External as i32)
    }

    /// The single value of a one-element tensor, exactly (every type we read
    /// widens to f64 without rounding). None for anything else: more than
    /// one element, external data, or a type that is not a number.
    pub fn scalar(&self) -> Option<f64> {
        if self.numel()? != 1 || self.is_external() {
            return None;
        }
        self.values().and_then(|v| v.into_iter().next())
    }

    /// All values of a small numeric tensor as f64 (integers up to 2^53 are
    /// exact, which covers axes and indices). None for external data or
    /// types we do not read. A described payload (`rows`) is composed.
    pub fn values(&self) -> Option<Vec<f64>> {
        if self.is_external() {
            return None;
        }
        let n = usize::try_from(self.numel()?).ok()?;
        let composed = self.raw_data.as_deref().filter(|r| r.len() >= rows::DESCRIBED).and_then(rows::composed);
        let raw = composed.as_deref().or(self.raw_data.as_deref());
        let from_raw = |size: usize, f: &dyn Fn(&[u8]) -> f64| -> Option<Vec<f64>> {
            let raw = raw?;
            (raw.len() == n * size).then(|| raw.chunks_exact(size).map(f).collect())
        };
        let arr = |b: &[u8]| -> [u8; 8] {
            let mut a = [0u8; 8];
            a[..b.len()].copy_from_slice(b);
            a
        };
        let values: Vec<f64> = match DataType::try_from(self.data_type()).ok()? {
            DataType::Float if raw.is_some() => from_raw(4, &|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)?,
            DataType::Float => self.float_data.iter().map(|&v| v as f64).collect(),
            DataType::Double if raw.is_some() => from_raw(8, &|b| f64::from_le_bytes(arr(b)))?,
            DataType::Double => self.double_data.clone(),
            DataType::Float16 if raw.is_some() => from_raw(2, &|b| half::f16::from_le_bytes([b[0], b[1]]).to_f64())?,
            DataType::Float16 => self.int32_data.iter().map(|&v| half::f16::from_bits(v as u16).to_f64()).collect(),
            DataType::Bfloat16 if raw.is_some() => from_raw(2, &|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f64())?,
            DataType::Bfloat16 => self.int32_data.iter().map(|&v| half::bf16::from_bits(v as u16).to_f64()).collect(),
            DataType::Int64 if raw.is_some() => from_raw(8, &|b| i64::from_le_bytes(arr(b)) as f64)?,
            DataType::Int64 => self.int64_data.iter().map(|&v| v as f64).collect(),
            DataType::Int32 if raw.is_some() => from_raw(4, &|b| i32::from_le_bytes(b.try_into().unwrap()) as f64)?,
            DataType::Int8 if raw.is_some() => from_raw(1, &|b| b[0] as i8 as f64)?,
            DataType::Uint8 | DataType::Bool if raw.is_some() => from_raw(1, &|b| b[0] as f64)?,
            DataType::Int32 | DataType::Int8 | DataType::Uint8 | DataType::Bool => {
                self.int32_data.iter().map(|&v| v as f64).collect()
            }
            _ => return None,
        };
        (values.len() == n).then_some(values)
    }

    /// Whether `other` holds this tensor's type, shape and payload, bit for
    /// bit and encoded alike (raw bytes, or the same typed field: 0 is not
    /// -0, and no integer is read through a float). A tensor in external
    /// data or in segments is no other's.
    pub fn same_content(&self, other: &TensorProto) -> bool {
        let floats = |t: &TensorProto| -> Vec<u32> { t.float_data.iter().map(|v| v.to_bits()).collect() };
        let doubles = |t: &TensorProto| -> Vec<u64> { t.double_data.iter().map(|v| v.to_bits()).collect() };
        let whole = |t: &TensorProto| !t.is_external() && t.segment.is_none();
        whole(self)
            && whole(other)
            && self.data_type == other.data_type
            && self.dims == other.dims
            && self.raw_data == other.raw_data
            && self.int32_data == other.int32_data
            && self.int64_data == other.int64_data
            && self.uint64_data == other.uint64_data
            && self.string_data == other.string_data
            && floats(self) == floats(other)
            && doubles(self) == doubles(other)
    }

    /// The values of a small integer tensor (axes, indices, shapes).
    pub fn ints(&self) -> Option<Vec<i64>> {
        if !matches!(self.data_type(), INT64) && self.data_type() != DataType::Int32 as i32 {
            return None;
        }
        Some(self.values()?.into_iter().map(|v| v as i64).collect())
    }
}

/// An element type's name as ONNX spells it, lower case (`float`, `float16`, `int64`).
pub fn type_name(elem_type: i32) -> String {
    DataType::try_from(elem_type).map_or_else(|_| elem_type.to_string(), |t| t.as_str_name().to_ascii_lowercase())
}

/// An element type for a reason: its name, or `unknown`.
pub fn type_text(elem_type: Option<i32>) -> String {
    elem_type.map_or_else(|| "unknown".to_string(), type_name)
}
