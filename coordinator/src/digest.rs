//! `Digest`: the blake3 content address of a blob.

use std::fmt;
use std::str::FromStr;

/// A blake3 digest, shown and sent as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(*blake3::hash(bytes).as_bytes())
    }

    /// Wraps a finished hasher.
    pub fn from_hasher(hasher: &blake3::Hasher) -> Self {
        Self(*hasher.finalize().as_bytes())
    }

    /// Lowercase hex form.
    pub fn to_hex(&self) -> String {
        self.hex().to_string()
    }

    /// Lowercase hex form, on the stack: digests are written into every
    /// blob path, record and reply, so the common forms allocate nothing
    /// (formatting each byte apart cost 33 allocations a digest, 5 % of the
    /// results' sync thread in a `perf` profile).
    pub fn hex(&self) -> impl std::ops::Deref<Target = str> {
        blake3::Hash::from_bytes(self.0).to_hex()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.hex()[..12])
    }
}

/// A string that is not 64 hex characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a blake3 digest (64 hex characters)")]
pub struct BadDigest(pub String);

impl FromStr for Digest {
    type Err = BadDigest;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDigest(s.chars().take(80).collect());
        // Hex digits only (either case): `from_str_radix` would take `+f`
        // as 15, so two spellings would name one blob; blake3's parser takes
        // 0-9, a-f and A-F alone.
        blake3::Hash::from_hex(s)
            .map(|h| Self(*h.as_bytes()))
            .map_err(|_| bad())
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.hex())
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Parsed from the input's own string where it lends one: no copy.
        struct Hex;
        impl serde::de::Visitor<'_> for Hex {
            type Value = Digest;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a blake3 digest (64 hex characters)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Digest, E> {
                s.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Hex)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let d = Digest::of(b"tessera");
        assert_eq!(d.to_hex().len(), 64);
        assert_eq!(d.to_hex().parse::<Digest>().unwrap(), d);
        assert!("zz".parse::<Digest>().is_err());
        assert!("g".repeat(64).parse::<Digest>().is_err());
        assert!("é".repeat(32).parse::<Digest>().is_err());
    }

    #[test]
    fn json_reads_a_digest_lent_or_copied_and_names_a_bad_one() {
        let d = Digest::of(b"tessera");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{d}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        // A reader lends no string: the visitor gets a copy.
        assert_eq!(
            serde_json::from_reader::<_, Digest>(json.as_bytes()).unwrap(),
            d
        );
        let bad = serde_json::from_str::<Digest>("\"abc\"").unwrap_err();
        assert!(
            bad.to_string().contains("`abc` is not a blake3 digest"),
            "{bad}"
        );
        assert_eq!(format!("{d:?}"), format!("Digest({})", &d.to_hex()[..12]));
    }

    #[test]
    fn a_sign_is_not_a_hex_digit() {
        // Found by the `requests` fuzz target: `+1` parsed as the byte 0x01.
        let s = "af1349b9f5f9+1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";
        assert!(s.parse::<Digest>().is_err());
        assert!("+f".repeat(32).parse::<Digest>().is_err());
        let upper = "AF1349B9F5F901A6A0404DEA36DCC9499BCB25C9ADC112B7CC9A93CAE41F3262";
        assert_eq!(
            upper.parse::<Digest>().unwrap().to_hex(),
            upper.to_lowercase()
        );
    }
}
