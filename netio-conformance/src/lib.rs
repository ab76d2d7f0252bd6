//! The behavioural suite every netio-rs provider must pass.
//!
//! Each behaviour of the contract (`docs/contract.md`) is one function in
//! [`tests`], written only against the `netio-core` traits. A provider
//! implements [`Harness`] and calls [`suite!`] once in its own crate; the
//! macro expands to one `#[test]` per behaviour in a module named
//! `conformance`, so `cargo test conformance` runs exactly the suite and a
//! failure names the behaviour:
//!
//! ```text
//! conformance::thread_safe::closing_with_sends_in_flight_reports_each_key_once
//! conformance::thread_unsafe::zero_copy_header_is_prepended_to_payload
//! conformance::event_loop::signal_fired_n_times_runs_n_times_from_any_thread
//! ```
//!
//! Backend behaviours run twice, in `thread_safe` (calls from the test
//! thread) and `thread_unsafe` (calls on the loop thread). Behaviours that
//! need a feature the provider lists as unsupported are generated as
//! ignored tests whose reason says "not supported by this provider", never
//! as passes; `declared_features_match_the_unsupported_list` checks the list
//! against [`Harness::features`].
//!
//! ```text
//! // in the provider's tests/conformance.rs
//! struct MyHarness { /* … */ }
//! impl netio_conformance::Harness for MyHarness { /* … */ }
//! netio_conformance::suite!(crate::MyHarness);
//! // or, for a provider without copy sends:
//! netio_conformance::suite!(crate::MyHarness, unsupported = [send_copy]);
//! ```
//!
//! Feature names for `unsupported` are the fields of
//! [`Features`](netio_core::Features): `send_copy`, `send_zero_copy`,
//! `buffered_with_zero_copy`, `thread_unsafe_mode`, `shared_receive_pool`,
//! `shared_send_pool`.
#![warn(missing_docs)]

mod ctx;
mod harness;
mod recorder;
pub mod tests;

pub use ctx::{connect_target, full_params, Ctx, Node, Pair};
pub use harness::Harness;
pub use recorder::{Event, Log, React, Recorder};

#[doc(hidden)]
pub mod __private {
    pub use netio_core::ThreadSafety;
}

/// Expands the whole suite into `mod conformance` for a [`Harness`] type.
/// See the [crate docs](crate).
#[macro_export]
macro_rules! suite {
    ($h:ty) => {
        $crate::suite!($h, unsupported = []);
    };
    ($h:ty, unsupported = [$($u:ident),* $(,)?]) => {
        /// The netio-rs conformance suite.
        #[allow(unused_imports)]
        mod conformance {
            use super::*;

            /// Backend behaviours, called from the test thread.
            mod thread_safe {
                use super::*;
                $crate::__backend_tests!($h, Safe, [], [$($u),*]);
                $crate::__test!($h, Safe, [], [$($u),*], sends_from_many_threads_all_arrive);
            }

            /// Backend behaviours, called on the loop thread only.
            mod thread_unsafe {
                use super::*;
                $crate::__backend_tests!($h, Unsafe, [thread_unsafe_mode], [$($u),*]);
                $crate::__test!($h, Unsafe, [thread_unsafe_mode], [$($u),*],
                    calls_off_the_loop_thread_fail_with_wrong_thread);
                $crate::__test!($h, Unsafe, [thread_unsafe_mode], [$($u),*],
                    sends_through_signals_and_timers_work);
            }

            /// Event loop behaviours.
            mod event_loop {
                use super::*;
                $crate::__test!($h, Safe, [], [$($u),*], init_runs_before_any_other_callback);
                $crate::__test!($h, Safe, [], [$($u),*], stop_from_another_thread_returns_run);
                $crate::__test!($h, Safe, [], [$($u),*], stop_before_run_returns_after_init);
                $crate::__test!($h, Safe, [], [$($u),*],
                    signal_fired_n_times_runs_n_times_from_any_thread);
                $crate::__test!($h, Safe, [], [$($u),*],
                    timer_fires_periodically_stops_and_restarts_with_new_period);
            }

            #[test]
            fn declared_features_match_the_unsupported_list() {
                $crate::tests::declared_features_match::<$h>(&[$(stringify!($u)),*]);
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __backend_tests {
    ($h:ty, $mode:ident, [$($x:ident),*], $u:tt) => {
        $crate::__test!($h, $mode, [$($x),*], $u, listen_on_port_zero_returns_bound_port);
        $crate::__test!($h, $mode, [$($x),*], $u, listening_twice_on_one_address_fails_with_already_exists);
        $crate::__test!($h, $mode, [$($x),*], $u, bad_addresses_fail_clearly);
        $crate::__test!($h, $mode, [$($x),*], $u, connect_establishes_on_both_sides_with_capabilities);
        $crate::__test!($h, $mode, [$($x),*], $u, capabilities_follow_params);
        $crate::__test!($h, $mode, [$($x),*], $u, listener_params_apply_to_every_accepted_connection);
        $crate::__test!($h, $mode, [$($x),*], $u, connecting_to_nothing_is_refused_on_initiator_only);
        $crate::__test!($h, $mode, [$($x),*], $u, opening_same_active_endpoint_twice_fails);
        $crate::__test!($h, $mode, [$($x),*], $u, connections_are_bidirectional);
        $crate::__test!($h, $mode, [$($x),*], $u, reopening_after_close_works);
        $crate::__test!($h, $mode, [$($x),*], $u, buffered_send_delivers_exact_bytes);
        $crate::__test!($h, $mode, [$($x),*], $u, buffered_send_completes_with_buffer_index);
        $crate::__test!($h, $mode, [$($x),*], $u, get_buffer_gives_none_when_pool_empty_and_buffers_return_after_completion);
        $crate::__test!($h, $mode, [$($x),*], $u, foreign_buffer_is_rejected);
        $crate::__test!($h, $mode, [$($x),*], $u, get_buffer_without_send_buffers_fails_with_no_buffers_allocated);
        $crate::__test!($h, $mode, [$($x),*], $u, operations_on_unknown_endpoint_fail);
        $crate::__test!($h, $mode, [$($x),*], $u, low_water_mark_of_free_buffers_resets_on_read);
        $crate::__test!($h, $mode, [$($x,)* send_zero_copy], $u, zero_copy_header_is_prepended_to_payload);
        $crate::__test!($h, $mode, [$($x,)* send_zero_copy], $u, zero_copy_header_longer_than_16_bytes_is_rejected);
        $crate::__test!($h, $mode, [$($x,)* send_zero_copy], $u, zero_copy_data_outside_region_is_rejected);
        $crate::__test!($h, $mode, [$($x,)* send_zero_copy], $u, zero_copy_completion_carries_callers_key);
        $crate::__test!($h, $mode, [$($x,)* send_zero_copy], $u, zero_copy_scatter_gather_arrives_as_one_message);
        $crate::__test!($h, $mode, [$($x,)* buffered_with_zero_copy], $u, buffered_and_zero_copy_work_on_one_connection);
        $crate::__test!($h, $mode, [$($x,)* send_copy], $u, copy_send_data_may_be_overwritten_after_call);
        $crate::__test!($h, $mode, [$($x),*], $u, copy_send_is_supported_or_reports_not_supported);
        $crate::__test!($h, $mode, [$($x,)* send_copy], $u, send_queue_depth_bounds_sends_with_no_resources);
        $crate::__test!($h, $mode, [$($x),*], $u, many_messages_arrive_in_order_exactly_once);
        $crate::__test!($h, $mode, [$($x),*], $u, message_of_exactly_receive_buffer_size_arrives);
        $crate::__test!($h, $mode, [$($x),*], $u, message_larger_than_receive_buffer_closes_connection_clearly);
        $crate::__test!($h, $mode, [$($x),*], $u, closing_active_endpoint_reports_closed_on_both_sides);
        $crate::__test!($h, $mode, [$($x),*], $u, closing_with_sends_in_flight_reports_each_key_once);
        $crate::__test!($h, $mode, [$($x),*], $u, closing_listener_closes_its_connections);
        $crate::__test!($h, $mode, [$($x),*], $u, closing_listener_without_connections_reports_nothing);
        $crate::__test!($h, $mode, [$($x),*], $u, closing_unknown_endpoint_fails);
        $crate::__test!($h, $mode, [$($x),*], $u, accepted_endpoint_can_be_closed_by_remote_address);
        $crate::__test!($h, $mode, [$($x),*], $u, peer_close_is_reported_and_endpoint_is_gone);
        $crate::__test!($h, $mode, [$($x),*], $u, handler_can_send_and_close_inside_callbacks);
        $crate::__test!($h, $mode, [$($x,)* shared_receive_pool], $u, shared_receive_pool_keeps_memory_constant_as_connections_grow);
        $crate::__test!($h, $mode, [$($x,)* shared_receive_pool], $u, per_listener_shared_pool_serves_only_its_listener);
        $crate::__test!($h, $mode, [$($x,)* shared_send_pool], $u, shared_send_pool_serves_every_connection);
    };
}

/// One test: plain if none of its required features is unsupported,
/// otherwise ignored with the first unsupported feature as the reason.
#[doc(hidden)]
#[macro_export]
macro_rules! __test {
    ($h:ty, $mode:ident, [], $u:tt, $name:ident) => {
        #[test]
        fn $name() {
            $crate::tests::$name::<$h>($crate::__private::ThreadSafety::$mode);
        }
    };
    ($h:ty, $mode:ident, [$f:ident $(, $rest:ident)*], $u:tt, $name:ident) => {
        $crate::__member!($f, $u,
            { $crate::__ignored!($f, $name); },
            { $crate::__test!($h, $mode, [$($rest),*], $u, $name); });
    };
}

/// `yes` if the feature is in the list, else `no`.
#[doc(hidden)]
#[macro_export]
macro_rules! __member {
    ($f:ident, [], $yes:tt, {$($no:tt)*}) => { $($no)* };
    (send_copy, [send_copy $(, $r:ident)*], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (send_zero_copy, [send_zero_copy $(, $r:ident)*], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (buffered_with_zero_copy, [buffered_with_zero_copy $(, $r:ident)*], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (thread_unsafe_mode, [thread_unsafe_mode $(, $r:ident)*], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (shared_receive_pool, [shared_receive_pool $(, $r:ident)*], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (shared_send_pool, [shared_send_pool $(, $r:ident)*], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    ($f:ident, [$other:ident $(, $r:ident)*], $yes:tt, $no:tt) => {
        $crate::__member!($f, [$($r),*], $yes, $no);
    };
}

/// An ignored test whose reason names the unsupported feature.
#[doc(hidden)]
#[macro_export]
macro_rules! __ignored {
    (send_copy, $name:ident) => {
        #[test]
        #[ignore = "not supported by this provider: send_copy"]
        fn $name() {}
    };
    (send_zero_copy, $name:ident) => {
        #[test]
        #[ignore = "not supported by this provider: send_zero_copy"]
        fn $name() {}
    };
    (buffered_with_zero_copy, $name:ident) => {
        #[test]
        #[ignore = "not supported by this provider: buffered_with_zero_copy"]
        fn $name() {}
    };
    (thread_unsafe_mode, $name:ident) => {
        #[test]
        #[ignore = "not supported by this provider: thread_unsafe_mode"]
        fn $name() {}
    };
    (shared_receive_pool, $name:ident) => {
        #[test]
        #[ignore = "not supported by this provider: shared_receive_pool"]
        fn $name() {}
    };
    (shared_send_pool, $name:ident) => {
        #[test]
        #[ignore = "not supported by this provider: shared_send_pool"]
        fn $name() {}
    };
}
