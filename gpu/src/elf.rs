//! Just enough ELF: the `DT_SONAME` of a driver library, and the forwarder objects of the
//! `shared/` mirror.
//!
//! A forwarder is a shared object with no code and no symbols, only `DT_NEEDED` entries (the
//! interceptor, then the real library) and a `DT_SONAME`. Installed as `libcuda.so.1`, it makes
//! the loader map the interceptor and the real driver; a lookup on its handle searches its
//! dependencies in order, so the interceptor's hooks win and every other symbol, functions and
//! data alike, resolves in the real driver. Only 64-bit little-endian objects are handled (the
//! x86-64 and aarch64 drivers).

use std::io;

const EI_NIDENT: usize = 16;
const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const PT_GNU_STACK: u32 = 0x6474_e551;
const PF_R: u32 = 4;
const PF_W: u32 = 2;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_HASH: u64 = 4;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;
const DT_STRSZ: u64 = 10;
const DT_SYMENT: u64 = 11;
const DT_SONAME: u64 = 14;

/// The machine forwarders are written for: this build's.
#[cfg(target_arch = "x86_64")]
const MACHINE: u16 = 62;
#[cfg(target_arch = "aarch64")]
const MACHINE: u16 = 183;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const MACHINE: u16 = 0;

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn u16_at(b: &[u8], off: usize) -> io::Result<u16> {
    b.get(off..off + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| invalid("truncated ELF"))
}

fn u32_at(b: &[u8], off: usize) -> io::Result<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
        .ok_or_else(|| invalid("truncated ELF"))
}

fn u64_at(b: &[u8], off: usize) -> io::Result<u64> {
    b.get(off..off + 8)
        .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
        .ok_or_else(|| invalid("truncated ELF"))
}

struct Phdr {
    typ: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

/// The `DT_SONAME` of the shared object `bytes`, if it has one.
pub fn soname(bytes: &[u8]) -> io::Result<Option<String>> {
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" {
        return Err(invalid("not an ELF file"));
    }
    if bytes[4] != 2 || bytes[5] != 1 {
        return Err(invalid("not a 64-bit little-endian ELF file"));
    }
    let phoff = u64_at(bytes, 32)? as usize;
    let phentsize = u16_at(bytes, 54)? as usize;
    let phnum = u16_at(bytes, 56)? as usize;
    let mut phdrs = Vec::with_capacity(phnum);
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        phdrs.push(Phdr {
            typ: u32_at(bytes, at)?,
            offset: u64_at(bytes, at + 8)?,
            vaddr: u64_at(bytes, at + 16)?,
            filesz: u64_at(bytes, at + 32)?,
        });
    }
    let Some(dynamic) = phdrs.iter().find(|p| p.typ == PT_DYNAMIC) else {
        return Ok(None);
    };
    // Dynamic entries hold virtual addresses: map them back through the PT_LOAD segments.
    let file_offset = |vaddr: u64| {
        phdrs
            .iter()
            .find(|p| p.typ == PT_LOAD && vaddr >= p.vaddr && vaddr < p.vaddr + p.filesz)
            .map(|p| (vaddr - p.vaddr + p.offset) as usize)
    };
    let (mut strtab, mut soname) = (None, None);
    let mut at = dynamic.offset as usize;
    let end = at + dynamic.filesz as usize;
    while at + 16 <= end {
        let (tag, val) = (u64_at(bytes, at)?, u64_at(bytes, at + 8)?);
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_SONAME => soname = Some(val),
            _ => {}
        }
        at += 16;
    }
    let (Some(strtab), Some(soname)) = (strtab, soname) else {
        return Ok(None);
    };
    let start = file_offset(strtab)
        .ok_or_else(|| invalid("DT_STRTAB outside the loaded segments"))?
        + soname as usize;
    let tail = bytes
        .get(start..)
        .ok_or_else(|| invalid("DT_SONAME outside the file"))?;
    let len = tail
        .iter()
        .position(|b| *b == 0)
        .ok_or_else(|| invalid("unterminated DT_SONAME"))?;
    Ok(Some(String::from_utf8_lossy(&tail[..len]).into_owned()))
}

/// A forwarder shared object named `soname` that needs `needed`, in order.
///
/// Layout: ELF header, three program headers (one RW `PT_LOAD` over the whole file, since older
/// loaders relocate `.dynamic` in place; `PT_DYNAMIC`; a non-executable `PT_GNU_STACK`), an empty
/// SysV hash table, a symbol table holding only the null symbol, the string table, `.dynamic`.
/// File offsets equal virtual addresses.
pub fn forwarder(soname: &str, needed: &[&str]) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    const PHNUM: usize = 3;
    let align8 = |n: usize| (n + 7) & !7;

    let hash_off = EHDR + PHDR * PHNUM;
    let hash: Vec<u8> = [1u32, 1, 0, 0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let sym_off = hash_off + hash.len();
    let sym = [0u8; 24];
    let str_off = sym_off + sym.len();
    let mut strtab = vec![0u8];
    let mut name_at = |s: &str| {
        let at = strtab.len() as u64;
        strtab.extend_from_slice(s.as_bytes());
        strtab.push(0);
        at
    };
    let mut entries: Vec<(u64, u64)> = needed.iter().map(|n| (DT_NEEDED, name_at(n))).collect();
    entries.push((DT_SONAME, name_at(soname)));
    let dyn_off = align8(str_off + strtab.len());
    entries.extend([
        (DT_HASH, hash_off as u64),
        (DT_STRTAB, str_off as u64),
        (DT_SYMTAB, sym_off as u64),
        (DT_STRSZ, strtab.len() as u64),
        (DT_SYMENT, 24),
        (DT_NULL, 0),
    ]);
    let dyn_size = entries.len() * 16;
    let total = dyn_off + dyn_size;

    let mut out = Vec::with_capacity(total);
    // ELF header.
    let mut ident = [0u8; EI_NIDENT];
    ident[..4].copy_from_slice(b"\x7fELF");
    ident[4] = 2; // ELFCLASS64
    ident[5] = 1; // ELFDATA2LSB
    ident[6] = 1; // EV_CURRENT
    out.extend_from_slice(&ident);
    out.extend_from_slice(&ET_DYN.to_le_bytes());
    out.extend_from_slice(&MACHINE.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes()); // e_version
    out.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    out.extend_from_slice(&(EHDR as u64).to_le_bytes()); // e_phoff
    out.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    out.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    out.extend_from_slice(&(EHDR as u16).to_le_bytes());
    out.extend_from_slice(&(PHDR as u16).to_le_bytes());
    out.extend_from_slice(&(PHNUM as u16).to_le_bytes());
    out.extend_from_slice(&64u16.to_le_bytes()); // e_shentsize
    out.extend_from_slice(&0u16.to_le_bytes()); // e_shnum
    out.extend_from_slice(&0u16.to_le_bytes()); // e_shstrndx
                                                // Program headers: type, flags, offset, vaddr, paddr, filesz, memsz, align.
    let mut phdr = |typ: u32, flags: u32, off: usize, size: usize, align: u64| {
        out.extend_from_slice(&typ.to_le_bytes());
        out.extend_from_slice(&flags.to_le_bytes());
        for v in [
            off as u64,
            off as u64,
            off as u64,
            size as u64,
            size as u64,
            align,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    };
    phdr(PT_LOAD, PF_R | PF_W, 0, total, 0x1000);
    phdr(PT_DYNAMIC, PF_R | PF_W, dyn_off, dyn_size, 8);
    phdr(PT_GNU_STACK, PF_R | PF_W, 0, 0, 16);
    out.extend_from_slice(&hash);
    out.extend_from_slice(&sym);
    out.extend_from_slice(&strtab);
    out.resize(dyn_off, 0);
    for (tag, val) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&val.to_le_bytes());
    }
    debug_assert_eq!(out.len(), total);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    #[test]
    fn a_forwarder_has_its_soname() {
        let f = forwarder("libcuda.so.1", &["/a/libx.so", "/b/liby.so.1"]);
        assert_eq!(soname(&f).unwrap().as_deref(), Some("libcuda.so.1"));
    }

    /// This host's libm, a real shared library to read and load.
    fn system_libm() -> Option<&'static str> {
        [
            "/lib/x86_64-linux-gnu/libm.so.6",
            "/lib/aarch64-linux-gnu/libm.so.6",
        ]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    }

    #[test]
    fn sonames_of_real_libraries() {
        let Some(libm) = system_libm() else { return };
        let bytes = std::fs::read(libm).unwrap();
        assert_eq!(soname(&bytes).unwrap().as_deref(), Some("libm.so.6"));
        assert!(
            soname(b"not an elf file at all, clearly not one, no no no no no no no no!").is_err()
        );
    }

    /// The loader accepts a forwarder and finds its dependencies' symbols through its handle.
    #[test]
    fn the_loader_resolves_through_a_forwarder() {
        let Some(libm) = system_libm() else { return };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("libfwd.so.1");
        std::fs::write(&path, forwarder("libfwd.so.1", &[libm])).unwrap();
        let c = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: dlopen/dlsym with valid C strings; `cos` has the C signature double(double).
        unsafe {
            let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(
                !h.is_null(),
                "{:?}",
                std::ffi::CStr::from_ptr(libc::dlerror())
            );
            let cos = libc::dlsym(h, c"cos".as_ptr());
            assert!(!cos.is_null());
            let cos: extern "C" fn(f64) -> f64 = std::mem::transmute(cos);
            assert_eq!(cos(0.0), 1.0);
            libc::dlclose(h);
        }
    }
}
