//! The IP addresses of this host's network interfaces.

use std::io;
use std::net::IpAddr;

/// One IP address of one of this host's network interfaces, as listed by
/// [`local_addresses`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct LocalAddress {
    /// The interface's name, for example `lo` or `eth0`.
    pub interface: String,
    /// The address.
    pub ip: IpAddr,
    /// `true` for a loopback address (`127.0.0.0/8`, `::1`): reachable
    /// from this host only.
    pub is_loopback: bool,
}

/// Lists the IP addresses of this host's network interfaces, IPv4 and
/// IPv6, loopback included (and flagged), in the order the system gives
/// them.
///
/// IPv6 link-local addresses (`fe80::/10`) are left out: they are
/// ambiguous without the interface's scope id, which an
/// [`EndpointAddress`](netio_core::EndpointAddress) does not carry, so a
/// listener or connection could not use them. Every address listed can be
/// listened on (port 0) as long as the interface keeps it.
///
/// Uses `getifaddrs` on Unix and `GetAdaptersAddresses` on Windows,
/// through the `if-addrs` crate.
///
/// ```
/// let addrs = netio_tcp::local_addresses()?;
/// assert!(addrs.iter().any(|a| a.is_loopback));
/// for a in &addrs {
///     println!("{:8} {} {}", a.interface, a.ip, if a.is_loopback { "(loopback)" } else { "" });
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn local_addresses() -> io::Result<Vec<LocalAddress>> {
    let mut out: Vec<LocalAddress> = Vec::new();
    for iface in if_addrs::get_if_addrs()? {
        let ip = iface.ip();
        if is_ipv6_link_local(ip) {
            continue;
        }
        let a = LocalAddress {
            is_loopback: ip.is_loopback(),
            interface: iface.name,
            ip,
        };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

fn is_ipv6_link_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(_) => false,
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::is_ipv6_link_local;

    #[test]
    fn only_fe80_slash_10_is_link_local() {
        assert!(is_ipv6_link_local("fe80::1".parse().unwrap()));
        assert!(is_ipv6_link_local("febf::1".parse().unwrap()));
        assert!(!is_ipv6_link_local("fec0::1".parse().unwrap()));
        assert!(!is_ipv6_link_local(IpAddr::V6(Ipv6Addr::LOCALHOST)));
        assert!(!is_ipv6_link_local("fd00::2".parse().unwrap()));
        assert!(!is_ipv6_link_local(IpAddr::V4(Ipv4Addr::new(
            169, 254, 0, 1
        ))));
    }
}
