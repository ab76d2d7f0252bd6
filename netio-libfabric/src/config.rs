//! [`LibfabricConfig`]: the libfabric settings of a backend.

/// libfabric settings of a backend, next to the provider-agnostic
/// [`BackendConfig`](netio_core::BackendConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibfabricConfig {
    /// The fabric provider (`tcp`, `sockets`, `verbs`, …). An unknown name
    /// makes every open fail with a clear error.
    pub provider: String,
    /// The domain (for `verbs` the device, e.g. `mlx5_0`; for `tcp` the
    /// interface, e.g. `lo`); `None`: whichever serves the address.
    pub domain: Option<String>,
    /// Transmit queue size of each connected endpoint; `None`: the
    /// provider's default. Reliable-datagram endpoints take the provider's
    /// default.
    pub tx_size: Option<usize>,
    /// Receive queue size of each connected endpoint; `None`: the
    /// provider's default. Either way it is raised, per connection, to the
    /// connection's number of receive buffers (all of them are posted at
    /// once); a provider or device that cannot hold that many makes the
    /// open fail with an error that says so. On reliable datagrams, the
    /// size asked for the backend's one endpoint, which holds every
    /// connection's buffers (`None`: 16,384, or the provider's default
    /// where it cannot give that many).
    pub rx_size: Option<usize>,
    /// Completion queue size of each connection; raised, per connection,
    /// to hold a completion of every receive buffer and every send that
    /// may be in flight at once. On reliable datagrams, the size of the
    /// backend's one completion queue, at least 1,024.
    pub cq_size: usize,
    /// How many extra times an empty completion queue of a connected
    /// endpoint is read before the loop goes to sleep on its fd (busy
    /// polling for latency, spead2's `max_poll`); 0 sleeps at once. For
    /// busy polling on either endpoint type, run the backend on a
    /// busy-polling loop instead.
    pub max_poll: u32,
    /// On a busy-polling loop: how many rounds of eight reads the spin
    /// callback makes of an empty completion queue (the hot connection's,
    /// when it is the backend's only connection, or the reliable-datagram
    /// endpoint's) before it gives the loop its turn back; the state is
    /// unlocked between two rounds, and no round begins once work was
    /// posted or announced to the loop. With more than one round, a
    /// connection stays first in line for 64 empty spins after its last
    /// completion (with one, for a single empty spin). `None`: 8 on fabric
    /// providers whose read only looks at memory (`verbs`, `shm`, `efa`,
    /// … and the layers on them), 1 on the socket-based ones (`tcp`,
    /// `sockets`, `udp` and the layers on them), where each read costs a
    /// system call. 0 counts as 1. More rounds mean fewer loop turns
    /// between two reads; fewer keep the loop's other sources and timers
    /// closer to their time (they wait for a spin's reads).
    pub spin_rounds: Option<u32>,
    /// `FI_SOCKETS_PE_WAITTIME` (µs the `sockets` provider's progress
    /// thread waits) set in the environment when the first backend is
    /// created, unless the environment already sets it. The default 0 makes
    /// `sockets` progress promptly; `None` leaves the environment alone.
    pub sockets_pe_waittime: Option<u32>,
    /// On connected endpoints, how long a local close
    /// (`close_active_endpoint`, or closing the listener of an accepted
    /// connection) waits, on the loop and without
    /// blocking it, for the completions of sends already handed to the
    /// provider before it reports the rest cancelled. A send that completes
    /// meanwhile is reported completed; the close report comes when every
    /// send has ended or this time has passed. Providers with a progress
    /// thread (`sockets`) may still be writing a send some milliseconds
    /// after it was posted. A reliable-datagram close does not wait: a
    /// send handed to the fabric is reported completed at once.
    pub close_linger: std::time::Duration,
    /// How long a connection may take to be set up: an initiated one not
    /// established by then is refused (`RefuseReason::Unreachable`), an
    /// accepted one is ended unreported. On `tcp`, a connection accepted by
    /// a listener whose connection request has not arrived whole by then
    /// is shut down (see `max_pending_handshakes`).
    pub handshake_timeout: std::time::Duration,
    /// On connected `tcp`: connections one listener holds whose connection
    /// request has not arrived whole (silent or half-sent). Beyond it the
    /// newest are shut down, each counted in
    /// [`refused_connections`](crate::LibfabricBackend::refused_connections).
    /// On reliable datagrams: control channels the backend holds, over all
    /// its listeners, that have not sent their HELLO yet; one beyond it is
    /// refused (REFUSE, limit) and counted.
    pub max_pending_handshakes: usize,
    /// Connections one listener holds at once (opening or established);
    /// requests beyond it are rejected (the peer sees a refusal) and
    /// counted.
    pub max_connections_per_listener: usize,
    /// The kind of libfabric endpoint connections are built on.
    pub endpoint: EndpointType,
}

/// The kind of libfabric endpoint a backend builds its connections on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EndpointType {
    /// Connected endpoints where the fabric provider offers them (`tcp`,
    /// `verbs`, `sockets`), else reliable datagrams.
    #[default]
    Auto,
    /// Connected endpoints (`FI_EP_MSG`): an endpoint, a completion queue
    /// and an event queue per connection, set up by the fabric provider's
    /// connection manager.
    Msg,
    /// Reliable datagrams (`FI_EP_RDM`): one endpoint, completion queue
    /// and address vector per backend, connections built over it with a
    /// TCP control channel per connection (see `docs/libfabric.md`). The
    /// only kind `shm`, `efa`, `cxi`, `opx` and the `;ofi_rxm`/`;ofi_rxd`
    /// stacks offer.
    Rdm,
}

impl EndpointType {
    /// Parses `auto`, `msg` or `rdm` (any case).
    pub fn parse(s: &str) -> Option<EndpointType> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Some(EndpointType::Auto),
            "msg" => Some(EndpointType::Msg),
            "rdm" => Some(EndpointType::Rdm),
            _ => None,
        }
    }
}

impl Default for LibfabricConfig {
    fn default() -> Self {
        Self {
            provider: "tcp".into(),
            domain: None,
            tx_size: None,
            rx_size: None,
            cq_size: 1024,
            max_poll: 0,
            spin_rounds: None,
            sockets_pe_waittime: Some(0),
            close_linger: std::time::Duration::from_millis(500),
            handshake_timeout: std::time::Duration::from_secs(10),
            max_pending_handshakes: 1024,
            max_connections_per_listener: 4096,
            endpoint: EndpointType::Auto,
        }
    }
}

impl LibfabricConfig {
    /// The default settings with fabric provider `name`.
    pub fn provider(name: impl Into<String>) -> Self {
        Self {
            provider: name.into(),
            ..Self::default()
        }
    }

    /// The endpoint type a backend with these settings speaks: `endpoint`,
    /// with [`EndpointType::Auto`] decided as backend creation decides it
    /// (connected endpoints where the fabric provider offers them here).
    pub fn resolved_endpoint(&self) -> EndpointType {
        match self.endpoint {
            EndpointType::Auto if crate::ffi::offers_msg(&self.provider) => EndpointType::Msg,
            EndpointType::Auto => EndpointType::Rdm,
            other => other,
        }
    }

    /// The settings named by the environment: `NETIO_LIBFABRIC_PROVIDER`
    /// (default `tcp`), `NETIO_LIBFABRIC_DOMAIN`,
    /// `NETIO_LIBFABRIC_ENDPOINT` (`auto`, `msg` or `rdm`; default `auto`)
    /// and `NETIO_LIBFABRIC_SPIN_ROUNDS` ([`spin_rounds`](Self::spin_rounds),
    /// a number; anything else leaves the default). Values that do not
    /// parse are ignored.
    pub fn from_env() -> Self {
        let mut c = Self::default();
        if let Ok(p) = std::env::var("NETIO_LIBFABRIC_PROVIDER") {
            if !p.is_empty() {
                c.provider = p;
            }
        }
        if let Ok(d) = std::env::var("NETIO_LIBFABRIC_DOMAIN") {
            if !d.is_empty() {
                c.domain = Some(d);
            }
        }
        if let Ok(e) = std::env::var("NETIO_LIBFABRIC_ENDPOINT") {
            if let Some(t) = EndpointType::parse(&e) {
                c.endpoint = t;
            }
        }
        if let Ok(r) = std::env::var("NETIO_LIBFABRIC_SPIN_ROUNDS") {
            if let Some(rounds) = parse_rounds(&r) {
                c.spin_rounds = Some(rounds);
            }
        }
        c
    }
}

/// A number of spin rounds as the environment gives it (surrounding
/// blanks allowed).
fn parse_rounds(s: &str) -> Option<u32> {
    s.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse_rounds;

    #[test]
    fn spin_rounds_from_the_environment_are_a_number_or_nothing() {
        assert_eq!(parse_rounds("8"), Some(8));
        assert_eq!(parse_rounds(" 1\n"), Some(1));
        assert_eq!(parse_rounds(""), None);
        assert_eq!(parse_rounds("eight"), None);
        assert_eq!(parse_rounds("-1"), None);
    }
}
