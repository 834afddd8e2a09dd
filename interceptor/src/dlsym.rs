//! Our `dlsym`, which keeps a preloaded interceptor in the path of programs that `dlopen` the
//! driver and look its entry points up on the handle (the CUDA runtime does exactly that).
//!
//! glibc's `dlsym` looks at its return address to know who calls: `RTLD_NEXT` means "after the
//! caller's object", `RTLD_DEFAULT` searches the caller's scope. A plain wrapper would turn every
//! caller into this library. So `dlsym` is a naked trampoline: it asks [`decide`] (saving the
//! argument registers around the call) and either returns the hook it got or jumps, not calls,
//! into libc's `dlsym` with the caller's return address still in place.

use std::ffi::{c_char, c_void, CStr};

use crate::real;

/// The hook to hand out for `symbol` on `handle`, or null to let libc answer.
///
/// Only lookups on a real handle are taken over: for `RTLD_DEFAULT` a preloaded interceptor is
/// already first in the global scope, and `RTLD_NEXT` must keep its meaning. A name is taken
/// over only when the handle's library really has it, so the answer to "does this library have
/// X" never changes.
extern "C" fn decide(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Resolve libc's dlsym now: the trampoline jumps to it right after.
    let _ = real::real_dlsym();
    if handle.is_null() || handle == libc::RTLD_NEXT || symbol.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let Some(entry) = crate::table::find(name) else {
        return std::ptr::null_mut();
    };
    let found = real::lookup(handle, name);
    if found.is_null() || real::is_ours(found) {
        return std::ptr::null_mut();
    }
    real::note_app_handle(entry.slot.lib, handle);
    crate::debug(format_args!("dlsym {name:?}: hooked"));
    entry.hook as *mut c_void
}

/// `dlsym(3)`.
///
/// # Safety
/// As libc's: `handle` is a handle from `dlopen` or a pseudo-handle, `symbol` a C string.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rsp ≡ 8 (mod 16). Two pushes and 8 bytes realign it for the call.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}]",
        "jmp rax",
        "2:",
        "ret",
        decide = sym decide,
        real = sym real::REAL_DLSYM,
    )
}

/// `dlsym(3)`.
///
/// # Safety
/// As libc's: `handle` is a handle from `dlopen` or a pseudo-handle, `symbol` a C string.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // x30 (the caller's return address) is restored before the tail branch.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "bl {decide}",
        "cbnz x0, 2f",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "br x16",
        "2:",
        "ldp x29, x30, [sp], #32",
        "ret",
        decide = sym decide,
        real = sym real::REAL_DLSYM,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_pass_through_with_the_callers_meaning() {
        // This test binary links our `dlsym` in place of libc's: ordinary lookups still work.
        // SAFETY: dlopen/dlsym on libm with valid C strings.
        unsafe {
            let h = libc::dlopen(c"libm.so.6".as_ptr(), libc::RTLD_NOW);
            assert!(!h.is_null());
            let cos = dlsym(h, c"cos".as_ptr());
            assert!(!cos.is_null());
            let cos: extern "C" fn(f64) -> f64 = std::mem::transmute(cos);
            assert_eq!(cos(0.0), 1.0);
            assert!(dlsym(h, c"no_such_symbol".as_ptr()).is_null());
            // RTLD_DEFAULT and RTLD_NEXT reach libc's own functions.
            assert!(!dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()).is_null());
            assert!(!dlsym(libc::RTLD_NEXT, c"getpid".as_ptr()).is_null());
        }
    }
}
