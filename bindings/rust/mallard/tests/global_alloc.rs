//! Mallard as this test program's global allocator: alignments, realloc, zeroed memory, threads, ctl and stats.
use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::mpsc;
use std::thread;

use mallard::{ctl_call, ctl_read, ctl_read_str, ctl_write, CtlError, Mallard, StatsFormat};

#[global_allocator]
static GLOBAL: Mallard = Mallard;

/// Byte i of a block filled by `fill` with seed s (differs between neighbours and between blocks).
fn pattern(seed: usize, i: usize) -> u8 {
    (seed.wrapping_mul(31).wrapping_add(i * 7) % 251) as u8
}

unsafe fn fill(p: *mut u8, len: usize, seed: usize) {
    for i in 0..len {
        *p.add(i) = pattern(seed, i);
    }
}

unsafe fn check(p: *const u8, len: usize, seed: usize) {
    for i in 0..len {
        assert_eq!(*p.add(i), pattern(seed, i), "byte {i} of {len} changed");
    }
}

#[test]
fn the_global_allocator_is_mallard() {
    let b = Box::new([7u64; 4]);
    assert!(mallard::owns(&*b as *const [u64; 4]), "a Box does not come from Mallard");
    let s = String::from("mallard");
    assert!(mallard::owns(s.as_ptr()));
    // Not replacing malloc: memory from the C library's malloc is not Mallard's.
    extern "C" {
        fn malloc(n: usize) -> *mut u8;
        fn free(p: *mut u8);
    }
    unsafe {
        let p = malloc(64);
        assert!(!mallard::owns(p), "the crate replaced the process's malloc");
        free(p);
    }
}

#[test]
fn every_alignment_up_to_one_mebibyte() {
    let mut align = 1usize;
    while align <= 1 << 20 {
        for size in [1, align / 2 + 1, align, align + 1, 3 * align + 5, 100_000] {
            let layout = Layout::from_size_align(size, align).unwrap();
            unsafe {
                let p = alloc(layout);
                assert!(!p.is_null(), "alloc({size}, {align}) failed");
                assert_eq!(p as usize % align, 0, "alloc({size}, {align}) is misaligned: {p:p}");
                fill(p, size, size ^ align);
                // Growth and shrink keep the alignment and the contents.
                let grown = realloc(p, layout, size * 2 + 64);
                assert!(!grown.is_null());
                assert_eq!(grown as usize % align, 0, "realloc lost alignment {align}");
                check(grown, size, size ^ align);
                let small = (size / 3).max(1);
                let shrunk = realloc(grown, Layout::from_size_align(size * 2 + 64, align).unwrap(), small);
                assert!(!shrunk.is_null());
                assert_eq!(shrunk as usize % align, 0, "shrinking realloc lost alignment {align}");
                check(shrunk, small, size ^ align);
                dealloc(shrunk, Layout::from_size_align(small, align).unwrap());

                // black_box: the compiler knows alloc_zeroed's memory is zero and would fold the check away.
                let z = black_box(alloc_zeroed(layout));
                assert!(!z.is_null());
                assert_eq!(z as usize % align, 0, "alloc_zeroed({size}, {align}) is misaligned");
                assert!((0..size).all(|i| *z.add(i) == 0), "alloc_zeroed({size}, {align}) is not zeroed");
                dealloc(z, layout);
            }
        }
        align *= 2;
    }
}

#[test]
fn realloc_grows_and_shrinks_across_size_classes() {
    let sizes = [1usize, 15, 16, 17, 100, 128, 129, 1000, 4096, 5000, 65536, 300_000, 4 << 20, 10_000, 24, 3];
    unsafe {
        let mut layout = Layout::from_size_align(sizes[0], 8).unwrap();
        let p0 = alloc(layout);
        fill(p0, sizes[0], 1);
        let mut p = p0;
        let mut valid = sizes[0];   // bytes still carrying the original pattern
        for &n in &sizes[1..] {
            p = realloc(p, layout, n);
            assert!(!p.is_null(), "realloc to {n} failed");
            valid = valid.min(n);
            check(p, valid, 1);
            // Refill the whole block so that growth is checked over every byte next time.
            fill(p, n, 1);
            valid = n;
            layout = Layout::from_size_align(n, 8).unwrap();
        }
        dealloc(p, layout);
    }
    // The same through Vec and String, as programs do it.
    let mut v: Vec<u32> = Vec::new();
    for i in 0..1_000_000u32 {
        v.push(i.wrapping_mul(2654435761));
    }
    v.truncate(1000);
    v.shrink_to_fit();
    assert!(v.iter().enumerate().all(|(i, &x)| x == (i as u32).wrapping_mul(2654435761)));
    let mut s = String::new();
    for i in 0..10_000 {
        s.push_str(&i.to_string());
    }
    assert!(s.starts_with("0123456789101112") && s.ends_with("9999"));
}

#[test]
fn zeroed_memory_is_zero_even_after_reuse() {
    for &size in &[8usize, 100, 4000, 70_000, 2 << 20] {
        let n = (16usize << 20) / size;
        let n = n.clamp(4, 2000);
        // Dirty many blocks of the size first and free them, so that recycled blocks would show it.
        let dirty: Vec<Vec<u8>> = (0..n).map(|_| black_box(vec![0xffu8; size])).collect();
        drop(black_box(dirty));
        // vec![0; n] is alloc_zeroed; black_box: the compiler would assume its memory is zero.
        let zeroed: Vec<Vec<u8>> = (0..n).map(|_| black_box(vec![0u8; size])).collect();
        for z in &zeroed {
            assert!(z.iter().all(|&b| b == 0), "vec![0; {size}] is not zeroed");
        }
    }
}

#[test]
fn many_threads_allocate_and_free_across_threads() {
    let (tx, rx) = mpsc::channel::<Vec<String>>();
    let producers: Vec<_> = (0..8)
        .map(|t| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut map: HashMap<usize, Vec<u8>> = HashMap::new();
                for i in 0..20_000 {
                    map.insert(i % 512, vec![(t + i) as u8; (i * 37) % 3000 + 1]);
                    if i % 100 == 0 {
                        // Blocks allocated here are freed by the consumer thread.
                        tx.send((0..50).map(|k| format!("{t}-{i}-{k}")).collect()).unwrap();
                    }
                }
                for (k, v) in &map {
                    assert!(v.iter().all(|&b| b == v[0]), "block {k} of thread {t} changed");
                }
            })
        })
        .collect();
    drop(tx);
    let consumer = thread::spawn(move || {
        let mut n = 0usize;
        for batch in rx {
            assert!(batch[0].contains('-'));
            n += batch.len();
        }
        n
    });
    for p in producers {
        p.join().unwrap();
    }
    assert_eq!(consumer.join().unwrap(), 8 * 200 * 50);
}

#[test]
fn ctl_reads_writes_and_reports_errors() {
    assert_eq!(ctl_read_str("version").unwrap(), "0.1.0");
    assert_eq!(mallard::version(), "0.1.0");
    assert_eq!(ctl_read::<bool>("opt.secure").unwrap(), cfg!(feature = "secure"));
    let narenas: u32 = ctl_read("arenas.narenas").unwrap();
    assert!(narenas >= 1);
    // This thread's allocation counter follows an allocation of 8 MiB.
    let before: u64 = ctl_read("thread.allocated").unwrap();
    let big = vec![1u8; 8 << 20];
    black_box(&big);
    let after: u64 = ctl_read("thread.allocated").unwrap();
    assert!(after - before >= 8 << 20, "thread.allocated grew by {} only", after - before);
    assert!(ctl_read::<usize>("stats.allocated").unwrap() >= 8 << 20);
    drop(big);
    ctl_call("thread.tcache.flush").unwrap();
    mallard::collect(true);

    assert_eq!(ctl_read::<u64>("no.such.name"), Err(CtlError::NotFound));
    assert_eq!(ctl_read::<u32>("stats.allocated"), Err(CtlError::Invalid), "a u32 read of a size_t");
    assert_eq!(ctl_write("stats.allocated", 0usize), Err(CtlError::ReadOnly));
    assert_eq!(ctl_read::<u64>("bad\0name"), Err(CtlError::BadName));
    assert!(CtlError::ReadOnly.to_string().contains("read-only"));
}

#[test]
fn statistics_reports() {
    let keep: Vec<Vec<u8>> = (0..100).map(|i| vec![i as u8; 1000]).collect();
    let json = mallard::stats_report(StatsFormat::Json);
    assert!(json.trim_start().starts_with('{') && json.trim_end().ends_with('}'), "{json}");
    assert!(json.contains("\"allocated\""), "{json}");
    let text = mallard::stats_report(StatsFormat::Text);
    assert!(text.contains("allocated"), "{text}");
    assert!(mallard::good_size(100) >= 100);
    black_box(keep);
}
