// Export the runtime's C entry points from outcore's own executables
// (binaries, tests, examples, benches) so that C code in the process, such
// as the LD_PRELOAD shim, finds them with dlsym(RTLD_DEFAULT, ...).
fn main() {
    for sym in ["outcore_evict", "outcore_usage", "outcore_cap"] {
        println!("cargo:rustc-link-arg=-Wl,--export-dynamic-symbol={sym}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
