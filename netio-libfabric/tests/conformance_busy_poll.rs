//! The netio-rs conformance suite on busy-polling event loops
//! (`LoopConfig { busy_poll: true, .. }`), in both thread modes: connected
//! endpoints over libfabric's `tcp` and reliable datagrams over
//! `tcp;ofi_rxm`, both on 127.0.0.1.
//!
//! On a busy-polling loop the completion queues have no wait fd: the
//! backend's spin callback reads them (the hot connection's first, the
//! others in turn, and those of connections closing with sends in flight),
//! so nothing but the spin moves a connection's messages and completions.
//! A busy-polling loop thread keeps a core busy, so the harness runs one
//! test of this binary at a time, whatever `--test-threads` says.

mod harness;

pub use harness::{RdmTcpRxmBusyPoll, TcpBusyPoll};

/// Connected endpoints (`FI_EP_MSG`) over `tcp`.
mod msg_tcp {
    netio_conformance::suite!(
        netio_conformance::mio::MioHarness<crate::TcpBusyPoll>,
        unsupported = [
            reset = "libfabric 1.17 tcp reports a connection reset by the peer as an orderly \
                     FI_SHUTDOWN (in-flight operations flushed with FI_ECANCELED), so this side \
                     cannot tell a reset from the peer's close",
            shared_receive_pool = "libfabric endpoints post their own registered receive \
                                   buffers; sharing them needs shared receive contexts, not \
                                   implemented",
            partition = "libfabric 1.17 tcp endpoints offer no keepalive or user timeout, so an \
                         unreachable peer cannot be detected (peer_timeout is not enforced)",
            liveness = "connected endpoints (FI_EP_MSG) have no netio heartbeat, and libfabric \
                        1.17 tcp endpoints no keepalive or user timeout: peer_timeout is not \
                        enforced",
            one_local_port = "netio-libfabric has no setting for the source port of its \
                              connections (the fabric provider picks it), so two connections \
                              from one local port cannot be made"
        ]
    );
}

/// Reliable datagrams (`FI_EP_RDM`) over `tcp;ofi_rxm`.
mod rdm_tcp_rxm {
    netio_conformance::suite!(
        netio_conformance::mio::MioHarness<crate::RdmTcpRxmBusyPoll>,
        unsupported = [one_local_port =
            "netio-libfabric has no setting for the source port of its control channels"]
    );
}
