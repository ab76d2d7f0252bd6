//! The netio-rs conformance suite on reliable-datagram endpoints over
//! libfabric's `verbs;ofi_rxm`, in both thread modes: on a real verbs
//! device, or on soft-RoCE in the emulated guest of
//! `scripts/verbs-guest.sh`, which the test command runs it in (see
//! `conformance_verbs.rs` for the variables that name the device).
#![cfg(feature = "verbs-conformance")]

mod harness;

pub use harness::RdmVerbsRxm;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::RdmVerbsRxm>,
    unsupported = [
        reset = "the guest's kernel cannot destroy a socket from outside (ss -K), so the \
                 harness cannot reset a control channel there",
        partition = "the guest's soft-RoCE device sits on a dummy interface that the \
                     harness's network namespaces cannot take along",
        one_local_port = "netio-libfabric has no setting for the source port of its control \
                          channels"
    ]
);
