//! The workloads on Rust's default allocator (glibc malloc).
fn main() {
    mallard_rust_bench::main("system")
}
