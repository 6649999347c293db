//! JSON written as Python's `json.dumps(value, ensure_ascii=False)` writes it (`", "` and
//! `": "` separators, floats as `repr`), so that a scoring prompt is byte for byte the
//! reference's and its `prompt_sha256` can be compared across servers.

use std::io;

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, Serializer};

/// `json.dumps(value, ensure_ascii=False)`.
pub fn dumps<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = Serializer::with_formatter(&mut out, PythonFormatter);
    value
        .serialize(&mut ser)
        .expect("serialising to memory cannot fail");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        separate(w, first)
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        separate(w, first)
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(python_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        self.write_f64(w, f64::from(value))
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        escape: serde_json::ser::CharEscape,
    ) -> io::Result<()> {
        CompactFormatter.write_char_escape(w, escape)
    }
}

/// `", "` before every item but the first.
fn separate<W: ?Sized + io::Write>(w: &mut W, first: bool) -> io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// Python's `repr` of a finite float: the shortest digits that round-trip (as Rust's), written
/// positionally for exponents -4..16 and as `1.5e+16` / `1e-05` otherwise.
fn python_float(v: f64) -> String {
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0" } else { "0.0" }.into();
    }
    // `{:e}` gives the shortest round-trip digits: `-1.2345e-7`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` has an exponent");
    let exp: i32 = exp.parse().expect("an integer exponent");
    if (-4..16).contains(&exp) {
        let text = format!("{v}");
        return if text.contains('.') {
            text
        } else {
            text + ".0"
        };
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn writes_what_python_json_dumps_writes() {
        // Checked with Python 3.12: json.dumps(v, ensure_ascii=False).
        let v = json!({"evidence": {"a": [1, 2.5, -0.0, true, null]}, "ü": "l\u{e9}\"\n\t\u{1}"});
        assert_eq!(
            dumps(&v),
            r#"{"evidence": {"a": [1, 2.5, -0.0, true, null]}, "ü": "lé\"\n\t\u0001"}"#
        );
        let floats = [
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e300, "1.5e+300"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (0.1, "0.1"),
            (123456.789, "123456.789"),
            (3.0, "3.0"),
        ];
        for (v, want) in floats {
            assert_eq!(python_float(v), want, "{v}");
        }
    }
}
