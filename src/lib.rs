//! onnx-fuse: exact fusion passes for ONNX transformer exports.
//!
//! `io` loads and writes models without loss, `graph` is the read-only view
//! that patterns match against, `pattern` holds the matchers they share,
//! `rewrite` applies matches (the module that edits node lists for
//! fusions and for `--opset`'s adapted nodes), `cleanup` makes what the
//! shapes prove constant and removes twins and unread nodes after the
//! passes, `passes` holds one file per fusion, `report` says what happened, `verify` proves a rewrite
//! through ONNX Runtime. docs/ARCHITECTURE.md is the map.

pub mod cleanup;
pub mod graph;
/// The view's symbolic shapes (`graph/shapes.rs`), by their old path.
pub use graph::shapes;
pub mod io;
pub mod onnx;
pub mod ops;
pub mod passes;
pub mod pattern;
pub mod report;
pub mod rewrite;
pub mod run;
pub mod upgrade;
pub mod usage;
pub mod validate;
pub mod verify;
