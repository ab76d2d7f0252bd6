//! Real calls into the system libfabric through the raw bindings: version,
//! `fi_getinfo` on the `tcp` and `sockets` providers, the error path of an
//! unknown provider, an event queue's wait fd, and a listening passive
//! endpoint on 127.0.0.1. Every opened resource is closed with `fi_close`
//! and every `fi_info` freed with `fi_freeinfo`.

use core::ffi::{c_int, c_void, CStr};
use core::ptr;

use netio_libfabric_sys::*;

/// The API version the tests ask for.
const VERSION: u32 = FI_VERSION(1, 17);

/// Hints for a connected (`FI_EP_MSG`) messaging endpoint over IPv4 on
/// provider `prov`. The caller frees them with `fi_freeinfo`.
fn msg_hints(prov: &CStr) -> *mut fi_info {
    // SAFETY: fi_allocinfo takes no argument; it returns a zeroed fi_info
    // with its attribute structs allocated, or null.
    let hints = unsafe { fi_allocinfo() };
    assert!(!hints.is_null(), "fi_allocinfo returned null");
    // SAFETY: `hints` is a valid fi_info from fi_allocinfo, whose
    // `ep_attr` and `fabric_attr` are allocated. `prov_name` is set to a
    // malloc'd copy (strdup), as fi_freeinfo frees it with free().
    unsafe {
        (*hints).caps = FI_MSG;
        (*hints).addr_format = FI_SOCKADDR_IN;
        (*(*hints).ep_attr).type_ = FI_EP_MSG;
        let name = libc::strdup(prov.as_ptr());
        assert!(!name.is_null(), "strdup failed");
        (*(*hints).fabric_attr).prov_name = name;
    }
    hints
}

/// `fi_getinfo` for `node`/`service` with `flags` and the hints of
/// [`msg_hints`]; frees the hints. Returns the return code and the list.
fn getinfo(
    prov: &CStr,
    node: Option<&CStr>,
    service: Option<&CStr>,
    flags: u64,
) -> (c_int, *mut fi_info) {
    let hints = msg_hints(prov);
    let mut info: *mut fi_info = ptr::null_mut();
    // SAFETY: node/service are null or NUL-terminated strings that outlive
    // the call, `hints` is a valid fi_info, `info` a valid out pointer.
    let rc = unsafe {
        fi_getinfo(
            VERSION,
            node.map_or(ptr::null(), CStr::as_ptr),
            service.map_or(ptr::null(), CStr::as_ptr),
            flags,
            hints,
            &mut info,
        )
    };
    // SAFETY: `hints` came from fi_allocinfo and is not used afterwards;
    // fi_getinfo does not keep it.
    unsafe { fi_freeinfo(hints) };
    (rc, info)
}

/// The error message of a negative libfabric return code.
fn strerror(rc: c_int) -> String {
    // SAFETY: fi_strerror accepts any error number and returns a pointer to
    // a static NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(fi_strerror(-rc)) };
    msg.to_string_lossy().into_owned()
}

/// The provider names of every entry of an `fi_info` list.
fn provider_names(mut info: *mut fi_info) -> Vec<String> {
    let mut names = Vec::new();
    while !info.is_null() {
        // SAFETY: `info` is an entry of a list returned by fi_getinfo and not
        // yet freed; fabric_attr and its prov_name are set by libfabric.
        unsafe {
            let attr = (*info).fabric_attr;
            if !attr.is_null() && !(*attr).prov_name.is_null() {
                names.push(
                    CStr::from_ptr((*attr).prov_name)
                        .to_string_lossy()
                        .into_owned(),
                );
            }
            info = (*info).next;
        }
    }
    names
}

/// `fi_close` on a fid, asserting success.
///
/// # Safety
///
/// `fid` is an open libfabric object not used afterwards.
unsafe fn close(fid: *mut fid, what: &str) {
    // SAFETY: guaranteed by the caller.
    let rc = unsafe { fi_close(fid) };
    assert_eq!(rc, 0, "fi_close({what}): {}", strerror(rc));
}

fn assert_finds_provider(prov: &CStr) {
    let (rc, info) = getinfo(prov, Some(c"127.0.0.1"), None, 0);
    assert_eq!(rc, 0, "fi_getinfo({prov:?}) failed: {}", strerror(rc));
    assert!(!info.is_null(), "fi_getinfo({prov:?}) returned no entry");
    let names = provider_names(info);
    // SAFETY: `info` is the list fi_getinfo returned, freed once.
    unsafe { fi_freeinfo(info) };
    let want = prov.to_str().unwrap();
    assert!(
        names.iter().any(|n| n == want),
        "no entry with provider {want:?}, got {names:?}"
    );
}

#[test]
fn version_is_at_least_1_17() {
    // SAFETY: fi_version takes no argument and has no precondition.
    let v = unsafe { fi_version() };
    assert!(
        v >= FI_VERSION(1, 17),
        "libfabric {}.{} is older than 1.17",
        FI_MAJOR(v),
        FI_MINOR(v)
    );
    assert_eq!(FI_MAJOR(VERSION), 1);
    assert_eq!(FI_MINOR(VERSION), 17);
}

#[test]
fn getinfo_finds_tcp() {
    assert_finds_provider(c"tcp");
}

#[test]
fn getinfo_finds_sockets() {
    assert_finds_provider(c"sockets");
}

#[test]
fn unknown_provider_gives_enodata() {
    let (rc, info) = getinfo(c"no-such-provider", Some(c"127.0.0.1"), None, 0);
    assert!(info.is_null(), "an unknown provider returned entries");
    assert_eq!(rc, -FI_ENODATA, "fi_getinfo: {}", strerror(rc));
    let msg = strerror(rc);
    assert!(!msg.is_empty(), "fi_strerror gave an empty message");
    assert!(!msg.starts_with("Unknown error"), "fi_strerror: {msg}");
}

#[test]
fn event_queue_has_a_wait_fd() {
    let (rc, info) = getinfo(c"tcp", Some(c"127.0.0.1"), None, 0);
    assert_eq!(rc, 0, "fi_getinfo: {}", strerror(rc));
    let mut fabric: *mut fid_fabric = ptr::null_mut();
    let mut domain: *mut fid_domain = ptr::null_mut();
    let mut eq: *mut fid_eq = ptr::null_mut();
    let mut fd: c_int = -1;
    // SAFETY: `info` is a valid entry from fi_getinfo; the out pointers are
    // valid; each object is opened from a successfully opened parent. `fd`
    // is the `int` FI_GETWAIT writes for FI_WAIT_FD.
    unsafe {
        let rc = fi_fabric((*info).fabric_attr, &mut fabric, ptr::null_mut());
        assert_eq!(rc, 0, "fi_fabric: {}", strerror(rc));
        let rc = fi_domain(fabric, info, &mut domain, ptr::null_mut());
        assert_eq!(rc, 0, "fi_domain: {}", strerror(rc));
        let mut attr = fi_eq_attr {
            size: 16,
            wait_obj: FI_WAIT_FD,
            ..Default::default()
        };
        let rc = fi_eq_open(fabric, &mut attr, &mut eq, ptr::null_mut());
        assert_eq!(rc, 0, "fi_eq_open: {}", strerror(rc));
        let rc = fi_control(
            &mut (*eq).fid,
            FI_GETWAIT as c_int,
            (&mut fd as *mut c_int).cast::<c_void>(),
        );
        assert_eq!(rc, 0, "fi_control(FI_GETWAIT): {}", strerror(rc));
    }
    assert!(fd >= 0, "FI_GETWAIT gave fd {fd}");
    // SAFETY: F_GETFD only reads the descriptor flags of `fd`.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    assert_ne!(flags, -1, "fd {fd} is not an open descriptor");
    // SAFETY: each object is open and closed once, children before parents;
    // `info` is freed once after its objects are closed.
    unsafe {
        close(&mut (*eq).fid, "eq");
        close(&mut (*domain).fid, "domain");
        close(&mut (*fabric).fid, "fabric");
        fi_freeinfo(info);
    }
}

#[test]
fn passive_endpoint_listens_on_an_ephemeral_port() {
    let (rc, info) = getinfo(c"tcp", Some(c"127.0.0.1"), Some(c"0"), FI_SOURCE);
    assert_eq!(rc, 0, "fi_getinfo(FI_SOURCE): {}", strerror(rc));
    let mut fabric: *mut fid_fabric = ptr::null_mut();
    let mut eq: *mut fid_eq = ptr::null_mut();
    let mut pep: *mut fid_pep = ptr::null_mut();
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut addr: libc::sockaddr_in = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::sockaddr_in>();
    // SAFETY: `info` is a valid entry from fi_getinfo; the out pointers are
    // valid; each object is opened from a successfully opened parent;
    // fi_getname writes at most `len` bytes into `addr`.
    unsafe {
        let rc = fi_fabric((*info).fabric_attr, &mut fabric, ptr::null_mut());
        assert_eq!(rc, 0, "fi_fabric: {}", strerror(rc));
        let mut attr = fi_eq_attr {
            size: 16,
            wait_obj: FI_WAIT_UNSPEC,
            ..Default::default()
        };
        let rc = fi_eq_open(fabric, &mut attr, &mut eq, ptr::null_mut());
        assert_eq!(rc, 0, "fi_eq_open: {}", strerror(rc));
        let rc = fi_passive_ep(fabric, info, &mut pep, ptr::null_mut());
        assert_eq!(rc, 0, "fi_passive_ep: {}", strerror(rc));
        let rc = fi_pep_bind(pep, &mut (*eq).fid, 0);
        assert_eq!(rc, 0, "fi_pep_bind: {}", strerror(rc));
        let rc = fi_listen(pep);
        assert_eq!(rc, 0, "fi_listen: {}", strerror(rc));
        let rc = fi_getname(
            &mut (*pep).fid,
            (&mut addr as *mut libc::sockaddr_in).cast::<c_void>(),
            &mut len,
        );
        assert_eq!(rc, 0, "fi_getname: {}", strerror(rc));
    }
    assert_eq!(
        c_int::from(addr.sin_family),
        libc::AF_INET,
        "not an IPv4 address"
    );
    assert_eq!(
        u32::from_be(addr.sin_addr.s_addr),
        0x7f00_0001,
        "not 127.0.0.1"
    );
    let port = u16::from_be(addr.sin_port);
    assert_ne!(port, 0, "the listening endpoint has port 0");
    // SAFETY: each object is open and closed once, the endpoint before the
    // event queue it is bound to, the fabric last; `info` is freed once.
    unsafe {
        close(&mut (*pep).fid, "pep");
        close(&mut (*eq).fid, "eq");
        close(&mut (*fabric).fid, "fabric");
        fi_freeinfo(info);
    }
}
