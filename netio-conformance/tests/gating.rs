//! The membership test behind the `unsupported = [...]` list of `suite!`:
//! a behaviour is ignored exactly when one of its features is listed.

use netio_conformance::__member as member;

#[test]
fn listed_feature_is_found_anywhere_in_the_list() {
    let found = [
        member!(send_copy, [send_copy], { true }, { false }),
        member!(send_copy, [shared_send_pool, send_copy], { true }, {
            false
        }),
        member!(
            thread_unsafe_mode,
            [send_zero_copy, thread_unsafe_mode, send_copy],
            { true },
            { false }
        ),
    ];
    assert_eq!(found, [true; 3]);
}

#[test]
fn unlisted_feature_is_not_found() {
    let found = [
        member!(send_copy, [], { true }, { false }),
        member!(send_copy, [send_zero_copy, shared_send_pool], { true }, {
            false
        }),
        member!(shared_receive_pool, [shared_send_pool], { true }, { false }),
    ];
    assert_eq!(found, [false; 3]);
}

#[test]
fn every_feature_name_is_recognised() {
    let found = [
        member!(send_copy, [send_copy], { true }, { false }),
        member!(send_zero_copy, [send_zero_copy], { true }, { false }),
        member!(
            buffered_with_zero_copy,
            [buffered_with_zero_copy],
            { true },
            { false }
        ),
        member!(thread_unsafe_mode, [thread_unsafe_mode], { true }, {
            false
        }),
        member!(shared_receive_pool, [shared_receive_pool], { true }, {
            false
        }),
        member!(shared_send_pool, [shared_send_pool], { true }, { false }),
        member!(reset, [reset], { true }, { false }),
        member!(partition, [partition], { true }, { false }),
    ];
    assert_eq!(found, [true; 8]);
}

#[test]
fn a_feature_given_with_a_reason_is_found_and_does_not_hide_the_rest() {
    let found = [
        member!(partition, [partition = "no packet filter"], { true }, {
            false
        }),
        member!(
            send_copy,
            [partition = "no packet filter", send_copy],
            { true },
            { false }
        ),
        member!(
            reset,
            [send_copy = "x", partition = "no packet filter", reset],
            { true },
            { false }
        ),
    ];
    assert_eq!(found, [true; 3]);
    let absent = member!(reset, [partition = "no packet filter"], { true }, { false });
    assert!(!absent);
}

#[test]
fn the_ignore_reason_carries_the_providers_reason() {
    use netio_conformance::__reason_text as reason;
    assert_eq!(
        reason!(
            partition,
            [send_copy, partition = "loopback cannot drop packets"]
        ),
        "loopback cannot drop packets"
    );
    assert_eq!(
        reason!(partition, [partition]),
        "not supported by this provider: partition"
    );
    assert_eq!(
        reason!(send_copy, [partition = "x", send_copy]),
        "not supported by this provider: send_copy"
    );
}

/// An ignored test made the way `suite!` makes one, with a reason.
mod ignored {
    netio_conformance::__reason!(
        partition,
        ignored_with_the_providers_reason,
        [send_copy, partition = "loopback cannot drop packets"]
    );
}
