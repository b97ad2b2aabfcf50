//! The fusion passes, one file each, and the pipeline's names for them.
//! A new pass: write `passes/NAME.rs` with a `PASS`, and list it in `ALL`.

use anyhow::{bail, Result};

use crate::rewrite::Pass;

pub mod attention;
pub mod complex_mul;
pub mod gelu;
pub mod layer_norm;
pub mod pack_matmul;
pub mod rms_norm;
pub mod rotary;
pub mod skip_norm;

/// Every pass, in the order `default` runs them. layer-norm comes first so
/// a LayerNorm is fused whole; in the other order it still is (layer-norm
/// folds a SimplifiedLayerNormalization of the centered input). skip-norm
/// reads the norms the two write, so it comes after them.
pub const ALL: &[&Pass] = &[
    &layer_norm::PASS,
    &rms_norm::PASS,
    &skip_norm::PASS,
    &attention::PASS,
    &gelu::PASS,
    &rotary::PASS,
    &complex_mul::PASS,
    &pack_matmul::PASS,
];

/// How the attention pass's note on a fused node begins where its
/// Attention's query heads share key and value heads (a runtime may not
/// run that: the report says which).
pub const GROUPED_HEADS: &str = "grouped heads:";

/// The pipeline a `--passes` list names (`default` expands to every default
/// pass, `none` to no pass: `--opset N --passes none` only upgrades), less
/// the `--disable` list. Unknown names are an error.
pub fn pipeline(passes: &[String], disable: &[String]) -> Result<Vec<&'static Pass>> {
    for name in disable {
        find(name)?;
    }
    let mut chosen: Vec<&'static Pass> = Vec::new();
    for name in passes {
        let named: Vec<&'static Pass> = match name.as_str() {
            "default" => ALL.iter().copied().filter(|p| p.default).collect(),
            "none" => vec![],
            _ => vec![find(name)?],
        };
        for pass in named {
            if !chosen.iter().any(|p| p.name == pass.name) {
                chosen.push(pass);
            }
        }
    }
    chosen.retain(|p| !disable.iter().any(|d| d == p.name));
    // A pass asked for beside `default` (`default,skip-norm`) takes its
    // place in `ALL`, where the others expect it: skip-norm before
    // attention, as when it was a default pass.
    if passes.iter().any(|n| n == "default") {
        chosen.sort_by_key(|p| ALL.iter().position(|a| a.name == p.name));
    }
    Ok(chosen)
}

fn find(name: &str) -> Result<&'static Pass> {
    match ALL.iter().find(|p| p.name == name) {
        Some(pass) => Ok(pass),
        None => {
            let known: Vec<&str> = ALL.iter().map(|p| p.name).collect();
            bail!("unknown pass {name:?} (known: default, none, {})", known.join(", "))
        }
    }
}
