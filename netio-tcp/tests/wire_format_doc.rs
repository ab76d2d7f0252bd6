//! The byte strings of `docs/wire-format.md`, copied here verbatim, decoded
//! and encoded by the codec: the document and the code cannot drift apart.
//! The last test also checks that each literal still appears in the
//! document.

use netio_tcp::wire::{
    CloseCode, CloseFrame, DataPrefix, Frame, FrameDecoder, Handshake, WireError, FRAME_HEADER_LEN,
    HANDSHAKE_LEN, PROTOCOL_VERSION,
};

/// Initiator's handshake: accepts messages up to 65,536 bytes.
const INITIATOR_HANDSHAKE: &str = "4e 54 49 4f 01 00 10 00 00 00 00 00 00 00 01 00";
/// Acceptor's handshake: accepts messages up to 1,048,576 bytes.
const ACCEPTOR_HANDSHAKE: &str = "4e 54 49 4f 01 00 10 00 00 00 00 00 00 00 10 00";
/// DATA frame: header `hdr`, payload `hello`.
const DATA_FRAME: &str = "01 00 00 00 08 00 00 00 68 64 72 68 65 6c 6c 6f";
/// An empty message.
const EMPTY_DATA_FRAME: &str = "01 00 00 00 00 00 00 00";
/// CLOSE frame: code 0, reason `bye`.
const CLOSE_FRAME: &str = "02 00 00 00 05 00 00 00 00 00 62 79 65";
/// The whole stream from the initiator (53 bytes), as laid out in the doc.
const WHOLE_STREAM: &str = "4e 54 49 4f 01 00 10 00 00 00 00 00 00 00 01 00
01 00 00 00 08 00 00 00 68 64 72 68 65 6c 6c 6f
01 00 00 00 00 00 00 00
02 00 00 00 05 00 00 00 00 00 62 79 65";
/// Rejected inputs.
const REJECT_GET: &str = "47 45 54 20";
const REJECT_VERSION_2: &str = "4e 54 49 4f 02 00 10 00";
const REJECT_HUGE_DATA: &str = "01 00 00 00 ff ff ff ff";
const REJECT_TYPE_3: &str = "03 00 00 00 00 00 00 00";

fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("hex byte"))
        .collect()
}

#[test]
fn initiator_handshake_decodes_and_encodes() {
    let bytes = hex(INITIATOR_HANDSHAKE);
    assert_eq!(bytes.len(), HANDSHAKE_LEN);
    assert_eq!(&bytes[..4], b"NTIO");
    let (h, used) = Handshake::decode(&bytes).unwrap().unwrap();
    assert_eq!(used, 16);
    assert_eq!(h.max_message, 65_536);
    assert_eq!(Handshake::new(65_536).encode().to_vec(), bytes);
    assert_eq!(PROTOCOL_VERSION, 1);
}

#[test]
fn acceptor_handshake_decodes_and_encodes() {
    let bytes = hex(ACCEPTOR_HANDSHAKE);
    let (h, used) = Handshake::decode(&bytes).unwrap().unwrap();
    assert_eq!(used, 16);
    assert_eq!(h.max_message, 1_048_576);
    assert_eq!(Handshake::for_limit(Some(1 << 20)).encode().to_vec(), bytes);
}

#[test]
fn data_frame_decodes_as_one_message_and_encodes() {
    let bytes = hex(DATA_FRAME);
    assert_eq!(bytes.len(), 16);
    let mut dec = FrameDecoder::new(64 * 1024, Some(65_536));
    dec.feed(&bytes);
    assert_eq!(dec.next_frame().unwrap(), Some(Frame::Data(b"hdrhello")));
    assert_eq!(dec.next_frame().unwrap(), None);

    let prefix = DataPrefix::new(b"hdr", 5).unwrap();
    assert_eq!(prefix.message_len(), 8);
    let mut encoded = prefix.as_bytes().to_vec();
    encoded.extend_from_slice(b"hello");
    assert_eq!(encoded, bytes);
}

#[test]
fn empty_data_frame_is_an_empty_message() {
    let bytes = hex(EMPTY_DATA_FRAME);
    assert_eq!(bytes.len(), FRAME_HEADER_LEN);
    let mut dec = FrameDecoder::new(0, Some(65_536));
    dec.feed(&bytes);
    assert_eq!(dec.next_frame().unwrap(), Some(Frame::Data(b"")));
    assert_eq!(DataPrefix::new(&[], 0).unwrap().as_bytes(), &bytes[..]);
}

#[test]
fn close_frame_decodes_and_encodes() {
    let bytes = hex(CLOSE_FRAME);
    assert_eq!(bytes.len(), 13);
    let mut dec = FrameDecoder::new(0, Some(65_536));
    dec.feed(&bytes);
    assert_eq!(
        dec.next_frame().unwrap(),
        Some(Frame::Close {
            code: CloseCode::Normal,
            reason: b"bye"
        })
    );
    assert!(dec.is_closed());
    assert_eq!(
        CloseFrame::new(CloseCode::Normal, "bye").as_bytes(),
        &bytes[..]
    );
}

#[test]
fn whole_stream_decodes_in_every_two_way_split() {
    let bytes = hex(WHOLE_STREAM);
    assert_eq!(bytes.len(), 53);
    let parts = [
        hex(INITIATOR_HANDSHAKE),
        hex(DATA_FRAME),
        hex(EMPTY_DATA_FRAME),
        hex(CLOSE_FRAME),
    ]
    .concat();
    assert_eq!(parts, bytes);

    for split in 0..=bytes.len() {
        // The acceptor decodes with its own limit of 1 MiB.
        let mut dec = FrameDecoder::new(64 * 1024, Some(1 << 20));
        let mut handshake = None;
        let mut messages: Vec<Vec<u8>> = Vec::new();
        let mut close = None;
        for chunk in [&bytes[..split], &bytes[split..]] {
            assert_eq!(dec.feed(chunk), chunk.len());
            if handshake.is_none() {
                handshake = dec.decode_handshake().unwrap();
                if handshake.is_none() {
                    continue;
                }
            }
            while let Some(f) = dec.next_frame().unwrap() {
                match f {
                    Frame::Data(m) => messages.push(m.to_vec()),
                    Frame::Close { code, reason } => close = Some((code, reason.to_vec())),
                    Frame::DataPart { .. } => panic!("small frames come out whole"),
                }
            }
        }
        assert_eq!(handshake, Some(Handshake::new(65_536)), "split at {split}");
        assert_eq!(messages, vec![b"hdrhello".to_vec(), Vec::new()]);
        assert_eq!(close, Some((CloseCode::Normal, b"bye".to_vec())));
    }
}

#[test]
fn rejected_examples_fail_as_documented() {
    // `GET `: refused at the first byte.
    let get = hex(REJECT_GET);
    assert!(matches!(
        Handshake::decode(&get[..1]),
        Err(WireError::BadMagic(_))
    ));
    // Version 2: refused after 6 bytes.
    let v2 = hex(REJECT_VERSION_2);
    assert_eq!(Handshake::decode(&v2[..5]), Ok(None));
    assert_eq!(
        Handshake::decode(&v2[..6]),
        Err(WireError::UnsupportedVersion { peer: 2, ours: 1 })
    );
    // DATA of 2^32 - 1 bytes against a limit of 65,536.
    let mut dec = FrameDecoder::new(0, Some(65_536));
    dec.feed(&hex(REJECT_HUGE_DATA));
    let e = dec.next_frame().unwrap_err();
    assert_eq!(
        e,
        WireError::DataTooLarge {
            len: u32::MAX,
            limit: 65_536
        }
    );
    assert_eq!(e.close_code(), CloseCode::MessageTooLarge);
    assert_eq!(e.close_code().to_u16(), 1);
    // Unknown frame type 3.
    let mut dec = FrameDecoder::new(0, Some(65_536));
    dec.feed(&hex(REJECT_TYPE_3));
    let e = dec.next_frame().unwrap_err();
    assert_eq!(e, WireError::UnknownFrameType { frame_type: 3 });
    assert_eq!(e.close_code().to_u16(), 2);
}

#[test]
fn every_literal_appears_in_the_document() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/wire-format.md"
    ))
    .expect("docs/wire-format.md is readable");
    for lit in [
        INITIATOR_HANDSHAKE,
        ACCEPTOR_HANDSHAKE,
        DATA_FRAME,
        EMPTY_DATA_FRAME,
        CLOSE_FRAME,
        WHOLE_STREAM,
        REJECT_GET,
        REJECT_VERSION_2,
        REJECT_HUGE_DATA,
        REJECT_TYPE_3,
    ] {
        assert!(doc.contains(lit), "docs/wire-format.md lacks `{lit}`");
    }
}
