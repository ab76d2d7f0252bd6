//! Build script of `netio-libfabric-sys`.
//!
//! Normal build (no libclang needed): probe `libfabric >= 1.17` with
//! pkg-config (which emits the link flags), compile the checked-in C shims
//! `src/shims.c` (non-inline wrappers of libfabric's `static inline` API)
//! with `cc`.
//!
//! With the `regenerate` feature: first run bindgen over `wrapper.h` and
//! rewrite `src/bindings.rs` and `src/shims.c` from the installed headers.

use std::path::{Path, PathBuf};

const MIN_VERSION: &str = "1.17";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let lib = match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .probe("libfabric")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "netio-libfabric-sys needs the system libfabric >= {MIN_VERSION} \
             found through pkg-config (Debian/Ubuntu: `apt-get install libfabric-dev \
             pkg-config`): {e}"
        ),
    };

    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));

    #[cfg(feature = "regenerate")]
    regenerate::run(&manifest_dir, &lib.include_paths);
    #[cfg(not(feature = "regenerate"))]
    println!("cargo:rerun-if-changed=src/shims.c");

    compile_shims(&manifest_dir, &lib.include_paths);

    // For dependents (`DEP_FABRIC_INCLUDE`, `DEP_FABRIC_VERSION`).
    if let Some(inc) = lib.include_paths.first() {
        println!("cargo:include={}", inc.display());
    }
    println!("cargo:version={}", lib.version);
}

fn compile_shims(manifest_dir: &Path, include_paths: &[PathBuf]) {
    let mut build = cc::Build::new();
    build
        .file(manifest_dir.join("src/shims.c"))
        .includes(include_paths)
        .warnings(false);
    build.compile("netio_libfabric_shims");
}

#[cfg(feature = "regenerate")]
mod regenerate {
    //! bindgen run behind the `regenerate` feature.

    use std::collections::{HashMap, HashSet};
    use std::path::{Path, PathBuf};

    use bindgen::callbacks::{IntKind, ParseCallbacks};

    const HEADERS: &[&str] = &[
        "fabric.h",
        "fi_errno.h",
        "fi_domain.h",
        "fi_endpoint.h",
        "fi_cm.h",
        "fi_eq.h",
        "fi_rma.h",
        "fi_tagged.h",
    ];

    /// Gives libfabric's macros the C type they are used with: bit flags
    /// written with `ULL` (capabilities, modes, operation flags, message
    /// orders, aliases of those) become `u64`, error numbers and memory
    /// registration modes `c_int`. bindgen would otherwise pick `u32` for
    /// every value that fits.
    #[derive(Debug)]
    struct MacroTypes {
        u64_macros: HashSet<String>,
    }

    impl ParseCallbacks for MacroTypes {
        fn int_macro(&self, name: &str, _value: i64) -> Option<IntKind> {
            if self.u64_macros.contains(name) || name.starts_with("FI_ORDER_") {
                Some(IntKind::U64)
            } else if name.starts_with("FI_E") || name == "FI_SUCCESS" || name.starts_with("FI_MR_")
            {
                Some(IntKind::Int)
            } else {
                None
            }
        }
    }

    fn find_header(include_paths: &[PathBuf], name: &str) -> PathBuf {
        include_paths
            .iter()
            .map(PathBuf::as_path)
            .chain([Path::new("/usr/local/include"), Path::new("/usr/include")])
            .map(|dir| dir.join("rdma").join(name))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("rdma/{name} not found"))
    }

    /// Names of the `#define FI_X ...` whose body has a `ULL` literal, or is
    /// the name of such a macro (`FI_TRANSMIT` = `FI_SEND`).
    fn u64_macros(include_paths: &[PathBuf]) -> HashSet<String> {
        let mut bodies = HashMap::new();
        for h in HEADERS {
            let text = std::fs::read_to_string(find_header(include_paths, h)).expect("read header");
            for line in text.lines() {
                let Some(rest) = line.trim_start().strip_prefix("#define") else {
                    continue;
                };
                let mut parts = rest.trim().splitn(2, char::is_whitespace);
                let (Some(name), Some(body)) = (parts.next(), parts.next()) else {
                    continue;
                };
                if name.starts_with("FI_") && !name.contains('(') {
                    let body = body.split("/*").next().unwrap_or("").trim().to_owned();
                    bodies.insert(name.to_owned(), body);
                }
            }
        }
        let mut set: HashSet<String> = bodies
            .iter()
            .filter(|(_, b)| b.contains("ULL"))
            .map(|(n, _)| n.clone())
            .collect();
        loop {
            let more: Vec<String> = bodies
                .iter()
                .filter(|(n, b)| !set.contains(*n) && set.contains(b.as_str()))
                .map(|(n, _)| n.clone())
                .collect();
            if more.is_empty() {
                break set;
            }
            set.extend(more);
        }
    }

    pub fn run(manifest_dir: &Path, include_paths: &[PathBuf]) {
        let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        let shim_base = out_dir.join("shims");
        let bindings = bindgen::Builder::default()
            .header(manifest_dir.join("wrapper.h").to_str().expect("utf-8 path"))
            .clang_args(include_paths.iter().map(|p| format!("-I{}", p.display())))
            .rust_target(bindgen::RustTarget::stable(85, 0).expect("rust target"))
            .rust_edition(bindgen::RustEdition::Edition2021)
            .allowlist_file(r".*/rdma/(fabric|fi_[a-z_]+)\.h")
            // Casts bindgen cannot evaluate: defined by hand in lib.rs.
            .blocklist_item("FI_ADDR_UNSPEC|FI_ADDR_NOTAVAIL|FI_KEY_NOTAVAIL|FI_SHARED_CONTEXT")
            // Compiler-attribute helpers, not API.
            .blocklist_item("FI_DEPRECATED_.*|FI_FORMAT_PRINTF|FI_.*_H")
            .ctypes_prefix("::core::ffi")
            .use_core()
            .prepend_enum_name(false)
            .generate_comments(false)
            .merge_extern_blocks(true)
            .wrap_unsafe_ops(true)
            .derive_default(true)
            .derive_debug(true)
            .parse_callbacks(Box::new(MacroTypes {
                u64_macros: u64_macros(include_paths),
            }))
            .wrap_static_fns(true)
            .wrap_static_fns_path(&shim_base)
            .generate()
            .expect("bindgen failed on wrapper.h");

        let banner = "Generated by bindgen from netio-libfabric-sys/wrapper.h against the \
                      system libfabric headers; do not edit. Regenerate with \
                      `cargo build -p netio-libfabric-sys --features regenerate`.";
        let mut rs = format!("// {banner}\n\n");
        rs.push_str(&bindings.to_string());
        std::fs::write(manifest_dir.join("src/bindings.rs"), rs).expect("write src/bindings.rs");

        // The generated C file includes wrapper.h by absolute path: make it
        // relative to src/ so the checked-in file builds anywhere.
        let c =
            std::fs::read_to_string(shim_base.with_extension("c")).expect("read generated shims");
        let header = manifest_dir.join("wrapper.h");
        let c = c.replace(
            &format!("#include \"{}\"", header.display()),
            "#include \"../wrapper.h\"",
        );
        assert!(
            c.contains("#include \"../wrapper.h\""),
            "unexpected shim include line"
        );
        std::fs::write(
            manifest_dir.join("src/shims.c"),
            format!("/* {banner} */\n\n{c}"),
        )
        .expect("write src/shims.c");
    }
}
