//! Compiles libmallard's C sources (c/src, a link to the repository's src/) into a static library with the
//! flags of CMake's prefixed library: prefixed API only (no MALLARD_OVERRIDE), statistics on, hidden symbols.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let c = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("c");
    let src = c.join("src");
    let mut sources: Vec<PathBuf> = fs::read_dir(&src)
        .unwrap_or_else(|e| panic!("cannot read the C sources in {}: {e}", src.display()))
        .map(|entry| entry.expect("readable directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    sources.sort();
    assert!(!sources.is_empty(), "no C sources in {}", src.display());

    let mut build = cc::Build::new();
    build
        .files(&sources)
        .include(c.join("include"))
        .include(&src)
        .flag("-std=gnu11")
        .flag("-fvisibility=hidden")
        .flag("-ftls-model=initial-exec")
        .flag_if_supported("-fno-plt")
        .define("MALLARD_STATS", None);
    if env::var_os("CARGO_FEATURE_SECURE").is_some() {
        build.define("MALLARD_SECURE", None);
    }
    build.compile("mallard");
    println!("cargo:rustc-link-lib=pthread");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed={}", c.join("include").display());
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }
}
