//! The netio-rs conformance suite on libfabric's `verbs` provider, in both
//! thread modes: on a real verbs device, or on soft-RoCE in the emulated
//! guest of `scripts/verbs-guest.sh`, which the test command runs it in:
//!
//! ```text
//! cargo test -p netio-libfabric --features verbs-conformance --test conformance_verbs --no-run
//! bash scripts/verbs-guest.sh -- target/debug/deps/conformance_verbs-…
//! ```
//!
//! On a cluster node set `NETIO_VERBS_ADDR` (the IPoIB or RoCE interface's
//! address) and `NETIO_VERBS_DOMAIN` (the device, e.g. `mlx5_0`).
#![cfg(feature = "verbs-conformance")]

mod harness;

pub use harness::Verbs;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::Verbs>,
    unsupported = [
        reset = "a verbs connection has no kernel socket to abort from outside (ss -K), and \
                 libfabric reports a peer's disconnect as an orderly FI_SHUTDOWN, so this \
                 side cannot tell a reset from the peer's close",
        shared_receive_pool = "libfabric endpoints post their own registered receive buffers; \
                               sharing them needs shared receive contexts, not implemented",
        partition = "the harness cannot cut a verbs link in the guest (one device, no second \
                     host), and the suite partitions only to test peer_timeout, which connected \
                     endpoints refuse (see liveness)",
        liveness = "connected endpoints (FI_EP_MSG) refuse BackendConfig::peer_timeout at \
                    creation (CreateError::NotSupported): libfabric 1.17 verbs endpoints have \
                    no keepalive or user timeout, and carry no netio heartbeat",
        one_local_port = "netio-libfabric has no setting for the source port of its connections \
                          (rdma_cm picks it), so two connections from one local port cannot be \
                          made"
    ]
);
