//! Byte images of per-sequence state (a target's [`SequenceState`](crate::SequenceState), a
//! draft's [`DraftContext`](crate::DraftContext)), for the prefix cache's disk tier. Little
//! endian, every array length-prefixed, the same layout whatever device the state lived on: an
//! image saved on the GPU loads on the CPU and back. Integrity (checksums, which model wrote
//! it) is the caller's; a reader refuses what does not parse or does not fit the model.

use crate::ModelError;

/// Builds an image: an 8-byte tag naming its kind, then fields in order.
pub(crate) struct ImageWriter {
    buf: Vec<u8>,
}

impl ImageWriter {
    pub(crate) fn new(tag: &[u8; 8]) -> Self {
        Self { buf: tag.to_vec() }
    }

    pub(crate) fn u64(&mut self, x: u64) {
        self.buf.extend_from_slice(&x.to_le_bytes());
    }

    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn f32s(&mut self, v: &[f32]) {
        self.bytes(bytemuck::cast_slice(v));
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        self.buf
    }
}

/// Reads an image field by field; every error says which field was wrong.
pub(crate) struct ImageReader<'a> {
    buf: &'a [u8],
}

/// An image that cannot be used: it is discarded (and its state recomputed).
pub(crate) fn bad(message: impl Into<String>) -> ModelError {
    ModelError::StateImage(message.into())
}

impl<'a> ImageReader<'a> {
    pub(crate) fn new(buf: &'a [u8], tag: &[u8; 8]) -> Result<Self, ModelError> {
        match buf.split_at_checked(8) {
            Some((t, rest)) if t == tag => Ok(Self { buf: rest }),
            _ => Err(bad(format!(
                "not a {} image",
                String::from_utf8_lossy(tag).trim()
            ))),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let Some((head, rest)) = self.buf.split_at_checked(n) else {
            return Err(bad(format!("truncated in {what}")));
        };
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A length-prefixed byte array of exactly `len` bytes.
    pub(crate) fn bytes(&mut self, len: usize, what: &str) -> Result<&'a [u8], ModelError> {
        let n = self.u64(what)?;
        if n != len as u64 {
            return Err(bad(format!(
                "{what} holds {n} bytes, the model needs {len}"
            )));
        }
        self.take(len, what)
    }

    /// A length-prefixed array of exactly `len` f32 values.
    pub(crate) fn f32s(&mut self, len: usize, what: &str) -> Result<Vec<f32>, ModelError> {
        Ok(bytemuck::pod_collect_to_vec(self.bytes(4 * len, what)?))
    }

    /// Fails unless the whole image was read.
    pub(crate) fn end(self) -> Result<(), ModelError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(bad(format!("{} bytes past the end", self.buf.len())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_damage_is_named() {
        let mut w = ImageWriter::new(b"TESTIMG1");
        w.u64(7);
        w.f32s(&[1.5, -2.0]);
        w.bytes(&[9, 8, 7]);
        let img = w.finish();
        let mut r = ImageReader::new(&img, b"TESTIMG1").unwrap();
        assert_eq!(r.u64("n").unwrap(), 7);
        assert_eq!(r.f32s(2, "floats").unwrap(), vec![1.5, -2.0]);
        assert_eq!(r.bytes(3, "raw").unwrap(), &[9, 8, 7]);
        r.end().unwrap();

        assert!(ImageReader::new(&img, b"OTHERIMG").is_err());
        let mut r = ImageReader::new(&img, b"TESTIMG1").unwrap();
        r.u64("n").unwrap();
        let e = r.f32s(3, "floats").unwrap_err().to_string();
        assert!(
            e.contains("floats holds 8 bytes, the model needs 12"),
            "{e}"
        );
        let mut r = ImageReader::new(&img[..img.len() - 1], b"TESTIMG1").unwrap();
        r.u64("n").unwrap();
        r.f32s(2, "floats").unwrap();
        let e = r.bytes(3, "raw").unwrap_err().to_string();
        assert!(e.contains("truncated in raw"), "{e}");
    }
}
