//! The netio-rs conformance suite on busy-polling event loops
//! (`LoopConfig { busy_poll: true, .. }`), in both thread modes: connected
//! endpoints over libfabric's `tcp` (with one round of reads per spin, its
//! default, and with several) and reliable datagrams over `tcp;ofi_rxm`
//! and `shm`, all on 127.0.0.1.
//!
//! On a busy-polling loop the completion queues have no wait fd: the
//! backend's spin callback reads them (the hot connection's first, the
//! others in turn, and those of connections closing with sends in flight),
//! so nothing but the spin moves a connection's messages and completions.
//! A busy-polling loop thread keeps a core busy, so the harness runs one
//! test of this binary at a time, whatever `--test-threads` says.

#[macro_use]
mod harness;

pub use harness::{RdmShmBusyPoll, RdmTcpRxmBusyPoll, TcpBusyPoll, TcpBusyPollRounds};

/// Connected endpoints (`FI_EP_MSG`) over `tcp`.
mod msg_tcp {
    tcp_msg_suite!(crate::TcpBusyPoll);
}

/// Connected endpoints over `tcp`, the spin reading an empty queue in
/// several rounds (`LibfabricConfig::spin_rounds`), as on `verbs`.
mod msg_tcp_rounds {
    tcp_msg_suite!(crate::TcpBusyPollRounds);
}

/// Reliable datagrams over `shm` (several rounds of reads per spin by
/// default).
mod rdm_shm {
    netio_conformance::suite!(
        netio_conformance::mio::MioHarness<crate::RdmShmBusyPoll>,
        unsupported = [one_local_port =
            "netio-libfabric has no setting for the source port of its control channels"]
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
