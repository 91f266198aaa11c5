//! Hand framing of protobuf fields around pre-encoded bytes, so responses can
//! be written without re-encoding resources (invariant 10, docs/architecture.md).

use bytes::BufMut;
use prost::encoding::{encode_varint, encoded_len_varint};

pub(crate) const WIRE_LEN: u8 = 2;

pub(crate) fn put_key(buf: &mut impl BufMut, field: u32, wire_type: u8) {
    encode_varint(((field as u64) << 3) | wire_type as u64, buf);
}

pub(crate) fn key_len(field: u32) -> usize {
    encoded_len_varint((field as u64) << 3)
}

/// Encodes a length-delimited field (string, bytes or embedded message).
pub(crate) fn put_bytes_field(buf: &mut impl BufMut, field: u32, bytes: &[u8]) {
    put_key(buf, field, WIRE_LEN);
    encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

/// Length of a length-delimited field with `len` bytes of payload.
pub(crate) fn bytes_field_len(field: u32, len: usize) -> usize {
    key_len(field) + encoded_len_varint(len as u64) + len
}

/// Like [`put_bytes_field`] but omitted when empty (proto3 default).
pub(crate) fn put_str_field(buf: &mut impl BufMut, field: u32, s: &str) {
    if !s.is_empty() {
        put_bytes_field(buf, field, s.as_bytes());
    }
}

pub(crate) fn str_field_len(field: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        bytes_field_len(field, s.len())
    }
}
