//! Stopping a child process the way a user would: SIGTERM first, so that
//! it runs its exit path, then SIGKILL if it is still there after a grace
//! period. libfabric's `shm` provider removes an endpoint's file in
//! `/dev/shm` (several MiB of shared memory) on SIGTERM; a process killed
//! outright leaves it behind for good.

use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// How long a child has to exit after SIGTERM.
pub const GRACE: Duration = Duration::from_secs(2);

/// Stops `child` (SIGTERM, then SIGKILL after `grace`) and reaps it;
/// returns its exit status. A child that already exited is only reaped.
pub fn stop(child: &mut Child, grace: Duration) -> Option<ExitStatus> {
    let running = match child.try_wait() {
        Ok(Some(status)) => return Some(status),
        Ok(None) => true,
        Err(_) => false,
    };
    if let (true, Ok(pid)) = (running, libc::pid_t::try_from(child.id())) {
        // SAFETY: kill(2) takes no pointers; `pid` is this process's own
        // child, not reaped yet (try_wait just saw it running), so the id
        // still names it and no other process.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) => thread::sleep(Duration::from_millis(5)),
                Err(_) => break,
            }
        }
    }
    let _ = child.kill();
    child.wait().ok()
}
