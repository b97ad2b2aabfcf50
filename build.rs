//! Generates the ONNX types from `proto/onnx.proto` with protox (no `protoc`
//! binary needed) and prost-build, and keeps the file descriptor set so the
//! loader can tell which field numbers the schema defines.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors = protox::compile(["onnx.proto"], ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("onnx_descriptor.bin"), descriptors.encode_to_vec())?;
    prost_build::Config::new().bytes(["."]).compile_fds(descriptors)?;
    Ok(())
}
