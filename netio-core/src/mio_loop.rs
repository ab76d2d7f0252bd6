//! The real event loop, on mio (epoll on Linux).
