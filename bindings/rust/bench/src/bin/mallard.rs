//! The workloads on the mallard crate.
#[global_allocator]
static GLOBAL: mallard::Mallard = mallard::Mallard;
fn main() {
    mallard_rust_bench::main("mallard")
}
