//! An error in how the tool was asked to run (exit code 2): arguments,
//! paths that clash, `--verify` options that cannot hold. Raised by `run`
//! and `verify` alike, turned into the exit code by `main`.

#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}
