//! An error in how the tool was asked to run (exit code 2): arguments,
//! paths that clash, `--verify` options that cannot hold. Raised by `run`
//! and `verify` alike, turned into the exit code by `main`. And the one
//! line every error is shown as.

#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// Errors are one line: ONNX Runtime's messages, for one, span several.
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The message a panic carries.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

/// A panic as an error naming it a bug.
pub fn internal_error(payload: &(dyn std::any::Any + Send)) -> anyhow::Error {
    anyhow::anyhow!("internal error: {} (please report it with the model that caused it)", panic_message(payload))
}
