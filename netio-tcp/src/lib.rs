//! TCP provider of netio-rs, on mio.
