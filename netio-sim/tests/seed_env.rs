//! `Sim::new` reads `NETIO_SIM_SEED`. One test in its own binary, since it
//! changes the process environment.

use netio_sim::Sim;

#[test]
fn new_reads_netio_sim_seed_in_decimal_or_hex_and_rejects_garbage() {
    std::env::remove_var("NETIO_SIM_SEED");
    assert_eq!(Sim::new().seed(), Sim::DEFAULT_SEED);
    std::env::set_var("NETIO_SIM_SEED", "1234");
    assert_eq!(Sim::new().seed(), 1234);
    std::env::set_var("NETIO_SIM_SEED", "0xff");
    assert_eq!(Sim::new().seed(), 255);
    std::env::set_var("NETIO_SIM_SEED", "twelve");
    let err = std::panic::catch_unwind(Sim::new).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("NETIO_SIM_SEED") && msg.contains("hexadecimal"),
        "{msg}"
    );
    std::env::remove_var("NETIO_SIM_SEED");
}
