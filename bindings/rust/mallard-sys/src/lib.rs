//! Raw bindings to Mallard's prefixed C API (`include/mallard.h`): every function is `unsafe` and follows the
//! contract of its C counterpart. The safe allocator and wrappers are in the `mallard` crate.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

/// `flags` of the `*allocx` functions: the low 6 bits are log2 of the alignment.
#[inline]
pub const fn mallocx_lg_align(lg: u32) -> c_int {
    lg as c_int
}
/// `flags` bit of the `*allocx` functions: zero the memory.
pub const MALLOCX_ZERO: c_int = 0x40;

/// Callback of [`mallard_stats_print`]: receives one piece of the report as a NUL-terminated string.
pub type mallard_write_cb = unsafe extern "C" fn(opaque: *mut c_void, text: *const c_char);

extern "C" {
    pub fn mallard_malloc(size: usize) -> *mut c_void;
    pub fn mallard_calloc(n: usize, size: usize) -> *mut c_void;
    pub fn mallard_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    pub fn mallard_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void;
    pub fn mallard_free(p: *mut c_void);
    pub fn mallard_free_sized(p: *mut c_void, size: usize);
    pub fn mallard_free_aligned_sized(p: *mut c_void, align: usize, size: usize);
    pub fn mallard_aligned_alloc(align: usize, size: usize) -> *mut c_void;
    pub fn mallard_posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int;
    pub fn mallard_usable_size(p: *const c_void) -> usize;
    pub fn mallard_good_size(size: usize) -> usize;

    pub fn mallard_nallocx(size: usize, flags: c_int) -> usize;
    pub fn mallard_mallocx(size: usize, flags: c_int) -> *mut c_void;
    pub fn mallard_rallocx(p: *mut c_void, size: usize, flags: c_int) -> *mut c_void;
    pub fn mallard_xallocx(p: *mut c_void, size: usize, extra: usize, flags: c_int) -> usize;
    pub fn mallard_sallocx(p: *const c_void, flags: c_int) -> usize;
    pub fn mallard_dallocx(p: *mut c_void, flags: c_int);
    pub fn mallard_sdallocx(p: *mut c_void, size: usize, flags: c_int);

    pub fn mallard_owns(p: *const c_void) -> bool;
    pub fn mallard_collect(force: bool);
    pub fn mallard_ctl(
        name: *const c_char,
        oldp: *mut c_void,
        oldlenp: *mut usize,
        newp: *mut c_void,
        newlen: usize,
    ) -> c_int;
    pub fn mallard_stats_print(write_cb: Option<mallard_write_cb>, opaque: *mut c_void, opts: *const c_char);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_and_free_through_the_c_library() {
        unsafe {
            let p = mallard_malloc(100) as *mut u8;
            assert!(!p.is_null());
            assert!(mallard_owns(p as *const c_void));
            assert!(mallard_usable_size(p as *const c_void) >= 100);
            p.write_bytes(0xab, 100);
            mallard_free_sized(p as *mut c_void, 100);
        }
    }
}
