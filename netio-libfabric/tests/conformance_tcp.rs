//! The netio-rs conformance suite on libfabric's `tcp` provider over
//! 127.0.0.1, in both thread modes.

mod harness;

pub use harness::Tcp;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::Tcp>,
    unsupported = [
        reset = "libfabric 1.17 tcp reports a connection reset by the peer as an orderly \
                 FI_SHUTDOWN (in-flight operations flushed with FI_ECANCELED), so this side \
                 cannot tell a reset from the peer's close",
        shared_receive_pool = "libfabric endpoints post their own registered receive buffers; \
                               sharing them needs shared receive contexts, not implemented",
        partition = "libfabric 1.17 tcp endpoints offer no keepalive or user timeout, so an \
                     unreachable peer cannot be detected (peer_timeout is not enforced)",
        liveness = "connected endpoints (FI_EP_MSG) have no netio heartbeat, and libfabric 1.17 \
                    tcp endpoints no keepalive or user timeout: peer_timeout is not enforced",
        one_local_port = "netio-libfabric has no setting for the source port of its connections \
                          (the fabric provider picks it), so two connections from one local \
                          port cannot be made"
    ]
);
