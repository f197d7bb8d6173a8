//! The workloads on the mimalloc crate.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
fn main() {
    mallard_rust_bench::main("mimalloc")
}
