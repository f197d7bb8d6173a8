//! The workloads on the tikv-jemallocator crate.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
fn main() {
    mallard_rust_bench::main("jemalloc")
}
