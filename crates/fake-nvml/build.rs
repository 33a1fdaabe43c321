//! Gives the cdylib the soname the real library has, so `ldd`, `dlopen("libnvidia-ml.so.1")`
//! and the peers' loaders treat it as NVML.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
