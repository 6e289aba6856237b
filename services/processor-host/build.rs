//! Links the host against the libpython that pyo3 found and records its directory as the
//! binary's run path, so a Python installed outside the linker's default paths (pyenv, a
//! custom prefix) still loads without `LD_LIBRARY_PATH`.

fn main() {
    let config = pyo3_build_config::get();
    if let Some(lib_dir) = config.lib_dir() {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{lib_dir}");
    }
}
