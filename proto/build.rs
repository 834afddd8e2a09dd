//! Generate the CRI v1 server and client from `cri/runtime_v1.proto` with Debian's `protoc`
//! (`protobuf-compiler`; `PROTOC` names another).

fn main() {
    let proto = "cri/runtime_v1.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_prost_build::configure()
        // The workflow runner and verbose statuses show CRI messages as JSON.
        .type_attribute(".", "#[derive(serde::Serialize, serde::Deserialize)]")
        // Its Debug hides the secrets (see `cri_auth_debug` in lib.rs).
        .skip_debug([".runtime.v1.AuthConfig"])
        // A request that does not decode is the caller's fault: InvalidArgument (src/codec.rs).
        .codec_path("crate::codec::CriCodec")
        .compile_protos(&[proto], &["cri"])
        .unwrap_or_else(|e| panic!("compiling {proto} (is protoc installed?): {e}"));
}
