//! Fake GPUs for the GPU tests: there is no GPU here, so the hardware is faked and the runtime
//! is not.
//!
//! - A device root with `nvidia0` (195:0), `nvidia1` (195:1), `nvidiactl` (195:255), and
//!   `nvidia-uvm`/`nvidia-uvm-tools` (a dynamic major, as on real nodes), made with mknod.
//! - A proc root with the driver's `driver/nvidia/gpus/<bus id>/information` files.
//! - A driver root with a fake driver built here from `tests/gpu/*.c` with `cc`:
//!   `libcuda.so.550.54.14` and `libnvidia-ml.so.550.54.14` (with their soname links, indexed
//!   by an `etc/ld.so.cache` that `ldconfig -r` writes) and an `nvidia-smi` script.
//! - `cudatest` (`tests/gpu/cudatest.c`): the program containers run, dynamically linked
//!   against glibc like any CUDA application; [`gpu_image`] packs it with the host's glibc.
//!
//! The fake devices have 1 GiB each ([`FAKE_MEMORY`]); the fake driver and NVML find them under
//! `$FAKE_NVIDIA_DEVICE_ROOT` (the daemon's NVML probe runs on the host) or `/dev`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::daemon::workspace_root;
use crate::image::{busybox_layer, Compression, Image, LayerBuilder};

pub const DRIVER_VERSION: &str = "550.54.14";
pub const FAKE_MEMORY: u64 = 1 << 30;
/// The dynamic major the fake `nvidia-uvm` nodes get.
pub const UVM_MAJOR: u64 = 237;
/// The major the fake `nvidia-caps` nodes get (dynamic on real nodes too).
pub const CAPS_MAJOR: u64 = 238;
/// The LD_LIBRARY_PATH [`gpu_image`] sets in its config.
pub const IMAGE_LD_LIBRARY_PATH: &str = "/opt/image/lib";

/// The UUID of the fake GPU with minor `minor` (fake_cuda.c and fake_nvml.c derive the same).
pub fn uuid(minor: u32) -> String {
    format!("GPU-c0ffee00-0000-4000-8000-0000000000{minor:02x}")
}

/// The UUID of the fake MIG device (GPU instance `gi`, compute instance `ci`) of GPU `minor`
/// (fake_nvml.c derives the same).
pub fn mig_uuid(minor: u32, gi: u32, ci: u32) -> String {
    format!("MIG-c0ffee00-0000-4000-9000-000000{minor:02x}{gi:02x}{ci:02x}")
}

/// The PCI bus id of the fake GPU with minor `minor`.
pub fn bus_id(minor: u32) -> String {
    format!("0000:{:02x}:00.0", 7 + minor)
}

/// What `cc` built: the fake driver libraries and `cudatest`.
pub struct Built {
    pub dir: PathBuf,
    pub libcuda: PathBuf,
    pub libnvml: PathBuf,
    pub cudatest: PathBuf,
}

/// Build the C fixtures once per test binary.
pub fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        // Next to the daemon binary, so nothing is left in /tmp.
        let dir = crate::daemon::daemon_bin().with_file_name("gpu-fixtures");
        std::fs::create_dir_all(&dir).expect("creating the GPU fixture dir");
        let src = workspace_root().join("tests/gpu");
        let cc = |args: &[&str], out: &Path| {
            let o = Command::new("cc")
                .args(["-O1", "-Wall", "-Werror"])
                .args(args)
                .arg("-o")
                .arg(out)
                .output()
                .expect("running cc (install gcc and libc6-dev: hack/install-deps.sh)");
            assert!(
                o.status.success(),
                "cc {args:?} failed:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        let libcuda = dir.join(format!("libcuda.so.{DRIVER_VERSION}"));
        let libnvml = dir.join(format!("libnvidia-ml.so.{DRIVER_VERSION}"));
        let cudatest = dir.join("cudatest");
        let c = |name: &str| src.join(name).to_string_lossy().into_owned();
        // Calls inside a fake library bind to itself, as a real driver's do: an interposed
        // hook must not see them.
        let library = |soname: &str, source: &str, out: &Path| {
            let soname = format!("-Wl,-soname,{soname}");
            cc(
                &["-shared", "-fPIC", "-Wl,-Bsymbolic", &soname, &c(source)],
                out,
            );
        };
        library("libcuda.so.1", "fake_cuda.c", &libcuda);
        library("libnvidia-ml.so.1", "fake_nvml.c", &libnvml);
        cc(&["-pthread", &c("cudatest.c")], &cudatest);
        Built {
            dir,
            libcuda,
            libnvml,
            cudatest,
        }
    })
}

/// The interceptor the daemon injects: `libcrishim_vgpu.so` next to the daemon binary.
pub fn interceptor() -> PathBuf {
    let p = crate::daemon::daemon_bin().with_file_name("libcrishim_vgpu.so");
    assert!(
        p.is_file(),
        "{} not found: build the workspace first (cargo build --workspace)",
        p.display()
    );
    p
}

/// A fake GPU node: device, proc and driver roots, a mirror dir and a CDI spec dir.
pub struct FakeNode {
    dir: tempfile::TempDir,
}

impl FakeNode {
    pub fn new() -> FakeNode {
        let b = built();
        let dir = tempfile::Builder::new()
            .prefix("crishim-fake-gpus-")
            .tempdir()
            .expect("temp dir");
        let n = FakeNode { dir };
        let dev = n.device_root();
        std::fs::create_dir_all(&dev).unwrap();
        for (name, major, minor) in [
            ("nvidia0", 195, 0),
            ("nvidia1", 195, 1),
            ("nvidiactl", 195, 255),
            ("nvidia-uvm", UVM_MAJOR, 0),
            ("nvidia-uvm-tools", UVM_MAJOR, 1),
        ] {
            nix::sys::stat::mknod(
                &dev.join(name),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(major, minor),
            )
            .unwrap_or_else(|e| panic!("mknod {name}: {e} (the GPU tests need root)"));
        }
        for minor in [0u32, 1] {
            let d = n.proc_root().join("driver/nvidia/gpus").join(bus_id(minor));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(
                d.join("information"),
                format!(
                    "Model: \t\t Fake GPU\nIRQ:   \t\t 42\nGPU UUID: \t {}\nVideo BIOS: \t 00.00.00.00.00\n\
                     Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
                     Bus Location: \t {}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n",
                    uuid(minor),
                    bus_id(minor)
                ),
            )
            .unwrap();
        }
        std::fs::write(
            n.proc_root().join("driver/nvidia/version"),
            format!("NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER_VERSION}\n"),
        )
        .unwrap();
        // The driver root, laid out as the driver installs itself, and its ld.so.cache.
        let root = n.driver_root();
        let lib = root.join(lib_dir());
        std::fs::create_dir_all(&lib).unwrap();
        for (file, soname) in [
            (&b.libcuda, "libcuda.so.1"),
            (&b.libnvml, "libnvidia-ml.so.1"),
        ] {
            let name = file.file_name().unwrap();
            std::fs::copy(file, lib.join(name)).unwrap();
            std::os::unix::fs::symlink(name, lib.join(soname)).unwrap();
        }
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::write(root.join("etc/ld.so.conf"), format!("/{}\n", lib_dir())).unwrap();
        let o = Command::new("ldconfig")
            .args(["-C", "/etc/ld.so.cache", "-r"])
            .arg(&root)
            .output()
            .expect("running ldconfig");
        assert!(
            o.status.success() && root.join("etc/ld.so.cache").is_file(),
            "ldconfig -r {}: {}",
            root.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        let bin = root.join("usr/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join("nvidia-smi"), "#!/bin/sh\necho fake nvidia-smi\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            bin.join("nvidia-smi"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::create_dir_all(n.cdi_dir()).unwrap();
        n
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
    pub fn device_root(&self) -> PathBuf {
        self.path().join("dev")
    }
    pub fn proc_root(&self) -> PathBuf {
        self.path().join("proc")
    }
    pub fn driver_root(&self) -> PathBuf {
        self.path().join("driver")
    }
    pub fn vdriver_dir(&self) -> PathBuf {
        self.path().join("vdriver")
    }
    pub fn cdi_dir(&self) -> PathBuf {
        self.path().join("cdi")
    }

    /// The host node of GPU `minor`.
    pub fn gpu_node(&self, minor: u32) -> PathBuf {
        self.device_root().join(format!("nvidia{minor}"))
    }

    /// `[gpu]` for this node, with `inject` = "preload" or "replace".
    pub fn toml(&self, inject: &str) -> String {
        let q = |p: PathBuf| serde_json::to_string(&p.to_string_lossy()).unwrap();
        format!(
            "[gpu]\ndevice_root = {}\nproc_root = {}\ndriver_root = {}\nvdriver_dir = {}\n\
             inject = \"{inject}\"\ncdi_spec_dirs = [{}]\n",
            q(self.device_root()),
            q(self.proc_root()),
            q(self.driver_root()),
            q(self.vdriver_dir()),
            q(self.cdi_dir()),
        )
    }

    /// The environment the fake driver needs on the host (the daemon's NVML probe).
    pub fn env(&self) -> (String, String) {
        (
            "FAKE_NVIDIA_DEVICE_ROOT".to_string(),
            self.device_root().to_string_lossy().into_owned(),
        )
    }

    /// Daemon options for this node.
    pub fn daemon_options(&self, inject: &str) -> crate::DaemonOptions {
        let (k, v) = self.env();
        crate::DaemonOptions::new()
            .extra_toml(&self.toml(inject))
            .env(&k, &v)
    }

    /// Turn MIG on for GPU `minor` with a MIG device (GPU instance `gi`, compute instance `ci`)
    /// whose capability minors are `caps` (the GPU instance's, the compute instance's), in the
    /// driver's `mig-minors`; with `nodes`, their `nvidia-caps` nodes are made too.
    pub fn add_mig(&self, minor: u32, gi: u32, ci: u32, caps: (u32, u32), nodes: bool) {
        use std::io::Write as _;
        let append = |path: PathBuf, line: String| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(line.as_bytes()).unwrap();
        };
        append(
            self.device_root().join("fake-mig"),
            format!("{minor} {gi} {ci}\n"),
        );
        append(
            self.proc_root().join("driver/nvidia-caps/mig-minors"),
            format!(
                "gpu{minor}/gi{gi}/access {}\ngpu{minor}/gi{gi}/ci{ci}/access {}\n",
                caps.0, caps.1
            ),
        );
        if nodes {
            let dir = self.device_root().join("nvidia-caps");
            std::fs::create_dir_all(&dir).unwrap();
            for m in [caps.0, caps.1] {
                nix::sys::stat::mknod(
                    &dir.join(format!("nvidia-cap{m}")),
                    nix::sys::stat::SFlag::S_IFCHR,
                    nix::sys::stat::Mode::from_bits_truncate(0o444),
                    nix::sys::stat::makedev(CAPS_MAJOR, u64::from(m)),
                )
                .unwrap();
            }
        }
    }

    /// Write a CDI spec file into the CDI dir.
    pub fn write_cdi(&self, name: &str, yaml: &str) {
        std::fs::write(self.cdi_dir().join(name), yaml).unwrap();
    }
}

impl Default for FakeNode {
    fn default() -> Self {
        Self::new()
    }
}

fn lib_dir() -> &'static str {
    if cfg!(target_arch = "aarch64") {
        "usr/lib/aarch64-linux-gnu"
    } else {
        "usr/lib/x86_64-linux-gnu"
    }
}

/// The shared libraries `file` needs (its loader included), as `ldd` resolves them.
fn needed_libraries(file: &Path) -> Vec<PathBuf> {
    let o = Command::new("ldd").arg(file).output().expect("running ldd");
    assert!(o.status.success(), "ldd {}", file.display());
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.trim().split(' ').next()?,
                None => l.split(' ').next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// busybox plus `/bin/cudatest` and the glibc it and the interceptor need (at the paths the
/// host's loader uses), with `LD_LIBRARY_PATH` set to [`IMAGE_LD_LIBRARY_PATH`] by the image.
pub fn gpu_image() -> Image {
    let b = built();
    let mut libs = needed_libraries(&b.cudatest);
    libs.extend(needed_libraries(&interceptor()));
    // The rest of glibc's core, as every glibc image has: a real driver's libcuda.so.1 needs
    // libm, libdl, libpthread and librt, which neither cudatest nor the interceptor pulls in.
    let glibc_dir = libs
        .iter()
        .find(|l| l.file_name().is_some_and(|n| n == "libc.so.6"))
        .and_then(|l| l.parent())
        .map(Path::to_path_buf);
    if let Some(dir) = glibc_dir {
        for name in ["libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"] {
            let l = dir.join(name);
            if l.is_file() {
                libs.push(l);
            }
        }
    }
    libs.sort();
    libs.dedup();
    let mut layer = LayerBuilder::new();
    let mut dirs: Vec<String> = Vec::new();
    for l in &libs {
        let rel = l.to_string_lossy().trim_start_matches('/').to_string();
        let mut parent = Path::new(&rel).parent();
        let mut chain = Vec::new();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            chain.push(p.to_string_lossy().into_owned());
            parent = p.parent();
        }
        for d in chain.into_iter().rev() {
            if !dirs.contains(&d) {
                layer = layer.dir(&d, 0o755);
                dirs.push(d);
            }
        }
        let data = std::fs::read(l).unwrap_or_else(|e| panic!("reading {}: {e}", l.display()));
        layer = layer.file(&rel, data, 0o755);
    }
    let data = std::fs::read(&b.cudatest).unwrap();
    layer = layer
        .file("bin/cudatest", data, 0o755)
        .dir("opt", 0o755)
        .dir("opt/image", 0o755)
        .dir("opt/image/lib", 0o755);
    Image::new(vec![busybox_layer(), layer.build(Compression::Gzip)])
        .env(&format!("LD_LIBRARY_PATH={IMAGE_LD_LIBRARY_PATH}"))
}

/// The lines of `cudatest` output that start with `what`.
pub fn lines<'a>(out: &'a str, what: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(what)).collect()
}

/// Built once: `cudatest`'s image layer is big, so tests share the pushed bytes' digests.
pub fn gpu_image_once() -> Image {
    static I: OnceLock<Image> = OnceLock::new();
    I.get_or_init(gpu_image).clone()
}
