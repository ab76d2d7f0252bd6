//! The netio-rs conformance suite on reliable-datagram endpoints over
//! libfabric's `udp;ofi_rxd` on 127.0.0.1, in both thread modes. Its
//! completion queue has no wait fd and its sends complete only when the
//! receiving process reads its queue: the backend's progress thread does
//! that while the peer's loop is held back.

mod harness;

pub use harness::RdmUdpRxd;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::RdmUdpRxd>,
    unsupported = [one_local_port =
        "netio-libfabric has no setting for the source port of its control \
                          channels"]
);
