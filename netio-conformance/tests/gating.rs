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
    ];
    assert_eq!(found, [true; 6]);
}
