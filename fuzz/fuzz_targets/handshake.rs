//! Arbitrary bytes, whole and in arbitrary chunks, into the handshake
//! decoder: it must never panic, must agree with itself on every prefix, and
//! what it accepts must re-encode to an accepted handshake.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netio_tcp::wire::{FrameDecoder, Handshake, HANDSHAKE_LEN, MAX_HANDSHAKE_LEN};

fuzz_target!(|data: &[u8]| {
    // The first byte picks the chunk size of the streaming run.
    let (chunk, input) = match data.split_first() {
        Some((c, rest)) => (usize::from(*c % 32) + 1, rest),
        None => return,
    };

    let whole = Handshake::decode(input);
    if let Ok(Some((h, used))) = &whole {
        assert!((HANDSHAKE_LEN..=MAX_HANDSHAKE_LEN).contains(used));
        assert!(*used <= input.len());
        for k in 0..=input.len() {
            let r = Handshake::decode(&input[..k]);
            if k < *used {
                assert_eq!(r, Ok(None), "prefix {k} of a valid handshake");
            } else {
                assert_eq!(r, Ok(Some((*h, *used))));
            }
        }
        let again = Handshake::decode(&h.encode());
        assert_eq!(again, Ok(Some((*h, HANDSHAKE_LEN))));
    }
    if let Err(e) = &whole {
        assert!(e.is_handshake_error());
        assert!(!e.to_string().is_empty());
    }

    // The same bytes through a decoder, in chunks.
    let mut dec = FrameDecoder::new(0, Some(1024));
    let mut streamed = Ok(None);
    for piece in input.chunks(chunk) {
        let n = dec.feed(piece);
        assert!(n == piece.len() || dec.buffered() >= MAX_HANDSHAKE_LEN);
        streamed = dec.decode_handshake();
        if !matches!(streamed, Ok(None)) {
            break;
        }
    }
    match (&whole, &streamed) {
        (Ok(Some((h, _))), s) => assert_eq!(s, &Ok(Some(*h))),
        (Ok(None), s) => assert_eq!(s, &Ok(None)),
        (Err(_), s) => assert!(s.is_err()),
    }
});
