//! Comparing two values element by element, at the tolerance of their type.

use super::*;

/// Tolerances: an element passes when |a - b| <= atol + rtol * |a|.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

/// Defaults per element type; floating-point outputs of fused kernels
/// differ from the primitives only by rounding.
pub fn default_tolerance(elem_type: i32) -> Tolerance {
    match DataType::try_from(elem_type) {
        Ok(DataType::Float16) => Tolerance { rtol: 1e-2, atol: 1e-3 },
        Ok(DataType::Bfloat16) => Tolerance { rtol: 4e-2, atol: 1e-2 },
        Ok(DataType::Double) => Tolerance { rtol: 1e-9, atol: 1e-12 },
        Ok(DataType::Float) => Tolerance { rtol: 1e-4, atol: 1e-5 },
        _ => Tolerance { rtol: 0.0, atol: 0.0 },
    }
}

/// The comparison of one value (a graph output or a fused node's output).
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub name: String,
    /// For a fused node: its op type and name in the rewritten model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub elem_type: String,
    pub elements: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    pub tolerance: Tolerance,
    pub passed: bool,
    /// Why it failed when not by size (shape, NaN positions, type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// For a fused node that failed: which of it and the nodes it replaced
    /// is further from exact arithmetic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<super::exact::Exact>,
    /// Elements within tolerance only through atol: |a - b| > rtol |a|
    /// (near zero, where a relative error means little).
    pub within_by_atol: usize,
    /// A graph output the original itself computes otherwise when run
    /// again on the same inputs (a random op, a ScatterND whose reduction
    /// races over repeated indices): the largest difference between its
    /// two runs. Such an output is not judged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unrepeatable: Option<f64>,
    /// An f16 or bf16 graph output that differed where ONNX Runtime
    /// computes chains of such ops in f32, and agrees with every value of
    /// that type rounded as ONNX defines each op: the largest difference
    /// then. Such an output passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rounded: Option<f64>,
    /// max over elements of |a - b| / (atol + rtol |a|): above 1 fails.
    #[serde(skip)]
    pub badness: f64,
}

pub(super) use crate::onnx::type_name;

pub(super) fn compare_values(
    name: &str,
    node: Option<String>,
    a: &Values,
    b: &Values,
    tolerance: Tolerance,
) -> Compared {
    let mut c = Compared {
        name: name.to_string(),
        node,
        elem_type: type_name(a.elem_type),
        elements: a.data.len(),
        max_abs: 0.0,
        max_rel: 0.0,
        tolerance,
        passed: true,
        problem: None,
        exact: None,
        within_by_atol: 0,
        unrepeatable: None,
        rounded: None,
        badness: 0.0,
    };
    let fail = |mut c: Compared, why: String| {
        c.passed = false;
        c.problem = Some(why);
        c.badness = f64::INFINITY;
        c
    };
    if a.elem_type != b.elem_type {
        return fail(c, format!("types differ ({} vs {})", type_name(a.elem_type), type_name(b.elem_type)));
    }
    if a.shape != b.shape {
        return fail(c, format!("shapes differ ({:?} vs {:?})", a.shape, b.shape));
    }
    let mut nan_mismatch = 0usize;
    for (&x, &y) in a.data.iter().zip(&b.data) {
        if x.is_nan() || y.is_nan() {
            nan_mismatch += usize::from(x.is_nan() != y.is_nan());
            continue;
        }
        if x == y {
            continue; // equal infinities too
        }
        let abs = (x - y).abs();
        c.max_abs = c.max_abs.max(abs);
        c.max_rel = c.max_rel.max(abs / x.abs().max(f64::MIN_POSITIVE));
        let allowed = tolerance.atol + tolerance.rtol * x.abs();
        c.within_by_atol += usize::from(abs > tolerance.rtol * x.abs() && abs <= allowed);
        c.badness = c.badness.max(if allowed > 0.0 { abs / allowed } else { f64::INFINITY });
    }
    if nan_mismatch > 0 {
        return fail(c, format!("NaN at {nan_mismatch} positions in one model only"));
    }
    c.passed = c.badness <= 1.0;
    c
}
