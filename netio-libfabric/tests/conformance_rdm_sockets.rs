//! The netio-rs conformance suite on reliable-datagram endpoints over
//! libfabric's `sockets` on 127.0.0.1, in both thread modes.

mod harness;

pub use harness::RdmSockets;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::RdmSockets>,
    unsupported = [one_local_port =
        "netio-libfabric has no setting for the source port of its control \
                          channels"]
);
