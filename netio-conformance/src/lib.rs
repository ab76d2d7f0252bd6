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
//! ignored tests whose reason says "not supported by this provider" (or
//! gives the provider's own reason), never
//! as passes; `declared_features_match_the_unsupported_list` checks the list
//! against [`Harness::features`], [`Harness::can_reset`] and
//! [`Harness::can_partition`]. The rest never rely on a feature they do
//! not declare: a provider without copy sends passes them (the suite's own
//! test runs them against one), and where a behaviour calls
//! `send_data_copy` only to see an error, `NotSupported` counts as one.
//!
//! The suite pins contract v2: connections are named by their
//! [`ConnId`](netio_core::ConnId) handle (two connections to one address
//! are distinct, a closed handle stays stale), sends complete with the
//! caller's key in send order through `on_sends_completed`, receive flow
//! control (`pause_receive`/`resume_receive`), the loop clock, timers and
//! wakes in handlers, and liveness (`peer_timeout`).
//!
//! Besides what each test asserts, every event of every test is checked
//! against the rules that always hold, per connection handle
//! (establishment or refusal first, nothing after a close or refusal, a
//! handle never reused), completions come through `on_sends_completed`,
//! and no handler call is nested in another or made from inside a backend
//! call. A watchdog fails a test within seconds, naming the cause, when
//! the loop thread is stuck inside a handler call or a backend call does
//! not return; it never hangs. Each behaviour runs on a thread of its own,
//! so a test whose own thread is stuck (a simulator driven by it) fails
//! with the watchdog's message under plain `cargo test` and is left
//! behind while the rest of the suite runs. With
//! `NETIO_CONFORMANCE_STACKS=DIR` the watchdog also has `gdb` write every
//! thread's stack to a file in `DIR` when it finds a thread stuck, and
//! names the file in its message.
//!
//! Providers on [`MioLoop`](netio_core::mio_loop::MioLoop) use the
//! ready-made [`mio::MioHarness`] and write no loop-thread code.
//!
//! ```text
//! // in the provider's tests/conformance.rs
//! struct MyHarness { /* … */ }
//! impl netio_conformance::Harness for MyHarness { /* … */ }
//! netio_conformance::suite!(crate::MyHarness);
//! // or, for a provider without copy sends whose harness cannot cut the
//! // network between two nodes (the reason shows with the ignored tests):
//! netio_conformance::suite!(
//!     crate::MyHarness,
//!     unsupported = [send_copy, partition = "loopback sockets cannot be partitioned"]
//! );
//! ```
//!
//! Feature names for `unsupported` are the fields of
//! [`Features`](netio_core::Features): `send_copy`, `send_zero_copy`,
//! `buffered_with_zero_copy`, `thread_unsafe_mode`, `shared_receive_pool`,
//! `shared_send_pool`; `reset`, for a harness that cannot break a
//! connection the way a network failure does ([`Harness::can_reset`]); and
//! `partition`, for a harness that cannot make one node unreachable from
//! another ([`Harness::can_partition`]) nor silence one
//! ([`Harness::can_silence`]), which the liveness behaviour needs;
//! `liveness`, for a provider that does not enforce
//! `BackendConfig::peer_timeout` ([`Harness::enforces_peer_timeout`]);
//! and `backpressure`, for a provider whose transport buffers sends
//! without bound when the receiver takes nothing
//! ([`Harness::pushes_back`]), so that no send can be held in flight; and
//! `one_local_port`, for a harness that cannot make a backend whose
//! connections all leave from one local port
//! ([`Harness::can_fix_local_port`]), which the remote-address collision
//! behaviour needs; and `close_in_accept`, for a provider that loses a
//! peer's close arriving while the listener accepts the connection
//! ([`Harness::reports_close_in_accept`]).
//! Each may carry a reason: `name = "why"`.
//!
//! A test that partitions calls [`Harness::isolate`] before it makes its
//! nodes. The simulator partitions virtual hosts and needs nothing there;
//! [`mio::MioHarness`], for a provider that sets
//! [`mio::MioProvider::NETNS_PARTITION`], moves the test's thread into a
//! network namespace of its own (Linux, root), so that the loop threads it
//! starts and every socket of the test live there with a private loopback
//! interface, and partitions by dropping every packet that arrives on that
//! interface (see the [`mio`] module). Nothing changes in the host's
//! namespace. Without the privilege the test fails; it never passes
//! without partitioning.
//!
//! [`behaviours`] lists the same tests at run time, for tools that run the
//! suite themselves (the suite's own test of broken providers does).
#![warn(missing_docs)]

mod ctx;
mod harness;
pub mod mio;
mod recorder;
pub mod tests;
mod watch;

pub use ctx::{connect_target, full_params, Connection, Ctx, Filled, Node, Pair, SendMode};
pub use harness::{Harness, NodeId};
pub use recorder::{Close, Event, Log, React, Recorder};
pub use watch::{stuck_limit, time_scale, STUCK};

#[doc(hidden)]
pub mod __private {
    pub use crate::watch::run_behaviour;
    pub use netio_core::ThreadSafety;
}

/// One behaviour of the suite, for running it without the macro.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// The module the macro puts it in: `thread_safe`, `thread_unsafe` or
    /// `event_loop`.
    pub module: &'static str,
    /// The test's name.
    pub name: &'static str,
    /// Features (or `reset`, `partition`) it needs; `thread_unsafe_mode`
    /// for the `thread_unsafe` module.
    pub needs: &'static [&'static str],
    /// Runs it on a thread of its own (panics on failure, also when that
    /// thread is stuck: it is then left behind).
    pub run: fn(),
}

impl Behaviour {
    /// `module::name`, as `cargo test` shows it under `conformance::`.
    pub fn path(&self) -> String {
        format!("{}::{}", self.module, self.name)
    }
}

/// Every behaviour the [`suite!`] macro generates for `H`, in its order,
/// except `declared_features_match_the_unsupported_list`.
pub fn behaviours<H: Harness>() -> Vec<Behaviour> {
    let mut v: Vec<Behaviour> = Vec::new();
    macro_rules! push {
        ($module:literal, $mode:ident, $name:ident, [$($f:ident),*]) => {
            v.push(Behaviour {
                module: $module,
                name: stringify!($name),
                needs: &[$(stringify!($f)),*],
                run: || crate::watch::run_behaviour(|| {
                    tests::$name::<H>(netio_core::ThreadSafety::$mode)
                }),
            })
        };
    }
    macro_rules! item {
        (both, $name:ident, [$($f:ident),*]) => {
            push!("thread_safe", Safe, $name, [$($f),*]);
            push!("thread_unsafe", Unsafe, $name, [thread_unsafe_mode $(, $f)*]);
        };
        (safe_only, $name:ident, [$($f:ident),*]) => {
            push!("thread_safe", Safe, $name, [$($f),*]);
        };
        (unsafe_only, $name:ident, [$($f:ident),*]) => {
            push!("thread_unsafe", Unsafe, $name, [thread_unsafe_mode $(, $f)*]);
        };
        (event_loop, $name:ident, [$($f:ident),*]) => {
            push!("event_loop", Safe, $name, [$($f),*]);
        };
    }
    __behaviours!(item);
    v
}

/// The list of behaviours: `$cb!(group, name, [features])` for each, where
/// group is `both`, `safe_only`, `unsafe_only` or `event_loop`.
#[doc(hidden)]
#[macro_export]
macro_rules! __behaviours {
    ($cb:ident $(, $args:tt)*) => {
        $crate::__behaviour_list!($cb [$($args),*];
            // connections
            both listen_on_port_zero_returns_bound_port [],
            both listening_on_the_unspecified_address_keeps_it_and_accepts [],
            both listening_twice_on_one_address_fails_with_already_exists [],
            both listening_on_an_address_of_another_host_fails_with_the_reason [],
            both bad_addresses_fail_clearly [],
            both invalid_parameters_fail_with_invalid_connection_parameters [],
            both connect_establishes_on_both_sides_with_capabilities [],
            both established_comes_first_even_when_the_peer_greets_from_its_established_callback [],
            both capabilities_follow_params [],
            both listener_params_apply_to_every_accepted_connection [],
            both connecting_to_nothing_is_refused_on_initiator_only [],
            both closing_a_connection_still_opening_reports_it_refused_as_cancelled [],
            both a_close_racing_an_unreported_establishment_reports_a_refusal_or_establishment_then_close [],
            both the_listener_ends_every_connection_whose_peer_closed_it_while_it_was_being_accepted [close_in_accept],
            both sends_on_a_connection_still_opening_answer_unknown_connection [],
            both two_connections_to_one_address_are_distinct_connections [],
            both two_connections_from_one_local_port_to_two_listeners_are_distinct [one_local_port],
            both a_stale_handle_answers_unknown_connection_even_after_its_slot_is_reused [],
            both connection_to_and_remote_address_name_connections_by_address [],
            both connections_are_bidirectional [],
            both reopening_after_close_works [],
            both a_connection_with_1024_receive_buffers_opens_and_carries_1024_messages_each_way [],
            // buffered send
            both buffered_send_delivers_exact_bytes [],
            both buffered_send_completes_with_the_callers_key [],
            both completions_of_one_connection_come_in_send_order [],
            both get_buffer_gives_none_when_pool_empty_and_buffers_return_after_completion [],
            both foreign_buffer_is_rejected [],
            both get_buffer_without_send_buffers_fails_with_no_buffers_allocated [],
            both operations_on_unknown_endpoint_fail [],
            both low_water_mark_of_free_buffers_resets_on_read [],
            // zero-copy
            both zero_copy_header_is_prepended_to_payload [send_zero_copy],
            both a_chunk_written_in_place_arrives_and_its_range_is_free_again_after_completion [send_zero_copy],
            both a_refused_chunk_send_gives_the_chunk_back_unchanged [send_zero_copy],
            both a_region_chunk_comes_back_on_completion_and_on_cancellation_exactly_once [send_zero_copy, backpressure],
            both zero_copy_header_longer_than_16_bytes_is_rejected [send_zero_copy],
            both zero_copy_data_outside_region_is_rejected [send_zero_copy],
            both a_region_range_held_by_a_chunk_is_refused_and_one_in_flight_may_be_sent_again [send_zero_copy],
            both zero_copy_completion_carries_callers_key [send_zero_copy],
            both zero_copy_scatter_gather_arrives_as_one_message [send_zero_copy],
            both buffered_and_zero_copy_work_on_one_connection [buffered_with_zero_copy],
            // copy
            both empty_and_header_only_messages_arrive_as_sent [send_copy, send_zero_copy],
            both copy_send_data_may_be_overwritten_after_call [send_copy],
            both copy_send_is_supported_or_reports_not_supported [],
            both send_queue_depth_bounds_sends_with_no_resources [send_copy],
            both a_send_slot_is_free_when_its_completion_is_reported [send_copy],
            both a_send_buffer_is_free_when_its_completion_is_reported [],
            // batches
            both a_copy_batch_arrives_in_order_with_each_key_completed_once [send_copy],
            both a_copy_batch_stops_at_the_first_refused_message_and_says_how_many_were_sent [send_copy],
            both a_buffer_batch_arrives_in_order_and_a_refused_buffer_leaves_the_rest_with_the_caller [],
            // backpressure
            both backpressure_stops_buffered_sends_and_resumes_after_the_peer_reads [backpressure],
            both backpressure_stops_copy_sends_and_resumes_after_the_peer_reads [send_copy, backpressure],
            both backpressure_stops_zero_copy_sends_and_resumes_after_the_peer_reads [send_zero_copy, backpressure],
            // delivery
            both many_messages_arrive_in_order_exactly_once [],
            both message_of_exactly_receive_buffer_size_arrives [],
            both message_larger_than_receive_buffer_closes_connection_clearly [],
            both message_to_a_side_without_receive_buffers_closes_with_protocol_error [send_copy],
            // closing
            both closing_active_endpoint_reports_closed_on_both_sides [],
            both closing_with_sends_in_flight_reports_each_key_once [],
            both local_close_with_sends_held_in_flight_reports_each_key_once_on_both_sides [send_copy, backpressure],
            both peer_close_with_sends_in_flight_reports_each_key_once_on_both_sides [send_copy, backpressure],
            both listener_close_with_sends_in_flight_reports_each_key_once_on_both_sides [send_copy, backpressure],
            both a_listener_close_reports_every_key_of_its_accepted_connections_once [send_copy, backpressure],
            both reset_with_sends_in_flight_reports_each_key_once_on_both_sides [send_copy, reset, backpressure],
            both sender_close_after_completions_delivers_everything_before_the_peer_hears_of_it [send_copy],
            both messages_before_a_peer_close_are_delivered_before_the_close [send_copy],
            both messages_before_a_reset_are_delivered_before_the_close [send_copy, reset],
            both a_closed_connection_refuses_operations_at_once_and_its_handle_is_stale [send_copy],
            both closing_listener_closes_its_connections [],
            both closing_listener_without_connections_reports_nothing [],
            both closing_unknown_endpoint_fails [],
            both accepted_connection_can_be_closed_by_its_handle [],
            both peer_close_is_reported_and_endpoint_is_gone [],
            both open_close_cycles_leave_no_resources_behind [],
            // receive flow control
            both pausing_receive_stops_delivery_and_pushes_back_on_the_sender_and_resume_delivers_everything_in_order [backpressure],
            both messages_sent_to_a_paused_connection_all_arrive_after_resume [],
            both pause_then_peer_close_reports_the_close_after_the_held_messages [],
            both pause_then_peer_close_to_a_slow_handler_reports_the_close_after_many_held_messages [],
            // time in handlers
            both set_timer_calls_on_timer_after_the_delay_in_order [],
            both wake_from_another_thread_calls_on_wake_once_per_call [],
            both now_never_goes_backwards [],
            both time_and_timers_seen_from_callbacks_advance_with_the_loops_clock [],
            both wake_never_calls_the_handler_inside_the_call [],
            // liveness
            both peer_timeout_ends_a_connection_whose_peer_stops_answering_with_timed_out [liveness, partition],
            both the_longest_peer_timeout_sets_up_connections_that_carry_messages [liveness],
            // threads
            both handler_can_send_and_close_inside_callbacks [],
            both handlers_are_never_called_from_inside_a_backend_call [send_copy],
            safe_only sends_from_many_threads_all_arrive [],
            unsafe_only calls_off_the_loop_thread_fail_with_wrong_thread [],
            unsafe_only sends_through_signals_and_timers_work [],
            // shared pools
            both shared_receive_pool_keeps_memory_constant_as_connections_grow [shared_receive_pool],
            both per_listener_shared_pool_serves_only_its_listener [shared_receive_pool],
            both a_connection_closed_inside_on_data_gives_its_buffer_back_to_the_shared_pool [shared_receive_pool],
            both shared_send_pool_serves_every_connection [shared_send_pool],
            // event loop
            event_loop init_runs_before_any_other_callback [],
            event_loop stop_from_another_thread_returns_run [],
            event_loop stop_before_run_returns_after_init [],
            event_loop signal_fired_n_times_runs_n_times_from_any_thread [],
            event_loop timer_fires_periodically_stops_and_restarts_with_new_period [],
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __behaviour_list {
    ($cb:ident $args:tt; $(,)?) => {};
    ($cb:ident $args:tt; $group:ident $name:ident $f:tt $(, $($rest:tt)*)?) => {
        $crate::__behaviour_call!($cb $args $group $name $f);
        $crate::__behaviour_list!($cb $args; $($($rest)*)?);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __behaviour_call {
    ($cb:ident [$($a:tt),*] $group:ident $name:ident $f:tt) => {
        $cb!($($a,)* $group, $name, $f);
    };
}

/// Expands the whole suite into `mod conformance` for a [`Harness`] type.
/// See the [crate docs](crate).
#[macro_export]
macro_rules! suite {
    ($h:ty) => {
        $crate::suite!($h, unsupported = []);
    };
    ($h:ty, unsupported = [$($u:ident $(= $why:literal)?),* $(,)?]) => {
        /// The netio-rs conformance suite.
        #[allow(unused_imports)]
        mod conformance {
            use super::*;

            /// Backend behaviours, called from the test thread.
            mod thread_safe {
                use super::*;
                use $crate::__suite_item;
                $crate::__behaviours!(__suite_item, safe, ($h), [$($u $(= $why)?),*]);
            }

            /// Backend behaviours, called on the loop thread only.
            mod thread_unsafe {
                use super::*;
                use $crate::__suite_item;
                $crate::__behaviours!(__suite_item, unsafe, ($h), [$($u $(= $why)?),*]);
            }

            /// Event loop behaviours.
            mod event_loop {
                use super::*;
                use $crate::__suite_item;
                $crate::__behaviours!(__suite_item, event_loop, ($h), [$($u $(= $why)?),*]);
            }

            #[test]
            fn declared_features_match_the_unsupported_list() {
                $crate::tests::declared_features_match::<$h>(&[$(stringify!($u)),*]);
            }
        }
    };
}

/// One item of the list, in one of the three modules.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_item {
    (safe, ($h:ty), $u:tt, both, $name:ident, [$($f:ident),*]) => {
        $crate::__test!($h, Safe, [$($f),*], $u, $name);
    };
    (safe, ($h:ty), $u:tt, safe_only, $name:ident, [$($f:ident),*]) => {
        $crate::__test!($h, Safe, [$($f),*], $u, $name);
    };
    (unsafe, ($h:ty), $u:tt, both, $name:ident, [$($f:ident),*]) => {
        $crate::__test!($h, Unsafe, [thread_unsafe_mode $(, $f)*], $u, $name);
    };
    (unsafe, ($h:ty), $u:tt, unsafe_only, $name:ident, [$($f:ident),*]) => {
        $crate::__test!($h, Unsafe, [thread_unsafe_mode $(, $f)*], $u, $name);
    };
    (event_loop, ($h:ty), $u:tt, event_loop, $name:ident, [$($f:ident),*]) => {
        $crate::__test!($h, Safe, [$($f),*], $u, $name);
    };
    ($module:ident, ($h:ty), $u:tt, $group:ident, $name:ident, $f:tt) => {};
}

/// One test: plain if none of its required features is unsupported,
/// otherwise ignored with the first unsupported feature as the reason.
#[doc(hidden)]
#[macro_export]
macro_rules! __test {
    ($h:ty, $mode:ident, [], $u:tt, $name:ident) => {
        #[test]
        fn $name() {
            $crate::__private::run_behaviour(|| {
                $crate::tests::$name::<$h>($crate::__private::ThreadSafety::$mode)
            });
        }
    };
    ($h:ty, $mode:ident, [$f:ident $(, $rest:ident)*], $u:tt, $name:ident) => {
        $crate::__member!($f, $u,
            { $crate::__reason!($f, $name, $u); },
            { $crate::__test!($h, $mode, [$($rest),*], $u, $name); });
    };
}

/// `yes` if the feature is in the list (`[name, name = "reason", …]`),
/// else `no`.
#[doc(hidden)]
#[macro_export]
macro_rules! __member {
    ($f:ident, [], $yes:tt, {$($no:tt)*}) => { $($no)* };
    (send_copy, [send_copy $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (send_zero_copy, [send_zero_copy $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (buffered_with_zero_copy, [buffered_with_zero_copy $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (thread_unsafe_mode, [thread_unsafe_mode $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (shared_receive_pool, [shared_receive_pool $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (shared_send_pool, [shared_send_pool $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (reset, [reset $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (partition, [partition $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (liveness, [liveness $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (backpressure, [backpressure $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (one_local_port, [one_local_port $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    (close_in_accept, [close_in_accept $(= $w:literal)? $(, $($r:tt)*)?], {$($yes:tt)*}, $no:tt) => { $($yes)* };
    ($f:ident, [$other:ident $(= $w:literal)? $(, $($r:tt)*)?], $yes:tt, $no:tt) => {
        $crate::__member!($f, [$($($r)*)?], $yes, $no);
    };
}

/// An ignored test whose reason is [`__reason_text!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __reason {
    ($f:ident, $name:ident, $u:tt) => {
        $crate::__reason_text! { @test: $name, $f, $u }
    };
}

/// The reason an unsupported behaviour is ignored, as one string literal
/// (libtest shows only a literal `#[ignore = "…"]`): "not supported by
/// this provider: <feature>", or the provider's own reason when the list
/// gives one (`name = "reason"`). `__reason_text!(feature, [list])` is the
/// text; the `@test: name` form makes the ignored test.
#[doc(hidden)]
#[macro_export]
macro_rules! __reason_text {
    ($f:ident, $u:tt) => {
        $crate::__reason_text! { @text, $f, $u }
    };
    (@$m:ident $(: $n:ident)?, send_copy, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: send_copy" }
    };
    (@$m:ident $(: $n:ident)?, send_zero_copy, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: send_zero_copy" }
    };
    (@$m:ident $(: $n:ident)?, buffered_with_zero_copy, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: buffered_with_zero_copy" }
    };
    (@$m:ident $(: $n:ident)?, thread_unsafe_mode, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: thread_unsafe_mode" }
    };
    (@$m:ident $(: $n:ident)?, shared_receive_pool, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: shared_receive_pool" }
    };
    (@$m:ident $(: $n:ident)?, shared_send_pool, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: shared_send_pool" }
    };
    (@$m:ident $(: $n:ident)?, reset, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: reset" }
    };
    (@$m:ident $(: $n:ident)?, partition, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: partition" }
    };
    (@$m:ident $(: $n:ident)?, liveness, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: liveness" }
    };
    (@$m:ident $(: $n:ident)?, backpressure, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: backpressure" }
    };
    (@$m:ident $(: $n:ident)?, one_local_port, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: one_local_port" }
    };
    (@$m:ident $(: $n:ident)?, close_in_accept, []) => {
        $crate::__reason_emit! { @$m $(: $n)?, "not supported by this provider: close_in_accept" }
    };
    (@$m:ident $(: $n:ident)?, send_copy, [send_copy = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, send_zero_copy, [send_zero_copy = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, buffered_with_zero_copy, [buffered_with_zero_copy = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, thread_unsafe_mode, [thread_unsafe_mode = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, shared_receive_pool, [shared_receive_pool = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, shared_send_pool, [shared_send_pool = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, reset, [reset = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, partition, [partition = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, liveness, [liveness = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, backpressure, [backpressure = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, one_local_port, [one_local_port = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, close_in_accept, [close_in_accept = $why:literal $(, $($r:tt)*)?]) => {
        $crate::__reason_emit! { @$m $(: $n)?, $why }
    };
    (@$m:ident $(: $n:ident)?, $f:ident, [$other:ident $(= $w:literal)? $(, $($r:tt)*)?]) => {
        $crate::__reason_text! { @$m $(: $n)?, $f, [$($($r)*)?] }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __reason_emit {
    (@text, $reason:literal) => {
        $reason
    };
    (@test: $name:ident, $reason:literal) => {
        #[test]
        #[ignore = $reason]
        fn $name() {}
    };
}
