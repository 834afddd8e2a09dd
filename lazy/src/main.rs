//! `crishim-lazyfs`: the FUSE server of one lazy layer (see `crishim_lazy::server`).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    crishim_lazy::server::main(&args)
}
