//! Endpoint addresses: an IP address and a port, parsed and validated.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// The address of an endpoint: an IP address (v4 or v6) and a port.
///
/// Listen endpoints may use port 0 ("pick one"); the backend then returns
/// the address it actually bound. An address says where a peer is, not
/// which connection: connections are named by their
/// [`ConnId`](crate::ConnId) handle, and two connections may share a
/// remote address (two connections to one listener from one backend have
/// the same remote address on the initiator; a client whose connections
/// leave from one local port towards two listeners has the same remote
/// address on the server). [`Backend::remote_address`](crate::Backend::remote_address)
/// gives a connection's remote address (the listener's on the initiator,
/// the peer's ip:port on the acceptor), and
/// [`Backend::connection_to`](crate::Backend::connection_to) the oldest
/// connection with a given one, for code that names peers by address.
///
/// ```
/// use netio_core::EndpointAddress;
/// let a: EndpointAddress = "127.0.0.1:5000".parse().unwrap();
/// assert_eq!(a.port(), 5000);
/// let b: EndpointAddress = "[::1]:80".parse().unwrap();
/// assert!(b.ip().is_ipv6());
/// assert!("127.0.0.1".parse::<EndpointAddress>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointAddress {
    ip: IpAddr,
    port: u16,
}

impl EndpointAddress {
    /// An address from an IP address and a port.
    pub const fn new(ip: IpAddr, port: u16) -> Self {
        Self { ip, port }
    }

    /// An IPv4 address from its four octets and a port.
    pub const fn v4(a: u8, b: u8, c: u8, d: u8, port: u16) -> Self {
        Self::new(IpAddr::V4(Ipv4Addr::new(a, b, c, d)), port)
    }

    /// `127.0.0.1:port`.
    pub const fn localhost(port: u16) -> Self {
        Self::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)
    }

    /// `[::1]:port`.
    pub const fn localhost_v6(port: u16) -> Self {
        Self::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port)
    }

    /// The IP address.
    pub const fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The port (0 means "any" for a listen endpoint).
    pub const fn port(&self) -> u16 {
        self.port
    }

    /// The same IP address with another port.
    pub const fn with_port(&self, port: u16) -> Self {
        Self::new(self.ip, port)
    }

    /// The standard library's socket address for this endpoint.
    pub const fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }

    /// Checks that this address can be listened on: not multicast and not
    /// the IPv4 broadcast address. Port 0 is allowed.
    pub fn validate_listen(&self) -> Result<(), AddressError> {
        if self.ip.is_multicast() {
            return Err(AddressError::Multicast(self.ip));
        }
        if self.ip == IpAddr::V4(Ipv4Addr::BROADCAST) {
            return Err(AddressError::Broadcast);
        }
        Ok(())
    }

    /// Checks that this address can be connected to: a valid listen address
    /// that is also not unspecified (`0.0.0.0`, `::`) and has a port other
    /// than 0.
    pub fn validate_remote(&self) -> Result<(), AddressError> {
        self.validate_listen()?;
        if self.ip.is_unspecified() {
            return Err(AddressError::Unspecified(self.ip));
        }
        if self.port == 0 {
            return Err(AddressError::PortZero);
        }
        Ok(())
    }
}

impl From<SocketAddr> for EndpointAddress {
    fn from(s: SocketAddr) -> Self {
        Self::new(s.ip(), s.port())
    }
}

impl From<EndpointAddress> for SocketAddr {
    fn from(e: EndpointAddress) -> Self {
        e.socket_addr()
    }
}

impl fmt::Display for EndpointAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.socket_addr(), f)
    }
}

impl fmt::Debug for EndpointAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for EndpointAddress {
    type Err = AddressError;

    /// Parses `a.b.c.d:port` or `[v6]:port`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<SocketAddr>()
            .map(Self::from)
            .map_err(|_| AddressError::Syntax(s.to_owned()))
    }
}

/// Why an endpoint address cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// The text is not `ip:port` (IPv6 in brackets).
    #[error("`{0}` is not an endpoint address; expected `a.b.c.d:port` or `[v6]:port`")]
    Syntax(String),
    /// A multicast address cannot be an endpoint of a connection.
    #[error("{0} is a multicast address; endpoints must be unicast")]
    Multicast(IpAddr),
    /// The IPv4 broadcast address cannot be an endpoint of a connection.
    #[error("255.255.255.255 is the broadcast address; endpoints must be unicast")]
    Broadcast,
    /// An unspecified address (`0.0.0.0`, `::`) cannot be connected to.
    #[error("cannot connect to the unspecified address {0}")]
    Unspecified(IpAddr),
    /// Port 0 cannot be connected to.
    #[error("cannot connect to port 0")]
    PortZero,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6_and_rejects_garbage() {
        assert_eq!(
            "10.1.2.3:9".parse::<EndpointAddress>().unwrap(),
            EndpointAddress::v4(10, 1, 2, 3, 9)
        );
        assert_eq!(
            "[::1]:7".parse::<EndpointAddress>().unwrap(),
            EndpointAddress::localhost_v6(7)
        );
        for bad in [
            "",
            "1.2.3.4",
            "1.2.3.4:99999",
            "::1:80",
            "host:80",
            "1.2.3:4",
        ] {
            assert!(
                matches!(bad.parse::<EndpointAddress>(), Err(AddressError::Syntax(_))),
                "{bad:?} parsed"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["127.0.0.1:80", "[::1]:443", "0.0.0.0:0"] {
            assert_eq!(s.parse::<EndpointAddress>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn remote_validation_rejects_unusable_targets() {
        let v = |s: &str| s.parse::<EndpointAddress>().unwrap().validate_remote();
        assert_eq!(
            v("0.0.0.0:80"),
            Err(AddressError::Unspecified("0.0.0.0".parse().unwrap()))
        );
        assert_eq!(v("127.0.0.1:0"), Err(AddressError::PortZero));
        assert!(matches!(v("224.0.0.1:80"), Err(AddressError::Multicast(_))));
        assert_eq!(v("255.255.255.255:80"), Err(AddressError::Broadcast));
        assert_eq!(v("127.0.0.1:80"), Ok(()));
    }

    #[test]
    fn listen_validation_allows_any_port_and_unspecified() {
        let v = |s: &str| s.parse::<EndpointAddress>().unwrap().validate_listen();
        assert_eq!(v("0.0.0.0:0"), Ok(()));
        assert_eq!(v("[::]:0"), Ok(()));
        assert!(v("[ff02::1]:0").is_err());
    }
}
