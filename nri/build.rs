//! Generate NRI's messages from `proto/nri.proto` with Debian's `protoc` (`protobuf-compiler`;
//! `PROTOC` names another). The services are not generated: crishim carries them over its own
//! ttrpc (src/ttrpc.rs).

fn main() {
    let proto = "proto/nri.proto";
    println!("cargo:rerun-if-changed={proto}");
    prost_build::Config::new()
        .compile_protos(&[proto], &["proto"])
        .unwrap_or_else(|e| panic!("compiling {proto} (is protoc installed?): {e}"));
}
