//! `crishim-pause`: see the library. Installed next to `crishim-shim`, which execs it into each
//! pod's new namespaces. Built static (`hack/build-init.sh --release crishim-pause`) it maps no
//! shared library, so each pod's infra process costs a few pages of its own.

fn main() {
    crishim_pause::run()
}
