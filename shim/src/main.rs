//! The per-pod shim. Container execution lands with the pods-and-containers work; until then the binary
//! exists so the workspace layout and packaging are stable.

fn main() {
    eprintln!("crishim-shim: container execution is not implemented yet");
    std::process::exit(1);
}
