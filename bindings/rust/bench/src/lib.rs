//! Rust allocation workloads, timed in one process per allocator (the binaries in src/bin set the global allocator).
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::mpsc;
use std::thread;
use std::time::Instant;

/// A small deterministic generator (xorshift64*): the same sequence of sizes under every allocator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

/// Vectors of 1..2048 elements built, kept in a window of 1000 and dropped out of order.
fn vec_churn(seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut window: Vec<Vec<u64>> = (0..1000).map(|_| Vec::new()).collect();
    let mut sum = 0;
    for i in 0..1_500_000 {
        let n = if i % 16 == 0 { rng.below(2048) + 1 } else { rng.below(24) + 1 };
        let mut v = Vec::with_capacity(n / 2 + 1);
        for k in 0..n {
            v.push(k as u64);   // grows past the capacity: realloc
        }
        sum += v.len();
        let slot = rng.below(1000);
        window[slot] = v;
    }
    black_box(&window);
    sum
}

/// Strings formatted, concatenated and dropped: many small allocations of varying sizes.
fn string_churn(seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut keep: Vec<String> = Vec::with_capacity(512);
    let mut total = 0;
    for i in 0..800_000 {
        let mut s = format!("item-{}-{}", i, rng.next() % 100_000);
        if i % 3 == 0 {
            s.push_str(&"x".repeat(rng.below(200)));
        }
        total += s.len();
        if keep.len() < 512 {
            keep.push(s);
        } else {
            let slot = rng.below(512);
            keep[slot] = s;
        }
    }
    black_box(&keep);
    total
}

/// A HashMap of String keys and Vec values with inserts, updates, removals and rehashing growth.
fn hashmap_churn(seed: u64) -> usize {
    let mut rng = Rng(seed);
    let mut total = 0;
    for _round in 0..6 {
        let mut map: HashMap<String, Vec<u32>> = HashMap::new();
        for _ in 0..150_000 {
            let key = format!("k{}", rng.below(50_000));
            match rng.below(4) {
                0 => {
                    map.remove(&key);
                }
                _ => {
                    let n = rng.below(16) + 1;
                    map.entry(key).or_default().extend(0..n as u32);
                }
            }
        }
        total += map.len();
    }
    total
}

/// Two producer threads allocate messages that a consumer thread drops: every free is a remote free.
fn cross_thread_drop(seed: u64) -> usize {
    let (tx, rx) = mpsc::sync_channel::<Vec<Box<[u8]>>>(64);
    let producers: Vec<_> = (0..2u64)
        .map(|t| {
            let tx = tx.clone();
            thread::spawn(move || {
                let mut rng = Rng(seed ^ ((t + 1) * 0x9e37_79b9));
                for _ in 0..25_000 {
                    let batch: Vec<Box<[u8]>> =
                        (0..16).map(|_| vec![1u8; rng.below(1000) + 8].into_boxed_slice()).collect();
                    tx.send(batch).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let consumer = thread::spawn(move || rx.into_iter().map(|b| b.len()).sum::<usize>());
    for p in producers {
        p.join().unwrap();
    }
    consumer.join().unwrap()
}

/// vec_churn in two threads at once (each thread on its own heap).
fn vec_churn_t2(seed: u64) -> usize {
    let hs: Vec<_> = (0..2u64).map(|t| thread::spawn(move || vec_churn(seed + t))).collect();
    hs.into_iter().map(|h| h.join().unwrap()).sum()
}

/// A workload: its name and the function running it once from a seed.
pub type Workload = (&'static str, fn(u64) -> usize);

pub const WORKLOADS: &[Workload] = &[
    ("vec_churn", vec_churn),
    ("string_churn", string_churn),
    ("hashmap_churn", hashmap_churn),
    ("cross_thread_drop", cross_thread_drop),
    ("vec_churn_t2", vec_churn_t2),
];

/// Runs every workload once (or those named in argv) and prints `allocator workload seconds` lines.
pub fn main(allocator: &str) {
    let only: Vec<String> = std::env::args().skip(1).collect();
    for (name, f) in WORKLOADS {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        let t = Instant::now();
        let r = f(42);
        let secs = t.elapsed().as_secs_f64();
        black_box(r);
        println!("{allocator} {name} {secs:.6}");
    }
}
