//! What each change of an operator's definition means for a node written
//! at the older version: the reviewed table an upgrade follows.
//!
//! `history.rs` lists when each operator changed; this file says how a
//! node crosses each change between opset 7 and 26. Every change listed
//! in `history.rs` and not in `CHANGES` was read (the schemas of both
//! versions side by side: attributes and their defaults, inputs, outputs,
//! type constraints, the text) and found to keep the meaning of every node
//! the older version accepts: types added, wording, or an attribute or
//! optional input added whose default is the older behaviour (ArgMax's
//! `select_last_index`, Reshape's `allowzero`, Shape's `start`/`end`,
//! ScatterElements' `reduction`, TopK's `largest`/`sorted`, GatherND's
//! `batch_dims`, the RNNs' `layout`, Cast's `saturate` for float 8 only,
//! Pad's `axes`, Resize's `antialias`/`axes`/`keep_aspect_ratio_policy`,
//! Attention's `nonpad_kv_seqlen` and windows, the quantizers' `axis`,
//! `block_size`, `output_dtype` and `precision`, and so on).
//!
//! The rest: an adapter that writes the node's newer form (and the
//! constants it now reads as inputs), a check that the node is one whose
//! meaning did not change, or a refusal.

use super::Site;
use crate::onnx::{AttributeProto, DataType, TensorProto, BFLOAT16, DOUBLE, FLOAT, FLOAT16};

/// How a node crosses one change of its op's definition.
pub enum Change {
    /// Rewrites the node into the newer form; says what it did.
    Adapt(fn(&mut Site) -> Result<String, String>),
    /// The newer version means the same for this node if the check passes.
    Check(fn(&Site) -> Result<(), String>),
    /// No exact adapter: the reason.
    Refused(&'static str),
}

/// The changes that are not the same for every node: (op, the version
/// that changed it, how a node crosses).
pub const CHANGES: &[(&str, i64, Change)] = &[
    // Axes and other int lists moving from an attribute to an input.
    ("ReduceSum", 13, Change::Adapt(axes_to_input)),
    ("ReduceMean", 18, Change::Adapt(axes_to_input)),
    ("ReduceMax", 18, Change::Adapt(axes_to_input)),
    ("ReduceMin", 18, Change::Adapt(axes_to_input)),
    ("ReduceProd", 18, Change::Adapt(axes_to_input)),
    ("ReduceL1", 18, Change::Adapt(axes_to_input)),
    ("ReduceL2", 18, Change::Adapt(axes_to_input)),
    ("ReduceLogSum", 18, Change::Adapt(axes_to_input)),
    ("ReduceLogSumExp", 18, Change::Adapt(axes_to_input)),
    ("ReduceSumSquare", 18, Change::Adapt(axes_to_input)),
    ("Squeeze", 13, Change::Adapt(axes_to_input)),
    ("Unsqueeze", 13, Change::Adapt(axes_to_input)),
    ("Split", 13, Change::Adapt(split_to_input)),
    ("Split", 18, Change::Adapt(split_num_outputs)),
    ("Slice", 10, Change::Adapt(slice_to_inputs)),
    ("TopK", 10, Change::Adapt(k_to_input)),
    ("Clip", 11, Change::Adapt(clip_bounds_to_inputs)),
    ("Pad", 11, Change::Adapt(pads_to_inputs)),
    ("Dropout", 10, Change::Check(dropout_mask_unread)),
    ("Dropout", 12, Change::Adapt(dropout_ratio_to_input)),
    // Softmax, LogSoftmax and Hardmax over one axis instead of the input
    // flattened to 2-D from the axis on.
    ("Softmax", 13, Change::Adapt(one_axis_from_flattened)),
    ("LogSoftmax", 13, Change::Adapt(one_axis_from_flattened)),
    ("Hardmax", 13, Change::Adapt(one_axis_from_flattened)),
    ("BatchNormalization", 9, Change::Adapt(batch_norm_spatial)),
    ("BatchNormalization", 14, Change::Check(batch_norm_inference)),
    ("Scatter", 11, Change::Adapt(scatter_elements)),
    ("Erf", 13, Change::Check(erf_float)),
    ("RoiAlign", 16, Change::Adapt(roi_align_output_half_pixel)),
    ("GridSample", 20, Change::Adapt(grid_sample_mode_names)),
    ("ConvTranspose", 11, Change::Check(no_same_padding)),
    // Pooling: the output shape of ceil_mode and automatic padding was
    // redefined at 11, 12, 19 and 22; floor mode with explicit pads is the
    // same function throughout, and so is ceil mode where no window can
    // start in the end's pad.
    ("AveragePool", 11, Change::Check(pool_floor_explicit)),
    ("AveragePool", 19, Change::Check(pool_floor_explicit)),
    ("AveragePool", 22, Change::Check(pool_floor_explicit)),
    ("MaxPool", 11, Change::Check(pool_floor_explicit)),
    ("MaxPool", 12, Change::Check(pool_floor_explicit)),
    ("MaxPool", 22, Change::Check(pool_floor_explicit)),
    ("LpPool", 11, Change::Check(pool_floor_explicit)),
    ("LpPool", 18, Change::Check(pool_floor_explicit)),
    ("LpPool", 22, Change::Check(pool_floor_explicit)),
    (
        "Resize",
        11,
        Change::Refused("Resize-10's nearest and linear sampling has no exact Resize-11 form in ONNX Runtime"),
    ),
    ("Resize", 13, Change::Check(resize_mode_kept)),
    ("Upsample", 10, Change::Refused("Upsample is deprecated from opset 10 and its sampling has no exact Resize form")),
    ("GroupNormalization", 21, Change::Refused("GroupNormalization-21 scales per channel, 18 per group")),
    ("DFT", 20, Change::Refused("DFT-20 reads its axis as an input with another default; no adapter written")),
    ("Scan", 9, Change::Refused("Scan-8's batch axis and sequence_lens have no adapter")),
    // Version 22 (bf16 added) of these has no kernel in the pinned ONNX
    // Runtime's CPU provider, f32 included (tests/upgrade.rs runs each):
    // the model would no longer load where the original does.
    ("RandomUniformLike", 22, Change::Refused(NO_KERNEL)),
    ("RandomNormalLike", 22, Change::Refused(NO_KERNEL)),
    ("RandomUniform", 22, Change::Refused(NO_KERNEL)),
    ("RandomNormal", 22, Change::Refused(NO_KERNEL)),
    ("Bernoulli", 22, Change::Refused(NO_KERNEL)),
    ("Multinomial", 22, Change::Refused(NO_KERNEL)),
    ("RoiAlign", 22, Change::Refused(NO_KERNEL)),
    ("MaxRoiPool", 22, Change::Refused(NO_KERNEL)),
    ("GlobalLpPool", 22, Change::Refused(NO_KERNEL)),
];

/// Why a version ONNX Runtime cannot run is not written.
const NO_KERNEL: &str = "ONNX Runtime 1.31.1's CPU provider has no kernel for this version";

/// The change of `op` at `version`, if it is not the same for every node.
pub fn change(op: &str, version: i64) -> Option<&'static Change> {
    CHANGES.iter().find(|(o, v, _)| *o == op && *v == version).map(|(_, _, c)| c)
}

/// An int64 tensor of one axis.
fn int64s(values: &[i64]) -> TensorProto {
    TensorProto {
        dims: vec![values.len() as i64],
        data_type: Some(DataType::Int64 as i32),
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

/// A scalar of float type `elem` holding `value` exactly, or why not.
fn float_scalar(elem: Option<i32>, value: f32, what: &str) -> Result<TensorProto, String> {
    let bytes = match elem {
        Some(FLOAT) => value.to_le_bytes().to_vec(),
        Some(DOUBLE) => f64::from(value).to_le_bytes().to_vec(),
        Some(FLOAT16) if half::f16::from_f32(value).to_f32() == value => {
            half::f16::from_f32(value).to_le_bytes().to_vec()
        }
        Some(BFLOAT16) if half::bf16::from_f32(value).to_f32() == value => {
            half::bf16::from_f32(value).to_le_bytes().to_vec()
        }
        other => {
            return Err(format!(
                "its {what} {value} becomes an input of the data's type, and that type ({}) cannot hold it exactly",
                crate::onnx::type_text(other)
            ))
        }
    };
    Ok(TensorProto { data_type: elem, raw_data: Some(bytes.into()), ..Default::default() })
}

/// An attribute of ints becomes the constant input at `slot` (absent stays absent).
fn ints_to_input(site: &mut Site, attribute: &str, slot: usize) -> Result<Option<String>, String> {
    let Some(values) = site.take_ints(attribute)? else { return Ok(None) };
    site.set_input(slot, int64s(&values), attribute);
    Ok(Some(format!("{attribute} {values:?} from attribute to input")))
}

fn axes_to_input(site: &mut Site) -> Result<String, String> {
    if site.node.input.get(1).is_some_and(|i| !i.is_empty()) {
        return Err("it has a second input, which its version does not define".into());
    }
    Ok(ints_to_input(site, "axes", 1)?.unwrap_or_else(|| "no axes: unchanged".into()))
}

fn split_to_input(site: &mut Site) -> Result<String, String> {
    if site.node.input.len() > 1 {
        return Err("it has a second input, which its version does not define".into());
    }
    Ok(ints_to_input(site, "split", 1)?.unwrap_or_else(|| "equal parts: unchanged".into()))
}

/// Split-18 splits into equal parts only when told how many
/// (`num_outputs`); before, the number of outputs said it. (Where the axis
/// does not divide, Split-13 fails and Split-18 makes the last part
/// smaller: the same function wherever the original runs.)
fn split_num_outputs(site: &mut Site) -> Result<String, String> {
    if site.node.input.get(1).is_some_and(|i| !i.is_empty()) {
        return Ok("sizes given: unchanged".into());
    }
    let n = site.node.output.len() as i64;
    site.node.attribute.push(AttributeProto::int("num_outputs", n));
    Ok(format!("num_outputs {n}"))
}

fn slice_to_inputs(site: &mut Site) -> Result<String, String> {
    if site.node.input.len() > 1 {
        return Err("it has more than one input, which its version does not define".into());
    }
    let starts = site.take_ints("starts")?.ok_or("it has no starts")?;
    let ends = site.take_ints("ends")?.ok_or("it has no ends")?;
    site.set_input(1, int64s(&starts), "starts");
    site.set_input(2, int64s(&ends), "ends");
    let axes = site.take_ints("axes")?;
    if let Some(axes) = &axes {
        site.set_input(3, int64s(axes), "axes");
    }
    Ok(format!(
        "starts {starts:?}, ends {ends:?}{} from attributes to inputs",
        match axes {
            Some(a) => format!(", axes {a:?}"),
            None => String::new(),
        }
    ))
}

fn k_to_input(site: &mut Site) -> Result<String, String> {
    let k = site.take_int("k")?.ok_or("it has no k")?;
    site.set_input(1, int64s(&[k]), "k");
    Ok(format!("k {k} from attribute to input"))
}

/// Clip-6 clamps to its attributes, whose defaults are ±FLT_MAX (so it
/// clamps infinities too); Clip-11 reads its bounds as inputs of the data's
/// type, and an absent one clamps nothing. Both are written out.
fn clip_bounds_to_inputs(site: &mut Site) -> Result<String, String> {
    let elem = site.elem_type(0);
    if elem != Some(FLOAT) {
        // ONNX Runtime's Clip-6 kernel is f32 only; what Clip-6 means for
        // another type is not something a runtime showed.
        return Err(format!("its data is {}, and Clip-6 is adapted for f32 only", crate::onnx::type_text(elem)));
    }
    let min = site.take_float("min")?.unwrap_or(f32::MIN);
    let max = site.take_float("max")?.unwrap_or(f32::MAX);
    site.set_input(1, float_scalar(elem, min, "min")?, "min");
    site.set_input(2, float_scalar(elem, max, "max")?, "max");
    Ok(format!("min {min:e}, max {max:e} from attributes to inputs"))
}

fn pads_to_inputs(site: &mut Site) -> Result<String, String> {
    let pads = site.take_ints("pads")?.ok_or("it has no pads")?;
    let mode = site.node.attr("mode").map(|a| String::from_utf8_lossy(a.s()).to_string());
    let value = site.take_float("value")?.unwrap_or(0.0);
    let elem = site.elem_type(0);
    site.set_input(1, int64s(&pads), "pads");
    if mode.as_deref().is_none_or(|m| m == "constant") {
        site.set_input(2, float_scalar(elem, value, "value")?, "value");
        return Ok(format!("pads {pads:?} and value {value} from attributes to inputs"));
    }
    Ok(format!("pads {pads:?} from attribute to input"))
}

/// Dropout-7's mask has the data's type, Dropout-10's is bool.
fn dropout_mask_unread(site: &Site) -> Result<(), String> {
    match site.node.output.get(1).filter(|m| !m.is_empty()) {
        Some(_) => Err("its mask output changes type (the data's type before opset 10, bool after)".into()),
        None => Ok(()),
    }
}

/// Dropout-12 reads the ratio as an input, and runs in inference mode
/// unless `training_mode` says otherwise: the same as before.
fn dropout_ratio_to_input(site: &mut Site) -> Result<String, String> {
    let Some(ratio) = site.take_float("ratio")? else {
        return Ok("default ratio: unchanged".into());
    };
    site.set_input(1, float_scalar(Some(FLOAT), ratio, "ratio")?, "ratio");
    Ok(format!("ratio {ratio} from attribute to input"))
}

/// Before opset 13 these ops flatten the input to 2-D from `axis` on
/// (default 1) and work on the second axis; from 13 on they work on one
/// axis (default -1). The same where the axis is the last one; elsewhere
/// the node is written as the old computation: Flatten, the op over the
/// last axis, and a Reshape back to the input's shape.
fn one_axis_from_flattened(site: &mut Site) -> Result<String, String> {
    let axis = site.node.attr_int("axis").unwrap_or(1);
    let rank = site.rank(0);
    let last = axis == -1 || rank.is_some_and(|r| axis == r as i64 - 1);
    site.node.attribute.retain(|a| a.name() != "axis");
    site.node.attribute.push(AttributeProto::int("axis", -1));
    if last {
        return Ok(format!("axis {axis} is the last axis: written as axis -1"));
    }
    let x = site.node.input[0].clone();
    let y = site.node.output[0].clone();
    let flat = site.fresh(&y, "flat");
    let computed = site.fresh(&y, "2d");
    let shape = site.fresh(&y, "shape");
    let op = site.node.op_type().to_string();
    site.before.push(crate::rewrite::node("Flatten", &[&x], vec![AttributeProto::int("axis", axis)]));
    site.before.last_mut().expect("pushed").output = vec![flat.clone()];
    site.before.push(crate::rewrite::node("Shape", &[&x], vec![]));
    site.before.last_mut().expect("pushed").output = vec![shape.clone()];
    site.node.input[0] = flat;
    site.node.output[0] = computed.clone();
    site.after.push(crate::rewrite::node("Reshape", &[&computed, &shape], vec![]));
    site.after.last_mut().expect("pushed").output = vec![y];
    Ok(format!(
        "axis {axis} of an input of rank {}: written as Flatten(axis {axis}), {op} over the last axis, Reshape back",
        crate::graph::known(rank)
    ))
}

/// BatchNormalization-9 dropped `spatial`, whose default (1) it keeps.
fn batch_norm_spatial(site: &mut Site) -> Result<String, String> {
    match site.take_int("spatial")? {
        None => Ok("unchanged".into()),
        Some(1) => Ok("spatial 1 (the only meaning left) dropped".into()),
        Some(s) => Err(format!("spatial {s}: per-activation statistics have no later form")),
    }
}

/// BatchNormalization-14's further outputs are running statistics of
/// training mode; before, they were other statistics.
fn batch_norm_inference(site: &Site) -> Result<(), String> {
    match site.node.output.iter().skip(1).any(|o| !o.is_empty()) {
        true => Err("it has training outputs, whose meaning changed at opset 14".into()),
        false => Ok(()),
    }
}

/// Scatter is deprecated from opset 11 in favour of ScatterElements, which
/// computes the same (and accepts negative indices too).
fn scatter_elements(site: &mut Site) -> Result<String, String> {
    site.node.op_type = Some("ScatterElements".into());
    Ok("written as ScatterElements".into())
}

/// Erf-13 has no integer types.
fn erf_float(site: &Site) -> Result<(), String> {
    match site.elem_type(0) {
        Some(FLOAT | FLOAT16 | DOUBLE | BFLOAT16) => Ok(()),
        other => Err(format!("its input is {}, and Erf-13 is defined for floats only", crate::onnx::type_text(other))),
    }
}

/// RoiAlign-16 added `coordinate_transformation_mode`, defaulting to
/// `half_pixel`; RoiAlign-10 computed `output_half_pixel`.
fn roi_align_output_half_pixel(site: &mut Site) -> Result<String, String> {
    if site.node.attr("coordinate_transformation_mode").is_some() {
        return Err("it has coordinate_transformation_mode, which its version does not define".into());
    }
    site.node.attribute.push(AttributeProto::string("coordinate_transformation_mode", "output_half_pixel"));
    Ok("coordinate_transformation_mode output_half_pixel written out".into())
}

/// GridSample-20 renamed its modes: bilinear is linear, bicubic is cubic.
fn grid_sample_mode_names(site: &mut Site) -> Result<String, String> {
    let Some(mode) = site.node.attribute.iter_mut().find(|a| a.name() == "mode") else {
        return Ok("default mode (bilinear, now called linear): unchanged".into());
    };
    let old = String::from_utf8_lossy(mode.s()).to_string();
    let new = match old.as_str() {
        "bilinear" => "linear",
        "bicubic" => "cubic",
        "nearest" => return Ok("mode nearest: unchanged".into()),
        other => return Err(format!("mode {other:?} is not one GridSample-16 defines")),
    };
    *mode = AttributeProto::string("mode", new);
    Ok(format!("mode {old} renamed {new}"))
}

/// ConvTranspose-11 swapped where SAME_UPPER and SAME_LOWER put the odd padding.
fn no_same_padding(site: &Site) -> Result<(), String> {
    match site.string_attr("auto_pad").as_deref() {
        Some("SAME_UPPER" | "SAME_LOWER") => {
            Err("its auto_pad SAME_* puts the odd padding on the other side from opset 11".into())
        }
        _ => Ok(()),
    }
}

/// Rounded up (`ceil_mode`), a pool's windows were redefined: from opset 19
/// (MaxPool 22) a window that would start in the end's pad is dropped. It
/// is the same function where no window can start there on any axis
/// (`ops::windows_start_inside`; Funnel's kernel 2, stride 2).
fn pool_floor_explicit(site: &Site) -> Result<(), String> {
    match site.string_attr("auto_pad").as_deref() {
        None | Some("NOTSET" | "VALID") => {}
        Some(other) => return Err(format!("auto_pad {other}: its output shape was redefined")),
    }
    if site.node.attr_int("ceil_mode").unwrap_or(0) == 0 {
        return Ok(());
    }
    let refused = || "ceil_mode 1: its output shape was redefined (a window may start in the end's pad)".to_string();
    let kernel = site.node.attr_ints("kernel_shape").ok_or_else(refused)?;
    let n = kernel.len();
    let ints = |name: &str, default: i64, len: usize| match site.node.attr_ints(name) {
        None => Some(vec![default; len]),
        Some(v) => (v.len() == len).then(|| v.to_vec()),
    };
    let (strides, dilations) =
        (ints("strides", 1, n).ok_or_else(refused)?, ints("dilations", 1, n).ok_or_else(refused)?);
    let pads = match site.string_attr("auto_pad").as_deref() {
        Some("VALID") => vec![0; 2 * n],
        _ => ints("pads", 0, 2 * n).ok_or_else(refused)?,
    };
    let inside = (0..n).all(|i| {
        let reach = crate::ops::window_reach(dilations[i], kernel[i]);
        reach.is_some_and(|reach| crate::ops::windows_start_inside(strides[i], reach, pads[n + i]))
    });
    if inside {
        Ok(())
    } else {
        Err(refused())
    }
}

/// Resize-13 dropped the coordinate mode `tf_half_pixel_for_nn`.
fn resize_mode_kept(site: &Site) -> Result<(), String> {
    match site.string_attr("coordinate_transformation_mode").as_deref() {
        Some("tf_half_pixel_for_nn") => Err("coordinate_transformation_mode tf_half_pixel_for_nn is gone at 13".into()),
        _ => Ok(()),
    }
}
