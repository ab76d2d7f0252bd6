//! Hello world on the real event loop: the init callback fires a signal,
//! the signal starts a timer, and the timer counts down, then stops the loop.
//!
//! ```text
//! cargo run -p netio-examples --bin hello
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use netio_core::mio_loop::{MioLoop, MioTimer};
use netio_core::{EventLoop, Signal, Timer};

fn main() -> std::io::Result<()> {
    let lp = MioLoop::new()?;

    // The timer counts down from 3 and stops the loop at 0. The timer handle
    // is set once it exists; its callback reaches it through the cell.
    let timer_cell: Arc<OnceLock<MioTimer>> = Arc::new(OnceLock::new());
    let remaining = AtomicU32::new(3);
    let (lp2, cell2) = (lp.clone(), timer_cell.clone());
    let timer = lp.timer(move || {
        let n = remaining.fetch_sub(1, Ordering::SeqCst);
        println!("timer: {n}");
        if n == 1 {
            if let Some(t) = cell2.get() {
                t.stop();
            }
            lp2.stop();
        }
    });
    let _ = timer_cell.set(timer);

    // The signal starts the timer with a period of 100 ms.
    let cell3 = timer_cell.clone();
    let signal = lp.signal(move || {
        println!("signal: starting a 100 ms timer");
        if let Some(t) = cell3.get() {
            t.start_ms(100);
        }
    });

    let s = signal.clone();
    lp.run(move || {
        println!("Hello, netio! (init runs first)");
        s.fire();
    });
    println!("loop stopped");
    Ok(())
}
