//! Compiles libmallard's C sources (c/src, a link to the repository's src/) into a static library with the
//! flags of CMake's prefixed library: prefixed API only (no MALLARD_OVERRIDE), statistics on, hidden symbols.
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let c = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("c");
    let src = c.join("src");
    // The sources lie in one folder per layer (src/LAYERS): every .c file below c/src.
    let mut sources: Vec<PathBuf> = Vec::new();
    collect_c(&src, &mut sources);
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

/// Every .c file under dir, folders included (one level per layer today; any depth accepted).
fn collect_c(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read the C sources in {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("readable directory entry").path();
        if path.is_dir() {
            collect_c(&path, out);
        } else if path.extension().is_some_and(|x| x == "c") {
            out.push(path);
        }
    }
}
