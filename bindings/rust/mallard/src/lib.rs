//! The Mallard memory allocator for Rust: [`Mallard`] as the global allocator, and safe access to its
//! statistics and control namespace ([`ctl_read`], [`ctl_write`], [`stats_report`]).
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: mallard::Mallard = mallard::Mallard;
//!
//! fn main() {
//!     let v = vec![1u8; 1 << 20];
//!     assert!(mallard::owns(v.as_ptr()));
//!     let allocated: usize = mallard::ctl_read("stats.allocated").unwrap();
//!     println!("{} bytes allocated, Mallard {}", allocated, mallard::version());
//!     print!("{}", mallard::stats_report(mallard::StatsFormat::Text));
//! }
//! ```
//!
//! The crate uses Mallard's prefixed API (`mallard_malloc`, ...): the C library's own `malloc` stays the
//! system's. The `secure` feature builds the hardened variant.

use core::alloc::{GlobalAlloc, Layout};
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_void};
use std::fmt;

use mallard_sys as ffi;

/// Every block Mallard hands out is aligned to this (its size classes are multiples of 16 bytes).
const MIN_ALIGN: usize = 16;

/// The global allocator: `#[global_allocator] static A: mallard::Mallard = mallard::Mallard;`
#[derive(Clone, Copy, Debug, Default)]
pub struct Mallard;

/// The `*allocx` flags asking for `align` (a power of two, as `Layout` guarantees).
#[inline]
fn align_flags(align: usize) -> i32 {
    ffi::mallocx_lg_align(align.trailing_zeros())
}

unsafe impl GlobalAlloc for Mallard {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIN_ALIGN {
            ffi::mallard_malloc(layout.size()) as *mut u8
        } else {
            ffi::mallard_aligned_alloc(layout.align(), layout.size()) as *mut u8
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIN_ALIGN {
            ffi::mallard_calloc(1, layout.size()) as *mut u8
        } else {
            ffi::mallard_mallocx(layout.size(), align_flags(layout.align()) | ffi::MALLOCX_ZERO) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // The layout is the allocation's: Mallard gets its size (and alignment) with the free.
        if layout.align() <= MIN_ALIGN {
            ffi::mallard_free_sized(ptr as *mut c_void, layout.size())
        } else {
            ffi::mallard_free_aligned_sized(ptr as *mut c_void, layout.align(), layout.size())
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MIN_ALIGN {
            ffi::mallard_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            // realloc would only promise 16 bytes of alignment: rallocx keeps the layout's.
            ffi::mallard_rallocx(ptr as *mut c_void, new_size, align_flags(layout.align())) as *mut u8
        }
    }
}

/// Why a [`ctl_read`], [`ctl_write`] or [`ctl_call`] failed (the errno codes of `mallard_ctl`, docs/CTL.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CtlError {
    /// No such name (or index out of range): ENOENT.
    NotFound,
    /// Wrong value type or size, bad value, or an access the name does not take: EINVAL.
    Invalid,
    /// A write to a read-only name: EPERM.
    ReadOnly,
    /// No memory for the requested object: EAGAIN.
    NoMemory,
    /// The name contains a NUL byte.
    BadName,
    /// Another error code.
    Other(i32),
}

impl fmt::Display for CtlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtlError::NotFound => write!(f, "no such mallard_ctl name"),
            CtlError::Invalid => write!(f, "wrong type, size or value for this mallard_ctl name"),
            CtlError::ReadOnly => write!(f, "this mallard_ctl name is read-only"),
            CtlError::NoMemory => write!(f, "no memory for the mallard_ctl request"),
            CtlError::BadName => write!(f, "a mallard_ctl name cannot contain a NUL byte"),
            CtlError::Other(code) => write!(f, "mallard_ctl failed with error code {code}"),
        }
    }
}

impl std::error::Error for CtlError {}

fn check(rc: i32) -> Result<(), CtlError> {
    match rc {
        0 => Ok(()),
        libc_errno::ENOENT => Err(CtlError::NotFound),
        libc_errno::EINVAL => Err(CtlError::Invalid),
        libc_errno::EPERM => Err(CtlError::ReadOnly),
        libc_errno::EAGAIN => Err(CtlError::NoMemory),
        other => Err(CtlError::Other(other)),
    }
}

/// Linux errno values returned by `mallard_ctl`.
mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EAGAIN: i32 = 11;
    pub const EINVAL: i32 = 22;
}

fn c_name(name: &str) -> Result<CString, CtlError> {
    CString::new(name).map_err(|_| CtlError::BadName)
}

/// A plain value `mallard_ctl` reads or writes by size: `mallard_ctl` checks that the size matches the name's
/// type, so a wrong choice is an [`CtlError::Invalid`], never a wrong read.
pub trait CtlValue: Copy + Default + sealed::Sealed {}
mod sealed {
    pub trait Sealed {}
}
macro_rules! ctl_value {
    ($($t:ty),*) => { $(impl sealed::Sealed for $t {} impl CtlValue for $t {})* };
}
// bool, unsigned (u32), long (i64), size_t (usize), uint64_t (u64), as the table of docs/CTL.md lists them.
ctl_value!(bool, u32, i64, usize, u64);

/// Reads a numeric or boolean name, e.g. `ctl_read::<usize>("stats.allocated")`.
pub fn ctl_read<T: CtlValue>(name: &str) -> Result<T, CtlError> {
    let name = c_name(name)?;
    let mut value = T::default();
    let mut len = core::mem::size_of::<T>();
    // SAFETY: oldp points at a T of len bytes; mallard_ctl writes at most len bytes and fails otherwise.
    let rc = unsafe {
        ffi::mallard_ctl(name.as_ptr(), &mut value as *mut T as *mut c_void, &mut len, core::ptr::null_mut(), 0)
    };
    check(rc).map(|()| value)
}

/// Reads a string name (`version`, `opt.thp`, `opt.stats_print_opts`).
pub fn ctl_read_str(name: &str) -> Result<String, CtlError> {
    let name = c_name(name)?;
    let mut value: *const c_char = core::ptr::null();
    let mut len = core::mem::size_of::<*const c_char>();
    // SAFETY: oldp points at a pointer-sized slot; the library stores a pointer to a static NUL-terminated string.
    let rc = unsafe {
        ffi::mallard_ctl(
            name.as_ptr(),
            &mut value as *mut *const c_char as *mut c_void,
            &mut len,
            core::ptr::null_mut(),
            0,
        )
    };
    check(rc)?;
    if value.is_null() {
        return Err(CtlError::Invalid);
    }
    // SAFETY: non-null, NUL-terminated, owned by the library for the life of the process.
    Ok(unsafe { CStr::from_ptr(value) }.to_string_lossy().into_owned())
}

/// Writes a numeric or boolean name, e.g. `ctl_write("thread.arena", 1u32)`.
pub fn ctl_write<T: CtlValue>(name: &str, value: T) -> Result<(), CtlError> {
    let name = c_name(name)?;
    let mut value = value;
    // SAFETY: newp points at a T of newlen bytes, only read by the library.
    let rc = unsafe {
        ffi::mallard_ctl(
            name.as_ptr(),
            core::ptr::null_mut(),
            core::ptr::null_mut(),
            &mut value as *mut T as *mut c_void,
            core::mem::size_of::<T>(),
        )
    };
    check(rc)
}

/// Calls an action name that takes no value (`thread.tcache.flush`, `arena.<i>.purge`, `arena.<i>.decay`).
pub fn ctl_call(name: &str) -> Result<(), CtlError> {
    let name = c_name(name)?;
    // SAFETY: no buffers are passed.
    let rc = unsafe {
        ffi::mallard_ctl(name.as_ptr(), core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut(), 0)
    };
    check(rc)
}

/// The format of [`stats_report`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    /// The human-readable tables (docs/STATS.md).
    Text,
    /// One JSON document.
    Json,
}

unsafe extern "C" fn append_to_string(opaque: *mut c_void, text: *const c_char) {
    // SAFETY: opaque is the &mut String passed by stats_report; text is a NUL-terminated piece of the report.
    let out = &mut *(opaque as *mut String);
    out.push_str(&CStr::from_ptr(text).to_string_lossy());
}

/// Mallard's statistics report as a string (the library releases its locks before writing, so the report
/// may allocate, through Mallard too).
pub fn stats_report(format: StatsFormat) -> String {
    let mut out = String::new();
    let opts: &[u8] = match format {
        StatsFormat::Text => b"\0",
        StatsFormat::Json => b"J\0",
    };
    // SAFETY: the callback only runs during this call, while `out` is alive and not otherwise borrowed.
    unsafe {
        ffi::mallard_stats_print(
            Some(append_to_string),
            &mut out as *mut String as *mut c_void,
            opts.as_ptr() as *const c_char,
        )
    };
    out
}

/// Gives cached memory back to the OS now (`force`: even the last empty page of each size class).
pub fn collect(force: bool) {
    // SAFETY: no arguments to get wrong.
    unsafe { ffi::mallard_collect(force) }
}

/// True when `ptr` points into memory Mallard handed out (a cheap ownership check).
pub fn owns<T: ?Sized>(ptr: *const T) -> bool {
    // SAFETY: mallard_owns only compares the address with Mallard's own mappings; it never dereferences it.
    unsafe { ffi::mallard_owns(ptr as *const c_void) }
}

/// The usable size `malloc(size)` would really give (what a buffer of `size` bytes can grow to in place).
pub fn good_size(size: usize) -> usize {
    // SAFETY: pure computation.
    unsafe { ffi::mallard_good_size(size) }
}

/// The library's version string (`MALLARD_VERSION` of mallard.h).
pub fn version() -> String {
    ctl_read_str("version").unwrap_or_default()
}
