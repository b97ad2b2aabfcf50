//! Inputs for a verification run: checking the user's options, sizes for
//! symbolic dimensions (given, or suggested by the graph), synthesized or
//! `.npz` values.

use super::*;

/// The symbolic dimensions of the inputs the model is fed (not those an
/// initializer gives a default).
pub(super) fn input_symbols(model: &ModelProto) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    for (_, symbols) in symbols_by_input(model) {
        for p in symbols {
            if !found.contains(&p) {
                found.push(p);
            }
        }
    }
    found
}

/// Each graph input (not an initializer) with the symbolic dimensions of
/// its declared shape, in order.
pub(super) fn symbols_by_input(model: &ModelProto) -> Vec<(String, Vec<String>)> {
    let Some(graph) = &model.graph else { return Vec::new() };
    let mut found = Vec::new();
    for vi in graph.fed_inputs() {
        if let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            let symbols = t.shape.iter().flat_map(|s| &s.dim).filter_map(|d| match &d.value {
                Some(Dim::DimParam(p)) => Some(p.clone()),
                _ => None,
            });
            found.push((vi.name().to_string(), symbols.collect()));
        }
    }
    found
}

/// The names of the arrays `--inputs` holds (none without it, or where it
/// cannot be read: `check_options` says why).
fn npz_arrays(options: &Options) -> std::collections::HashSet<String> {
    let Some(path) = &options.inputs else { return Default::default() };
    npyz::npz::NpzArchive::open(path).map(|a| a.array_names().map(str::to_string).collect()).unwrap_or_default()
}

/// An input's shape at the sizes its symbols get (unknown axes: 1).
fn input_shape(t: &crate::onnx::proto::type_proto::Tensor, dims: &HashMap<String, i64>) -> Vec<i64> {
    let value = |d: &crate::onnx::proto::tensor_shape_proto::Dimension| match &d.value {
        Some(Dim::DimValue(v)) if *v >= 0 => *v,
        Some(Dim::DimParam(p)) => symbol_value(p, dims),
        // No axis declared, or a negative number (an unknown axis to ONNX Runtime).
        _ => 1,
    };
    t.shape.iter().flat_map(|s| &s.dim).map(value).collect()
}

/// The symbols whose values the user set: by `--dim`, or as axes of an
/// input given in `--inputs` (its array's shape sets them).
pub(super) fn given_symbols(model: &ModelProto, options: &Options) -> std::collections::HashSet<String> {
    let mut given: std::collections::HashSet<String> = options.dims.keys().cloned().collect();
    let arrays = npz_arrays(options);
    for vi in model.graph.iter().flat_map(|g| &g.input).filter(|i| arrays.contains(i.name())) {
        if let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            for d in t.shape.iter().flat_map(|s| &s.dim) {
                if let Some(Dim::DimParam(p)) = &d.value {
                    given.insert(p.clone());
                }
            }
        }
    }
    given
}

/// Sizes a symbolic dimension may need, from what the graph proves: image
/// sides whose patch grid a position table fixes (a Conv of stride s
/// applied to the image, and a table of n = k² or k² + 1 rows: side k·s),
/// the sizes written into constant Reshape/Expand/ConstantOfShape/Tile
/// shapes, then the sizes of the weights' axes.
pub(super) fn candidate_sizes(model: &ModelProto) -> Vec<i64> {
    let Some(g) = &model.graph else { return vec![] };
    let dims: std::collections::BTreeSet<i64> =
        g.initializer.iter().flat_map(|t| t.dims.iter().copied()).filter(|&d| d > 1 && d <= 4096).collect();
    let strides: std::collections::BTreeSet<i64> = g
        .node
        .iter()
        .filter(|n| n.is("Conv"))
        .filter_map(|n| n.attr_ints("strides").and_then(|s| s.first().copied()))
        .filter(|&s| s > 1)
        .collect();
    // Sizes written into shapes: an export traced at one length may have
    // kept it in a Reshape or Expand target.
    let constants = main_constants(model);
    let mut shaped = std::collections::BTreeSet::new();
    for n in g.node.iter().filter(|n| n.is("Reshape") || n.is("Expand") || n.is("ConstantOfShape") || n.is("Tile")) {
        let shape = if n.is("ConstantOfShape") { n.input.first() } else { n.input.get(1) };
        if let Some(ints) = shape.and_then(|v| constants.get(v.as_str())).and_then(|t| t.ints()) {
            shaped.extend(ints.into_iter().filter(|&d| d > 1 && d <= 4096));
        }
    }
    let mut sizes = Vec::new();
    for &n in &dims {
        for rows in [n, n - 1] {
            let k = (rows as f64).sqrt().round() as i64;
            if k > 1 && k * k == rows {
                sizes.extend(strides.iter().map(|s| k * s));
            }
        }
    }
    sizes.extend(shaped.iter());
    sizes.extend(dims.iter().rev());
    let mut seen = std::collections::HashSet::new();
    sizes.retain(|s| seen.insert(*s));
    sizes
}

/// One input tensor, synthesized.
pub(super) struct Input {
    pub(super) name: String,
    pub(super) shape: Vec<i64>,
    pub(super) data: Data,
}

pub(super) enum Data {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    /// The integers of 8, 16 and 32 bits and u64 (quantized models' data),
    /// of the element type named.
    Small(DataType, Vec<i64>),
}

/// `$of!(T)` for the Rust type `T` of a `Data::Small` element type `$t`.
macro_rules! small_type {
    ($t:expr, $of:ident) => {
        match $t {
            DataType::Int8 => $of!(i8),
            DataType::Uint8 => $of!(u8),
            DataType::Int16 => $of!(i16),
            DataType::Uint16 => $of!(u16),
            DataType::Uint32 => $of!(u32),
            _ => $of!(u64),
        }
    };
}

impl Input {
    /// An input fed with a value the original computed.
    pub(super) fn from_values(name: &str, v: &Values) -> Result<Input> {
        let data = match DataType::try_from(v.elem_type) {
            Ok(DataType::Float) => Data::F32(v.data.iter().map(|&x| x as f32).collect()),
            Ok(DataType::Float16) => Data::F16(v.data.iter().map(|&x| half::f16::from_f64(x)).collect()),
            Ok(DataType::Bfloat16) => Data::Bf16(v.data.iter().map(|&x| half::bf16::from_f64(x)).collect()),
            Ok(DataType::Double) => Data::F64(v.data.clone()),
            Ok(DataType::Int64) => Data::I64(v.data.iter().map(|&x| x as i64).collect()),
            Ok(DataType::Int32) => Data::I32(v.data.iter().map(|&x| x as i32).collect()),
            Ok(DataType::Bool) => Data::Bool(v.data.iter().map(|&x| x != 0.0).collect()),
            Ok(t) if is_small(t) => Data::Small(t, v.data.iter().map(|&x| x as i64).collect()),
            _ => bail!("{name} has an element type onnx-fuse cannot feed back ({})", v.elem_type),
        };
        Ok(Input { name: name.to_string(), shape: v.shape.clone(), data })
    }

    /// The input as the values a run returns.
    pub(super) fn values(&self) -> Values {
        let (elem_type, data): (DataType, Vec<f64>) = match &self.data {
            Data::F32(v) => (DataType::Float, v.iter().map(|&x| x as f64).collect()),
            Data::F16(v) => (DataType::Float16, v.iter().map(|x| x.to_f64()).collect()),
            Data::Bf16(v) => (DataType::Bfloat16, v.iter().map(|x| x.to_f64()).collect()),
            Data::F64(v) => (DataType::Double, v.clone()),
            Data::I64(v) => (DataType::Int64, v.iter().map(|&x| x as f64).collect()),
            Data::I32(v) => (DataType::Int32, v.iter().map(|&x| x as f64).collect()),
            Data::Bool(v) => (DataType::Bool, v.iter().map(|&x| f64::from(u8::from(x))).collect()),
            Data::Small(t, v) => (*t, v.iter().map(|&x| x as f64).collect()),
        };
        Values { elem_type: elem_type as i32, shape: self.shape.clone(), data }
    }

    pub(super) fn to_value(&self) -> Result<DynValue> {
        let shape = self.shape.clone();
        let value = match &self.data {
            Data::F32(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::F16(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::Bf16(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::F64(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::I64(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::I32(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::Bool(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::Small(t, v) => {
                macro_rules! of {
                    ($ty:ty) => {
                        Tensor::from_array((shape, v.iter().map(|&x| x as $ty).collect::<Vec<$ty>>()))
                            .map(|t| t.into_dyn())
                    };
                }
                small_type!(t, of)
            }
        };
        value.map_err(|e| anyhow!("cannot make input {}: {e}", self.name))
    }
}

/// Checks what a user asked of the inputs against the model, before any
/// run: every `--dim` names a symbolic dimension of an input, every array
/// of `--inputs` is named like an input and stored in C order. The error is
/// the user's to fix (a usage error).
pub fn check_options(model: &ModelProto, options: &Options) -> std::result::Result<(), String> {
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    let inputs: Vec<&ValueInfoProto> = graph.fed_inputs().collect();
    let mut symbols = std::collections::BTreeSet::new();
    for p in input_symbols(model) {
        symbols.extend(p.split('+').map(|t| t.trim().to_string()).filter(|t| t.parse::<i64>().is_err()));
        symbols.insert(p);
    }
    for name in options.dims.keys() {
        if !symbols.contains(name) {
            let known: Vec<&str> = symbols.iter().map(String::as_str).collect();
            return Err(format!(
                "--dim {name}: no input of the model has a dimension of that name (it has: {})",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ));
        }
    }
    check_budget(model, options, memory_available())?;
    if let Some(path) = &options.inputs {
        let mut archive =
            npyz::npz::NpzArchive::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        let names: Vec<String> = archive.array_names().map(str::to_string).collect();
        if names.is_empty() {
            // Nothing in it would be used: every input would be made up.
            return Err(format!("{}: the .npz holds no array (--inputs gives the model's inputs)", path.display()));
        }
        for name in names {
            if !inputs.iter().any(|i| i.name() == name) {
                let known: Vec<&str> = inputs.iter().map(|i| i.name()).collect();
                return Err(format!(
                    "{}: array {name:?} is named like no input of the model (its inputs: {})",
                    path.display(),
                    known.join(", ")
                ));
            }
            let array = archive.by_name(&name).map_err(|e| format!("{}: array {name:?}: {e}", path.display()))?;
            if array.is_some_and(|a| a.order() == npyz::Order::Fortran) {
                return Err(format!(
                    "{}: array {name:?} is stored in Fortran order; save it in C order (numpy.ascontiguousarray)",
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

/// The value of a symbolic dimension: given by `--dim`, or the default for
/// its name; a sum such as `past_sequence_length + 1` (Optimum writes these)
/// adds up its terms.
pub(super) fn symbol_value(symbol: &str, given: &HashMap<String, i64>) -> i64 {
    if let Some(&v) = given.get(symbol) {
        return v;
    }
    if symbol.contains('+') {
        return symbol.split('+').map(|t| t.trim()).map(|t| t.parse().unwrap_or_else(|_| symbol_value(t, given))).sum();
    }
    default_dim(symbol)
}

/// Whether a symbol names a batch size (`batch`, `batch_size`,
/// `text_batch_size` …): 2 by default, and not varied as other sizes are.
pub(super) fn is_batch(symbol: &str) -> bool {
    symbol.to_ascii_lowercase().contains("batch")
}

/// A symbol's value when the user gave none: sequence-like names get a
/// length that exercises masks and softmax, everything else a small size.
pub(super) fn default_dim(symbol: &str) -> i64 {
    if is_batch(symbol) {
        2
    } else if symbol.to_ascii_lowercase().contains("past") {
        3
    } else {
        7
    }
}

/// The symbols of `unset` whose number the model's shapes prove (every
/// run needs it: an image's channels, from its Conv's weight).
pub(super) fn proved_symbols(model: &ModelProto, unset: &[&String]) -> BTreeMap<String, i64> {
    let Some(graph) = model.graph.as_ref() else { return BTreeMap::new() };
    let scope = Scope::default();
    let view = crate::graph::Graph::new(graph, model.default_opset(), &scope);
    let shapes = view.shapes();
    unset.iter().filter_map(|s| Some((s.to_string(), shapes.proved_symbol(s).filter(|&n| n >= 0)?))).collect()
}

/// Inputs from the declared graph inputs: token ids within the vocabulary
/// the embedding that reads them implies, attention masks of ones, position
/// ids counting up, token type ids of zero, floats uniform in [-1, 1) from
/// a fixed seed.
pub(super) fn synthesize_inputs(model: &ModelProto, options: &Options) -> Result<Vec<Input>> {
    let graph = model.graph.as_ref().ok_or_else(|| anyhow!("the model has no graph"))?;
    let scope = Scope::default();
    let view = crate::graph::Graph::new(graph, model.default_opset(), &scope);
    let mut rng = SplitMix(options.seed ^ 0x6f6e_6e78_6675_7365);
    let mut given = match &options.inputs {
        Some(path) => Some(
            npyz::npz::NpzArchive::open(path)
                .map_err(|e| anyhow!("{}: cannot read the inputs: {e}", path.display()))?,
        ),
        None => None,
    };
    let mut inputs = Vec::new();
    for vi in graph.fed_inputs() {
        let name = vi.name().to_string();
        let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            bail!("input {name} is not a tensor; onnx-fuse can only feed tensors");
        };
        if let Some(archive) = given.as_mut() {
            let path = options.inputs.as_deref().unwrap_or(Path::new(""));
            if let Some(input) =
                read_npz(archive, &name, t.elem_type()).map_err(|e| anyhow!("{}: array {name}: {e}", path.display()))?
            {
                inputs.push(input);
                continue;
            }
        }
        let shape = input_shape(t, &options.dims);
        let n = shape.iter().product::<i64>().max(0) as usize;
        let lower = name.to_ascii_lowercase();
        let ints = |rng: &mut SplitMix| -> Vec<i64> {
            if lower.contains("mask") {
                vec![1; n]
            } else if lower.contains("position") {
                let last = *shape.last().unwrap_or(&1) as usize;
                (0..n).map(|i| (i % last.max(1)) as i64).collect()
            } else if lower.contains("type") {
                vec![0; n]
            } else {
                let vocab = vocabulary(&view, vi.name()).unwrap_or(2);
                (0..n).map(|_| (rng.next() % vocab as u64) as i64).collect()
            }
        };
        let mut floats = |n: usize| -> Vec<f64> {
            let mut values: Vec<f64> = (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect();
            if options.specials && n > 0 && rng.next() % 2 == 0 {
                const SPECIALS: [f64; 6] =
                    [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f32::MIN as f64, f32::MAX as f64, -1e9];
                let at = (rng.next() % n as u64) as usize;
                values[at] = SPECIALS[(rng.next() % SPECIALS.len() as u64) as usize];
            }
            values
        };
        let data = match DataType::try_from(t.elem_type()) {
            Ok(DataType::Float) => Data::F32(floats(n).into_iter().map(|v| v as f32).collect()),
            Ok(DataType::Float16) => Data::F16(floats(n).into_iter().map(half::f16::from_f64).collect()),
            Ok(DataType::Bfloat16) => Data::Bf16(floats(n).into_iter().map(half::bf16::from_f64).collect()),
            Ok(DataType::Double) => Data::F64(floats(n)),
            Ok(DataType::Int64) => Data::I64(ints(&mut rng)),
            Ok(DataType::Int32) => Data::I32(ints(&mut rng).into_iter().map(|v| v as i32).collect()),
            // With special values, a boolean (a mask's keep) is false one
            // time in four: hidden keys, and rows that hide every key.
            Ok(DataType::Bool) if options.specials => Data::Bool((0..n).map(|_| rng.next() % 4 != 0).collect()),
            Ok(DataType::Bool) => Data::Bool(vec![true; n]),
            // Bytes over their whole range (a quantized model's data); the
            // wider integers as int32 and int64 are.
            Ok(t @ (DataType::Int8 | DataType::Uint8)) => {
                let low = if t == DataType::Int8 { -128 } else { 0 };
                Data::Small(t, (0..n).map(|_| (rng.next() % 256) as i64 + low).collect())
            }
            Ok(t) if is_small(t) => Data::Small(t, ints(&mut rng)),
            _ => bail!("input {name} has an element type onnx-fuse cannot synthesize ({})", t.elem_type()),
        };
        inputs.push(Input { name, shape, data });
    }
    Ok(inputs)
}

/// The array named like an input, read as the input's element type.
pub(super) fn read_npz(
    archive: &mut npyz::npz::NpzArchive<std::io::BufReader<std::fs::File>>,
    name: &str,
    elem_type: i32,
) -> Result<Option<Input>> {
    let Some(array) = archive.by_name(name)? else { return Ok(None) };
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    let dtype = array.dtype().descr();
    let wrong = |e: std::io::Error| {
        anyhow!("its dtype {dtype} does not match the input's type ({}): {e}", type_name(elem_type))
    };
    let data = match DataType::try_from(elem_type) {
        Ok(DataType::Float) => Data::F32(array.into_vec().map_err(wrong)?),
        Ok(DataType::Float16) => Data::F16(array.into_vec().map_err(wrong)?),
        Ok(DataType::Double) => Data::F64(array.into_vec().map_err(wrong)?),
        Ok(DataType::Int64) => Data::I64(array.into_vec().map_err(wrong)?),
        Ok(DataType::Int32) => Data::I32(array.into_vec().map_err(wrong)?),
        Ok(DataType::Bool) => Data::Bool(array.into_vec().map_err(wrong)?),
        Ok(t) if is_small(t) => {
            macro_rules! of {
                ($ty:ty) => {
                    array.into_vec::<$ty>().map_err(wrong)?.into_iter().map(|x| x as i64).collect()
                };
            }
            Data::Small(t, small_type!(t, of))
        }
        _ => bail!("inputs of type {} cannot be read from .npz", type_name(elem_type)),
    };
    Ok(Some(Input { name: name.to_string(), shape, data }))
}

/// The integer types fed as `Data::Small`.
fn is_small(t: DataType) -> bool {
    matches!(
        t,
        DataType::Int8 | DataType::Uint8 | DataType::Int16 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64
    )
}

/// The row count of the first embedding table (`Gather` data) this input indexes.
pub(super) fn vocabulary(view: &crate::graph::Graph, input: &str) -> Option<i64> {
    view.consumers(input).iter().find_map(|&c| {
        let node = view.node(c);
        (node.is("Gather") && node.input.get(1).is_some_and(|i| i == input))
            .then(|| view.constant(&node.input[0]).and_then(|t| t.dims.first().copied()))
            .flatten()
            .filter(|&rows| rows > 0)
    })
}

/// A small deterministic generator (SplitMix64), so inputs depend on the
/// seed only (the fuzzer's cases too).
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What one input, or one value the model computes, may take of the memory
/// available: a quarter (inputs are held twice, once by ONNX Runtime, and
/// both models' values read back are compared side by side).
const BUDGET_SHARE: u128 = 4;

/// Bytes the machine can give the run: `MemAvailable`, or less where the
/// cgroup's limit leaves less; none where neither can be read.
pub(super) fn memory_available() -> Option<u128> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| -> Option<u128> {
        let line = meminfo.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u128>().ok().map(|k| k * 1024)
    };
    let available = kib("MemAvailable:")?;
    let read = |file: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{file}")).ok();
    let cgroup = (read("memory.max"), read("memory.current"));
    let left = match cgroup {
        (Some(max), Some(current)) => {
            max.trim().parse::<u128>().ok().map(|m| m.saturating_sub(current.trim().parse().unwrap_or(0)))
        }
        _ => None,
    };
    Some(left.map_or(available, |l| l.min(available)))
}

/// The size of a value at the sizes the inputs' symbols get (`--dim`, else
/// the defaults), where the model's ops give its shape in those symbols.
struct Sizes<'g, 'a> {
    view: &'g crate::graph::Graph<'a>,
    shapes: crate::shapes::Shapes<'g, 'a>,
    symbols: Vec<String>,
    dims: &'g HashMap<String, i64>,
}

/// A value's element type, dimensions and bytes (none: past 2^128).
type Sized = (i32, Vec<u128>, Option<u128>);

impl<'g, 'a> Sizes<'g, 'a> {
    fn new(view: &'g crate::graph::Graph<'a>, model: &ModelProto, dims: &'g HashMap<String, i64>) -> Self {
        Sizes { view, shapes: crate::shapes::Shapes::new(view), symbols: input_symbols(model), dims }
    }

    /// With `symbolic`, only values whose size the symbols set.
    fn of(&self, value: &str, symbolic: bool) -> Option<Sized> {
        let shape = self.shapes.shape(value)?;
        if symbolic && shape.iter().all(|d| d.value().is_some()) {
            return None;
        }
        let symbol = |s: &str| self.symbols.iter().any(|k| k == s).then(|| symbol_value(s, self.dims));
        let dims = shape.iter().map(|d| d.evaluate(&symbol)).collect::<Option<Vec<u128>>>()?;
        let elem_type = self.view.elem_type(value).unwrap_or(DataType::Float as i32);
        let bytes = dims.iter().try_fold(element_bytes(elem_type), |n, &d| n.checked_mul(d));
        Some((elem_type, dims, bytes))
    }
}

fn too_large(what: &str, (elem_type, dims, bytes): &Sized, share: &str, available: u128) -> String {
    let dims: Vec<String> = dims.iter().map(u128::to_string).collect();
    format!(
        "--verify: {what} would be {}[{}] ({}), more than {share} of the memory available ({}); \
         give smaller sizes with --dim NAME=VALUE",
        type_name(*elem_type),
        dims.join(", "),
        bytes.map_or("more than 2^128 bytes".to_string(), human_bytes),
        human_bytes(available)
    )
}

/// Refuses sizes the machine cannot hold before anything is allocated: every
/// input synthesized, and every value of the main graph whose size the
/// model's ops give in the inputs' symbols, at most a quarter of `available`
/// each. (A `--dim batch=100000000000` would otherwise end in an allocation
/// failure, which aborts.)
pub(super) fn check_budget(
    model: &ModelProto,
    options: &Options,
    available: Option<u128>,
) -> std::result::Result<(), String> {
    let (Some(graph), Some(available)) = (model.graph.as_ref(), available) else { return Ok(()) };
    let budget = available / BUDGET_SHARE;
    let given = npz_arrays(options);
    for vi in graph.fed_inputs().filter(|i| !given.contains(i.name())) {
        let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else { continue };
        let dims: Vec<u128> =
            input_shape(t, &options.dims).into_iter().map(|d| u128::try_from(d).unwrap_or(0)).collect();
        let bytes = dims.iter().try_fold(element_bytes(t.elem_type()), |n, &d| n.checked_mul(d));
        if bytes.is_none_or(|b| b > budget) {
            return Err(too_large(
                &format!("input {}", vi.name()),
                &(t.elem_type(), dims, bytes),
                "a quarter",
                available,
            ));
        }
    }
    let scope = Scope::default();
    let view = crate::graph::Graph::new(graph, model.default_opset(), &scope);
    let sizes = Sizes::new(&view, model, &options.dims);
    for value in graph.node.iter().flat_map(|n| &n.output).filter(|v| !v.is_empty()) {
        // Only sizes the symbols set: the model's own fixed sizes are its own.
        match sizes.of(value, true) {
            Some(sized) if sized.2.is_none_or(|b| b > budget) => {
                return Err(too_large(&format!("value {value}"), &sized, "a quarter", available))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Refuses a verification whose run would not fit, by an estimate: every
/// value of the main graph whose size the inputs' symbols set (ONNX Runtime
/// computes them all), plus the values compared (`kept`: fused nodes'
/// inputs and outputs, graph outputs) read back as f64. Measured, the peak
/// is about three times the estimate (GPT-2 at batch 100000: 3.5 GB, peak
/// 11.2 GB), so the estimate may take at most a quarter of `available`.
pub(super) fn check_kept(
    model: &ModelProto,
    options: &Options,
    kept: &[&str],
    available: Option<u128>,
) -> std::result::Result<(), String> {
    let (Some(graph), Some(available)) = (model.graph.as_ref(), available) else { return Ok(()) };
    let scope = Scope::default();
    let view = crate::graph::Graph::new(graph, model.default_opset(), &scope);
    let sizes = Sizes::new(&view, model, &options.dims);
    let computed = graph.node.iter().flat_map(|n| &n.output).map(String::as_str).filter(|v| !v.is_empty());
    let values = computed.map(|v| (v, sizes.of(v, true), 1)).chain(kept.iter().map(|&v| (v, sizes.of(v, true), 8)));
    let mut total: Option<u128> = Some(0);
    let mut largest: Option<(&str, Sized)> = None;
    for (value, sized, per_element) in values {
        let Some(sized) = sized else { continue };
        // Read back as f64: `per_element` bytes for each element.
        let bytes = if per_element == 1 { sized.2 } else { sized.2.map(|b| b / element_bytes(sized.0) * per_element) };
        total = total.zip(bytes).and_then(|(t, b)| t.checked_add(b));
        if largest.as_ref().is_none_or(|(_, l)| l.2.is_some() && sized.2.is_none_or(|b| Some(b) > l.2)) {
            largest = Some((value, sized));
        }
    }
    let Some((value, (elem_type, dims, bytes))) = largest else { return Ok(()) };
    if total.is_some_and(|t| t <= available / BUDGET_SHARE) {
        return Ok(());
    }
    let dims: Vec<String> = dims.iter().map(u128::to_string).collect();
    let size = |b: Option<u128>| b.map_or("more than 2^128 bytes".to_string(), human_bytes);
    Err(format!(
        "--verify: the values it computes and compares would take about {}, more than a quarter of the memory \
         available ({}); the largest is {value}, {}[{}] ({}); give smaller sizes with --dim NAME=VALUE",
        size(total),
        human_bytes(available),
        type_name(elem_type),
        dims.join(", "),
        size(bytes)
    ))
}

/// Bytes of one element as ONNX Runtime holds it (strings counted as 8: a pointer).
fn element_bytes(elem_type: i32) -> u128 {
    match DataType::try_from(elem_type) {
        Ok(DataType::Double | DataType::Int64 | DataType::Uint64 | DataType::Complex64 | DataType::String) => 8,
        Ok(DataType::Complex128) => 16,
        Ok(DataType::Float | DataType::Int32 | DataType::Uint32) => 4,
        Ok(DataType::Float16 | DataType::Bfloat16 | DataType::Int16 | DataType::Uint16) => 2,
        _ => 1,
    }
}

fn human_bytes(bytes: u128) -> String {
    let units = ["bytes", "KB", "MB", "GB", "TB", "PB", "EB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpt2() -> ModelProto {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/gpt2_ts_op14.onnx");
        crate::io::load(&path, Default::default()).expect("testdata loads").model
    }

    fn at_batch(batch: i64) -> Options {
        Options { dims: [("batch".to_string(), batch)].into(), ..Default::default() }
    }

    const GB: u128 = 1_000_000_000;

    #[test]
    fn an_input_larger_than_a_quarter_of_the_memory_is_refused_with_its_size() {
        let said = check_budget(&gpt2(), &at_batch(100_000_000_000), Some(24 * GB)).unwrap_err();
        assert!(said.starts_with("--verify: input input_ids would be int64[100000000000, 7] (5.6 TB)"), "{said}");
        // A product past 2^128 is refused too, not wrapped.
        let said = check_budget(&gpt2(), &at_batch(i64::MAX), Some(24 * GB)).unwrap_err();
        assert!(said.contains("int64[9223372036854775807, 7]"), "{said}");
        assert!(check_budget(&gpt2(), &at_batch(2), Some(24 * GB)).is_ok());
    }

    #[test]
    fn a_value_the_symbols_make_too_large_is_named() {
        // (The GPT-2 export's traced mask fixes its sequence at 7; BERT's
        // Optimum export keeps it free.)
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/bert_optimum.onnx");
        let bert = crate::io::load(&path, Default::default()).expect("testdata loads").model;
        let dims = Options { dims: [("sequence_length".to_string(), 100_000)].into(), ..Default::default() };
        let said = check_budget(&bert, &dims, Some(24 * GB)).unwrap_err();
        assert!(said.contains("value /Expand_output_0 would be int64[2, 1, 100000, 100000]"), "{said}");
    }

    #[test]
    fn values_that_fit_alone_but_not_together_are_refused() {
        let model = gpt2();
        let kept = ["/model/transformer/h.0/attn/c_attn/Gemm_output_0"];
        // batch 300000: no value above 6 GB, several GB together.
        assert!(check_budget(&model, &at_batch(300_000), Some(24 * GB)).is_ok());
        let said = check_kept(&model, &at_batch(300_000), &kept, Some(24 * GB)).unwrap_err();
        assert!(said.contains("would take about ") && said.contains("float[2100000, 128]"), "{said}");
        assert!(check_kept(&model, &at_batch(300_000), &kept, Some(400 * GB)).is_ok());
        assert!(check_kept(&model, &at_batch(2), &kept, Some(GB)).is_ok());
    }
}
