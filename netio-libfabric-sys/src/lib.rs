//! Raw FFI bindings to the system [libfabric] (OpenFabrics Interfaces),
//! version 1.17 or newer, for the libfabric provider of netio-rs.
//!
//! This crate is **raw FFI only**: every function is an `unsafe extern "C"`
//! declaration with the C signature, every struct is the `#[repr(C)]` C
//! layout, and nothing here checks arguments, owns resources or closes
//! anything. Safe wrappers belong in the crate above this one.
//!
//! # Coverage
//!
//! Everything declared in `rdma/fabric.h`, `rdma/fi_errno.h`,
//! `rdma/fi_domain.h`, `rdma/fi_endpoint.h`, `rdma/fi_cm.h`,
//! `rdma/fi_eq.h`, `rdma/fi_rma.h` and `rdma/fi_tagged.h` (see `wrapper.h`):
//!
//! * the exported functions ([`fi_getinfo`], [`fi_freeinfo`],
//!   [`fi_dupinfo`], [`fi_fabric`], [`fi_strerror`], [`fi_version`], …);
//! * the `static inline` API, which is most of libfabric's object model
//!   ([`fi_allocinfo`], [`fi_domain`], [`fi_endpoint`], [`fi_passive_ep`],
//!   [`fi_eq_open`], [`fi_cq_open`], [`fi_ep_bind`], [`fi_pep_bind`],
//!   [`fi_enable`], [`fi_control`], [`fi_trywait`], [`fi_close`],
//!   [`fi_listen`], [`fi_connect`], [`fi_accept`], [`fi_getname`],
//!   [`fi_shutdown`], [`fi_send`], [`fi_recv`], [`fi_cq_read`],
//!   [`fi_eq_read`], [`fi_mr_reg`], [`fi_mr_desc`], …). These have no
//!   symbol in `libfabric.so`: bindgen's `wrap_static_fns` generated one
//!   C shim per function (`src/shims.c`, named `<function>__extern`), the
//!   Rust declarations link to the shims under the C name;
//! * the constants: capability, mode and operation flags (`FI_MSG`,
//!   `FI_SOURCE`, `FI_CONTEXT`, `FI_ORDER_*`, … as `u64`, the type of the
//!   fields and arguments they go in), error numbers (`FI_ENODATA`, … as
//!   `c_int`; functions return them negated), enum values without the enum
//!   name (`FI_EP_MSG`, `FI_WAIT_FD`, `FI_GETWAIT`, `FI_SOCKADDR_IN`, …).
//!   Values of anonymous C enums have bindgen's numbered `c_uint` alias
//!   types (`_bindgen_ty_N`, not stable across regenerations): use them
//!   through casts (`FI_GETWAIT as c_int` for [`fi_control`]), never name
//!   the alias;
//! * written by hand, because bindgen cannot evaluate their casts:
//!   [`FI_ADDR_UNSPEC`], [`FI_ADDR_NOTAVAIL`], [`FI_KEY_NOTAVAIL`],
//!   [`FI_SHARED_CONTEXT`], and the function-like macros [`FI_VERSION`],
//!   [`FI_MAJOR`], [`FI_MINOR`].
//!
//! Not covered: atomics (`fi_atomic.h`), triggered operations,
//! collectives and the provider extension headers.
//!
//! # Build
//!
//! The bindings (`src/bindings.rs`) and the shims (`src/shims.c`) are
//! generated once and checked in, so a normal build needs no libclang: the
//! build script probes `libfabric >= 1.17` with pkg-config (which also
//! emits the link flags for `-lfabric`), and compiles `src/shims.c` with
//! the `cc` crate. On Debian/Ubuntu the system package is
//! `apt-get install libfabric-dev pkg-config` (`libfabric-bin` adds
//! `fi_info`). Struct layouts were generated for `x86_64-unknown-linux-gnu`;
//! the generated layout assertions stop the build elsewhere, regenerate
//! there.
//!
//! # Regenerating
//!
//! With libclang installed (`apt-get install libclang-dev clang`), from the
//! workspace root:
//!
//! ```text
//! cargo build -p netio-libfabric-sys --features regenerate
//! ```
//!
//! rewrites `src/bindings.rs` and `src/shims.c` from the installed headers
//! (see the `regenerate` module of `build.rs` for the bindgen options);
//! review and commit the diff.
//!
//! # Pitfalls
//!
//! * [`fi_freeinfo`] frees every string of an `fi_info`, so strings put in
//!   hints (`fabric_attr->prov_name`, …) must come from `malloc`/`strdup`,
//!   never from a Rust `CString`.
//! * Not every provider has a wait object: `udp;ofi_rxd` gives no wait fd.
//!
//! [libfabric]: https://ofiwg.github.io/libfabric/

#![no_std]

/// The bindgen output (`src/bindings.rs`), re-exported at the crate root.
#[rustfmt::skip]
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    missing_docs,
    dead_code,
    unsafe_op_in_unsafe_fn,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod bindings {
    include!("bindings.rs");
}

pub use bindings::*;

/// `FI_ADDR_UNSPEC`: no address (`(uint64_t) -1`).
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;
/// `FI_ADDR_NOTAVAIL`: address not available (`(uint64_t) -1`).
pub const FI_ADDR_NOTAVAIL: fi_addr_t = u64::MAX;
/// `FI_KEY_NOTAVAIL`: memory registration key not available
/// (`(uint64_t) -1`).
pub const FI_KEY_NOTAVAIL: u64 = u64::MAX;
/// `FI_SHARED_CONTEXT`: shared transmit/receive context (`SIZE_MAX`).
pub const FI_SHARED_CONTEXT: usize = usize::MAX;

/// `FI_VERSION(major, minor)`: the API version number [`fi_getinfo`] takes
/// and [`fi_version`] returns.
#[allow(non_snake_case)]
pub const fn FI_VERSION(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// `FI_MAJOR(version)`: the major part of a version number.
#[allow(non_snake_case)]
pub const fn FI_MAJOR(version: u32) -> u32 {
    version >> 16
}

/// `FI_MINOR(version)`: the minor part of a version number.
#[allow(non_snake_case)]
pub const fn FI_MINOR(version: u32) -> u32 {
    version & 0xFFFF
}
