//! The netio-rs conformance suite on reliable-datagram endpoints over
//! libfabric's `shm` (control channels on 127.0.0.1), in both thread modes.

mod harness;

pub use harness::RdmShm;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::RdmShm>,
    unsupported = [one_local_port =
        "netio-libfabric has no setting for the source port of its control \
                          channels"]
);
